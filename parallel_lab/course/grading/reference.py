"""The reference lesson of a grading job: which cells are graded, what they must print.

**Graded cells.** The reference lesson marks each check cell with tags (the percent-format source
writes them as ``# %% tags=["check:ring-all-reduce", "points:2"]``): ``check:ID`` names the
exercise in the gradebook, ``points:N`` its weight (default 1). Cell metadata
``{"parallel_lab": {"check": "ID", "points": N}}`` works too. A quiz check is ``check:quiz:LESSON``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from parallel_lab.course.quiz.bank import load
from parallel_lab.course.quiz.check import passing_verdict

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SANITIZE = ROOT / "lessons" / "sanitize.cfg"


class GradingError(ValueError):
    """The grading job itself is wrong (no reference, a reference without checks, ...)."""


# ----------------------------------------------------------------------------------------------
# The reference: which cells are graded.


@dataclass(frozen=True)
class Check:
    """A graded cell of the reference lesson."""

    id: str
    points: float
    cell_id: str | None
    source: str
    outputs: tuple

    @property
    def quiz(self) -> str | None:
        return self.id.split(":", 1)[1] if self.id.startswith("quiz:") else None


@dataclass(frozen=True)
class Reference:
    path: Path
    notebook: object = field(repr=False)
    checks: tuple

    @property
    def lesson(self) -> str:
        return self.path.stem


def check_tags(cell) -> tuple[str | None, float]:
    """``(check id, points)`` of a cell, or ``(None, 0)`` when it is not a check cell."""
    meta = cell.get("metadata", {})
    own = meta.get("parallel_lab", {}) if isinstance(meta.get("parallel_lab"), dict) else {}
    check, points = own.get("check"), own.get("points")
    for tag in meta.get("tags", []) if isinstance(meta.get("tags", []), list) else []:
        if isinstance(tag, str) and tag.startswith("check:"):
            check = tag[len("check:"):]
        elif isinstance(tag, str) and tag.startswith("points:"):
            points = tag[len("points:"):]
    if not check or cell.get("cell_type") != "code":
        return None, 0
    try:
        return check, float(1 if points is None else points)
    except ValueError:
        raise GradingError(f"check {check}: points must be a number, got {points!r}") from None


def load_reference(path) -> Reference:
    """The reference lesson and its check cells; raises GradingError if it has none."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    checks, seen = [], set()
    for cell in nb.cells:
        check, points = check_tags(cell)
        if check is None:
            continue
        if check in seen:
            raise GradingError(f"{path.name}: check {check!r} is tagged on two cells; check ids must be unique")
        seen.add(check)
        checks.append(Check(check, points, cell.get("id"), cell.source, tuple(expected_outputs(check, cell))))
    if not checks:
        raise GradingError(f"{path.name}: no check cells (tag a cell 'check:ID' and 'points:N')")
    return Reference(path, nb, tuple(checks))


def expected_outputs(check: str, cell) -> list:
    """What a passing submission prints in a check cell: the reference's outputs, or for a quiz
    check the quiz's pass line."""
    if check.startswith("quiz:"):
        try:
            bank = load(check.split(":", 1)[1])
        except KeyError as exc:  # the lesson names a quiz the banks do not have
            raise GradingError(f"check {check!r}: {exc.args[0]}") from None
        text = passing_verdict(bank) + "\n"
        return [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return list(cell.outputs)
