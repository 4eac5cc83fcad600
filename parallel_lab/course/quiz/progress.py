"""Which quizzes this student has passed, kept across lessons (each lesson is its own kernel).

The record lives in ``$PARALLEL_LAB_HOME/progress.json`` (default ``~/.parallel_lab``). It is the
student's own file, which anyone can edit: it shows the learner what they have done
(``parallel_lab.show.progress.my_progress``) and proves nothing to anyone else. Credentials come from
the grader's side (``parallel_lab.course.credentials``); the grader points ``PARALLEL_LAB_HOME`` at a
scratch folder.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("PARALLEL_LAB_HOME") or Path.home() / ".parallel_lab")


def _path() -> Path:
    return home() / "progress.json"


def load() -> dict:
    """``{bank id: {"lesson": "01" | None, "points": p, "total": t, "date": "YYYY-MM-DD"}}``."""
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("passed", {}) if isinstance(data, dict) else {}


def record_pass(bank_id: str, lesson: str | None, points: float, total: float) -> None:
    """Remember that quiz ``bank_id`` was passed (keeps the best score)."""
    passed = load()
    best = passed.get(bank_id, {}).get("points", -1)
    if points < best:
        return
    passed[bank_id] = {"lesson": lesson, "points": points, "total": total,
                       "date": _dt.date.today().isoformat()}
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"passed": passed}, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a read-only home must not break the quiz
        pass


def lessons_passed() -> list[str]:
    """Lessons (or bank ids, for quizzes without a lesson) passed so far, sorted."""
    return sorted({entry.get("lesson") or bank_id for bank_id, entry in load().items()})
