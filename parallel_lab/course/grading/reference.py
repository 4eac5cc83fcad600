"""The reference lesson of a grading job: which checks are graded, for how many points, and which
answer cell each one reads.

A lesson (the student edition, ``lessons/NN_*.ipynb``) marks them with the cell tags of
``parallel_lab.course.tags``: a check cell ``check:ID`` with ``points:N`` (an exercise, a quiz
``quiz:NN``, or a graded prediction ``predict:PID``, whose points are the registry's), and before it
its answer cell ``answer:ID``, whose source the grader reads from the submission. A lesson's
language is its notebook metadata's ``{"parallel_lab": {"lang": "zh-Hant"}}`` (English without it):
the zh-Hant edition has the same checks and points, and the grader writes its feedback in Chinese.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from parallel_lab.course import tags
from parallel_lab.course.predictions import GRADED
from parallel_lab.i18n import DEFAULT, LANGUAGES

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
        return tags.quiz(self.id)

    @property
    def prediction(self) -> str | None:
        """The graded prediction's id for a prediction check (``predict:gpipe-bubble`` ->
        ``gpipe-bubble``), else None."""
        return tags.prediction(self.id)


def notebook_language(nb) -> str:
    """The language a notebook says it is in (its metadata's ``{"parallel_lab": {"lang": ...}}``),
    English when it says none or one the course does not have."""
    meta = nb.get("metadata", {}) if isinstance(nb, dict) else {}
    course = meta.get("parallel_lab") if isinstance(meta, dict) else None
    lang = course.get("lang") if isinstance(course, dict) else None
    return lang if lang in LANGUAGES else DEFAULT


@dataclass(frozen=True)
class Reference:
    path: Path
    checks: tuple
    texts: dict = field(default_factory=dict)  # check id -> its answer cell's text in the reference (markdown)
    lang: str = DEFAULT

    @property
    def lesson(self) -> str:
        return self.path.stem


def check_tags(cell) -> tuple[str | None, float]:
    """``(check id, points)`` of a cell, or ``(None, 0)`` when it is not a check cell."""
    check, points = tags.check(cell)
    if check is None:
        return None, 0
    try:
        return check, float(1 if points is None else points)
    except ValueError:
        raise GradingError(f"check {check}: points must be a number, got {points!r}") from None


def prediction_points(name: str, cell, check: str) -> float:
    """A graded prediction's points: the registry's; GradingError when it is not registered or the
    cell's own ``points:`` tag says otherwise."""
    graded = GRADED.get(tags.prediction(check))
    if graded is None:
        raise GradingError(f"{name}: check {check!r} names no graded prediction "
                           f"(parallel_lab.course.predictions.GRADED)")
    tagged = tags.points(cell)
    if tagged and tagged[-1] != f"{graded.points:g}":
        raise GradingError(f"{name}: check {check!r} is tagged points:{tagged[-1]}, but a prediction's "
                           f"points are the registry's ({graded.points:g})")
    return graded.points


def load_reference(path) -> Reference:
    """The reference lesson's checks; GradingError if it has none, if a check id is tagged twice,
    or if a check has no answer cell."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    answers = {tags.answer(c): c.get("id") for c in nb.cells if tags.answer(c)}
    texts = {tags.answer(c): c.source for c in nb.cells if tags.answer(c) and c.get("cell_type") == "markdown"}
    checks, seen = [], set()
    for cell in nb.cells:
        check, points = check_tags(cell)
        if check is None:
            continue
        if check in seen:
            raise GradingError(f"{path.name}: check {check!r} is tagged on two cells; check ids must be unique")
        if check not in answers:
            raise GradingError(f"{path.name}: check {check!r} has no answer cell (tag a cell 'answer:{check}')")
        if tags.prediction(check) is not None:
            points = prediction_points(path.name, cell, check)
        seen.add(check)
        checks.append(Check(check, points, answers[check]))
    if not checks:
        raise GradingError(f"{path.name}: no check cells (tag a cell 'check:ID' and 'points:N')")
    return Reference(path, tuple(checks), texts, notebook_language(nb))
