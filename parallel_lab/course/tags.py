"""The tags of a lesson's cells: one grammar, read by the lesson build and by the grader.

A lesson source writes them on a cell's marker (``# %% tags=["check:ring-all-reduce", "points:3"]``);
the built notebooks carry them in each cell's ``metadata.tags``.

- ``answer:ID``: the cell holding the answer to check ``ID`` (the grader reads this cell's source
  from a submission; the build replaces its solution region with a stub for students);
- ``check:ID``: the cell that checks it, and ``points:N`` beside it (default 1). A cell's metadata
  ``{"parallel_lab": {"check": ID, "points": N}}`` says the same. ``ID`` is
  - an exercise id (``ring-all-reduce``, ``parallel_lab.exercises.REGISTRY``),
  - ``quiz:NN``, the quiz of lesson NN (its bank in ``quizzes/``), or
  - ``predict:PID``, a prediction (``answer:predict:PID`` holds ``my_prediction = ...``); graded when
    ``check:predict:PID`` is tagged and PID is in ``course.predictions.GRADED``, whose points it
    takes (no ``points:`` tag);
- ``reveals:PID``: a code cell whose output answers prediction ``PID`` (the run after it, a table
  or a figure that shows the answer): the student edition hides that output until the student runs
  the cell (``course.hidden``);
- nbval's own: ``nbval-ignore-output`` (outputs not compared: widgets, timings), ``nbval-skip``,
  ``raises-exception``.
"""

from __future__ import annotations

ANSWER, CHECK, POINTS = "answer:", "check:", "points:"
QUIZ, PREDICT, REVEALS = "quiz:", "predict:", "reveals:"
NBVAL_IGNORE_OUTPUT, NBVAL_SKIP, RAISES_EXCEPTION = "nbval-ignore-output", "nbval-skip", "raises-exception"


def of(cell) -> list[str]:
    """A cell's tags (a notebook cell or its dict; anything that is not a list of strings is none)."""
    tags = cell.get("metadata", {}).get("tags", [])
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def _values(cell, prefix: str) -> list[str]:
    return [t[len(prefix):] for t in of(cell) if t.startswith(prefix)]


def answers(cell) -> list[str]:
    """The check ids a cell answers (``answer:ID``)."""
    return _values(cell, ANSWER)


def answer(cell) -> str | None:
    """The check id a cell answers (its first ``answer:ID``), or None."""
    return next(iter(answers(cell)), None)


def checks(cell) -> list[str]:
    """The check ids a cell's ``check:ID`` tags name."""
    return _values(cell, CHECK)


def points(cell) -> list[str]:
    """The values of a cell's ``points:N`` tags, as written."""
    return _values(cell, POINTS)


def check(cell) -> tuple[str | None, str | None]:
    """``(check id, points as written or None)`` of a code cell, from its ``parallel_lab`` metadata
    and its tags (a tag wins, the last one of a kind); ``(None, None)`` when it checks nothing."""
    meta = cell.get("metadata", {})
    own = meta.get("parallel_lab", {}) if isinstance(meta.get("parallel_lab"), dict) else {}
    found, written = own.get("check"), own.get("points")
    found = (checks(cell) or [found])[-1]
    written = (points(cell) or [written])[-1]
    if not found or cell.get("cell_type") != "code":
        return None, None
    return found, written


def reveals(cell) -> list[str]:
    """The predictions a code cell's output answers (``reveals:PID``)."""
    return _values(cell, REVEALS)


def quiz(check_id: str) -> str | None:
    """The lesson of a quiz check (``quiz:01`` -> ``01``), else None."""
    return check_id[len(QUIZ):] if check_id.startswith(QUIZ) else None


def prediction(check_id: str) -> str | None:
    """The prediction of a prediction check (``predict:gpipe-bubble`` -> ``gpipe-bubble``), else None."""
    return check_id[len(PREDICT):] if check_id.startswith(PREDICT) else None


def is_prediction_answer(cell) -> bool:
    """Whether a cell is a prediction's answer cell (``answer:predict:PID``)."""
    return any(prediction(a) is not None for a in answers(cell))


def answer_cells(cells) -> dict:
    """check id -> the cell tagged ``answer:<id>`` (exercises, quiz sheets and predictions alike)."""
    return {a: cell for cell in cells for a in answers(cell)}
