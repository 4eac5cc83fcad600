"""What the exercise tests share: an exercise's solution read from its lesson's source, so a test
runs the answer the solution edition runs instead of a copy that could drift from it."""

import sys
from pathlib import Path

from parallel_lab.course import tags

ROOT = Path(__file__).resolve().parent.parent


def lesson_solution(lesson_source: str, check_id: str) -> str:
    """The instructor's solution of exercise ``check_id``: the answer cell of
    ``lessons/src/<lesson_source>``, solution markers removed (``build_lessons.solution_source``)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_lessons
    finally:
        sys.path.remove(str(ROOT / "tools"))
    cells = build_lessons.parse((ROOT / "lessons" / "src" / lesson_source).read_text(encoding="utf-8"))
    return build_lessons.solution_source(tags.answer_cells(cells)[check_id].source)
