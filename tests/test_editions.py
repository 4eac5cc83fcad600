"""The two editions of the lessons: the student edition (lessons/*.ipynb, what students open) holds no
solution anywhere; for every exercise, the stub fails its check ("not yet") and the solution in the
source passes it, on real ranks."""

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from parallel_lab.course import tags
from parallel_lab.exercises import REGISTRY
from parallel_lab.exercises import check as check_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402

SOURCES = sorted((ROOT / "lessons" / "src").glob("*.py"))


def answers(source: Path) -> dict:
    """check id -> the exercise answer cell's source in the lesson source (solutions included);
    quiz sheets and predictions (tests/test_predictions.py) aside."""
    cells = build_lessons.parse(source.read_text(encoding="utf-8"))
    return {check: cell.source for check, cell in tags.answer_cells(cells).items()
            if not check.startswith(("quiz:", "predict:")) and cell.cell_type == "code"}


EXERCISES = [(source.stem[:2], check, cell) for source in SOURCES for check, cell in answers(source).items()]


def solution_lines(cell: str) -> list[str]:
    """The distinctive lines of a cell's solution regions (what must not leak)."""
    lines = []
    for region in build_lessons.SOLUTION.finditer(cell):
        for line in region.group(0).splitlines()[1:-1]:
            text = line.strip()
            if len(text) > 12 and not text.startswith("#"):
                lines.append(text)
    return lines


def test_every_exercise_of_the_course_has_an_answer_cell_with_a_solution():
    assert {check for _, check, _ in EXERCISES} == set(REGISTRY)
    assert all(solution_lines(cell) for _, _, cell in EXERCISES)
    assert len(EXERCISES) >= 5


EDITIONS = sorted((ROOT / "lessons").glob("*.ipynb")) + sorted((ROOT / "lessons").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", EDITIONS, ids=lambda p: p.relative_to(ROOT / "lessons").as_posix())
def test_the_student_edition_holds_no_solution(path):
    text = path.read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    leaked = [line for _, _, cell in EXERCISES for line in solution_lines(cell) if json.dumps(line)[1:-1] in text]
    assert not leaked, leaked
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata  # no saved widget state (it could hold a quiz's choices)
    for cell in nb.cells:
        if any(tags.quiz(check) is None for check in tags.checks(cell)):
            shown = "".join(o.get("text", "") for o in cell.get("outputs", []))
            assert (": NOT YET: " in shown or "：尚未完成：" in shown) and "PASSED" not in shown, (path.name, shown)


def test_the_stub_keeps_the_signature_docstring_and_hints():
    cell = answers(ROOT / "lessons" / "src" / "02_tensor_parallelism.py")["g-operator"]
    stub = build_lessons.student_source(cell)
    assert "class MyG(torch.autograd.Function):" in stub and '"""g: all-reduce forward, identity backward."""' in stub
    assert stub.count("# YOUR CODE HERE\n        raise NotImplementedError") == 2
    assert not re.search(r"all_reduce\(out", stub)


@pytest.mark.parametrize("lesson,check,cell", EXERCISES, ids=[f"{lesson}-{check}" for lesson, check, _ in EXERCISES])
def test_every_lessons_stub_is_not_written_yet_from_its_source_alone(lesson, check, cell):
    """The student edition's answer cell, as the build stubs it, is "not yet" before any process
    starts (``Exercise.screen``: ``check.is_stub`` reads the source)."""
    exercise = REGISTRY[check]
    source = build_lessons.student_source(cell)
    screened = exercise.screen(source)
    assert screened is not None and screened.not_yet and not screened.passed, (lesson, check, screened)
    assert check_module.is_stub(source, exercise.name)


@pytest.mark.ranks
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lesson,check,cell", EXERCISES, ids=[f"{lesson}-{check}" for lesson, check, _ in EXERCISES])
def test_the_stub_fails_and_the_solution_passes(lesson, check, cell):
    exercise = REGISTRY[check]
    stub = exercise.check(build_lessons.student_source(cell))
    assert not stub.passed and stub.not_yet
    source = build_lessons.solution_source(cell)
    if check == "capstone":  # its hand-in also holds the record of the plan's run (tests/test_capstone.py)
        from test_capstone import hand_in_of
        source = hand_in_of(source)
    solution = exercise.check(source)
    assert solution.passed, str(solution)
