"""The reference lesson of a grading job: which checks are graded, for how many points, and which
answer cell each one reads.

A lesson (the student edition, ``lessons/NN_*.ipynb``) marks them with tags, written in its source
as ``# %% tags=[...]``:

- a check cell ``check:ID`` with ``points:N`` (default 1): an exercise (``check:ring-all-reduce``,
  looked up in ``parallel_lab.exercises.REGISTRY``) or a quiz (``check:quiz:01``, a bank of
  ``quizzes/``);
- a graded prediction ``check:predict:ID`` (registered in ``parallel_lab.course.predictions.GRADED``,
  whose points it takes: no ``points:`` tag);
- its answer cell, before it, ``answer:ID``: the cell whose source the grader reads from the
  submission (the exercise's code, the quiz's answer sheet, the prediction's ``my_prediction``).
  Cell metadata ``{"parallel_lab": {"check": "ID", "points": N}}`` works for check cells too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat

from parallel_lab.course.predictions import GRADED

ROOT = Path(__file__).resolve().parents[3]


class GradingError(ValueError):
    """The grading job itself is wrong (no reference, a reference without checks, ...)."""


@dataclass(frozen=True)
class Check:
    """A graded check of the reference lesson: its id, points, and the cell id of its answer cell."""

    id: str
    points: float
    answer_cell_id: str | None

    @property
    def quiz(self) -> str | None:
        """The quiz bank's name for a quiz check (``quiz:01`` -> ``01``), else None."""
        return self.id.split(":", 1)[1] if self.id.startswith("quiz:") else None

    @property
    def prediction(self) -> str | None:
        """The graded prediction's id for a prediction check (``predict:gpipe-bubble`` ->
        ``gpipe-bubble``), else None."""
        return self.id.split(":", 1)[1] if self.id.startswith("predict:") else None


@dataclass(frozen=True)
class Reference:
    path: Path
    checks: tuple

    @property
    def lesson(self) -> str:
        return self.path.stem


def _tags(cell) -> list:
    tags = cell.get("metadata", {}).get("tags", [])
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def check_tags(cell) -> tuple[str | None, float]:
    """``(check id, points)`` of a cell, or ``(None, 0)`` when it is not a check cell."""
    meta = cell.get("metadata", {})
    own = meta.get("parallel_lab", {}) if isinstance(meta.get("parallel_lab"), dict) else {}
    check, points = own.get("check"), own.get("points")
    for tag in _tags(cell):
        if tag.startswith("check:"):
            check = tag[len("check:"):]
        elif tag.startswith("points:"):
            points = tag[len("points:"):]
    if not check or cell.get("cell_type") != "code":
        return None, 0
    try:
        return check, float(1 if points is None else points)
    except ValueError:
        raise GradingError(f"check {check}: points must be a number, got {points!r}") from None


def answer_tag(cell) -> str | None:
    """The check id a cell answers (tag ``answer:ID``), or None."""
    return next((t[len("answer:"):] for t in _tags(cell) if t.startswith("answer:")), None)


def prediction_points(name: str, cell, check: str) -> float:
    """A graded prediction's points: the registry's; GradingError when it is not registered or the
    cell's own ``points:`` tag says otherwise."""
    graded = GRADED.get(check[len("predict:"):])
    if graded is None:
        raise GradingError(f"{name}: check {check!r} names no graded prediction "
                           f"(parallel_lab.course.predictions.GRADED)")
    tagged = [t[len("points:"):] for t in _tags(cell) if t.startswith("points:")]
    if tagged and tagged[-1] != f"{graded.points:g}":
        raise GradingError(f"{name}: check {check!r} is tagged points:{tagged[-1]}, but a prediction's "
                           f"points are the registry's ({graded.points:g})")
    return graded.points


def load_reference(path) -> Reference:
    """The reference lesson's checks; GradingError if it has none, if a check id is tagged twice,
    or if a check has no answer cell."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    answers = {answer_tag(c): c.get("id") for c in nb.cells if answer_tag(c)}
    checks, seen = [], set()
    for cell in nb.cells:
        check, points = check_tags(cell)
        if check is None:
            continue
        if check in seen:
            raise GradingError(f"{path.name}: check {check!r} is tagged on two cells; check ids must be unique")
        if check not in answers:
            raise GradingError(f"{path.name}: check {check!r} has no answer cell (tag a cell 'answer:{check}')")
        if check.startswith("predict:"):
            points = prediction_points(path.name, cell, check)
        seen.add(check)
        checks.append(Check(check, points, answers[check]))
    if not checks:
        raise GradingError(f"{path.name}: no check cells (tag a cell 'check:ID' and 'points:N')")
    return Reference(path, tuple(checks))
