"""What a learner has passed, read from a gradebook that ``parallel-lab grade`` wrote: the input of
a credential's ``Achievement`` when an instructor issues one by hand (``certificate issue``)."""

from __future__ import annotations

import csv
import os

DEFAULT_THRESHOLD = 0.8  # share of a lesson's points needed to count it as passed


def lessons_from_gradebook(gradebook: str | os.PathLike, student: str,
                           threshold: float = DEFAULT_THRESHOLD) -> dict[str, list[str]]:
    """``{lesson: [checks passed in it]}`` for every lesson in which ``student`` earned at least
    ``threshold`` of the points. A lesson named ``01_ranks_and_collectives`` counts as "01"; a check is
    a gradebook row's ``exercise`` whose ``passed`` is true. ValueError if the student has no row."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    earned, possible, checks = {}, {}, {}
    try:
        with open(gradebook, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("student") != student:
                    continue
                lesson = row["lesson"].split("_", 1)[0]
                earned[lesson] = earned.get(lesson, 0.0) + float(row["points"] or 0)
                possible[lesson] = possible.get(lesson, 0.0) + float(row["max_points"] or 0)
                if str(row.get("passed", "")).strip().lower() == "true":
                    checks.setdefault(lesson, []).append(row["exercise"])
    except OSError as exc:
        raise ValueError(f"cannot read the gradebook {gradebook}: {exc.strerror}") from None
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{gradebook} is not a gradebook written by `parallel-lab grade` ({exc!r})") from None
    if not possible:
        raise ValueError(f"no rows for student {student!r} in {gradebook}")
    return {lesson: sorted(checks.get(lesson, [])) for lesson in sorted(possible)
            if possible[lesson] > 0 and earned[lesson] >= threshold * possible[lesson] - 1e-9}
