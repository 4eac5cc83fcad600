"""Instructor grading with nbval: fixture submissions (correct, wrong, hanging, crashing, tampered,
not a notebook, too slow) graded against a tiny fixture lesson, with the exact gradebook; and one
submission graded against the real lesson 01's check cell on real ranks."""

import copy
import json
from pathlib import Path

import nbformat
import psutil
import pytest

from parallel_lab import cli
from parallel_lab.course.grading import gradebook, plugin, reference, runner

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "submissions"
REFERENCE = FIXTURES / "reference" / "99_fixture_lesson.ipynb"
ROOT = Path(__file__).resolve().parent.parent

EXPECTED = """\
student,lesson,exercise,passed,points,max_points,reason
alice,99_fixture_lesson,add,true,2,2,
alice,99_fixture_lesson,quiz:tiny,true,1,1,
bob,99_fixture_lesson,add,false,0,2,output differs from the reference: add: FAILED
bob,99_fixture_lesson,quiz:tiny,false,0,1,"output differs from the reference: quiz tiny: NOT PASSED: 0 of 2 points, pass mark 1"
carol,99_fixture_lesson,add,false,0,2,timed out after 3 s
carol,99_fixture_lesson,quiz:tiny,true,1,1,
dave,99_fixture_lesson,add,false,0,2,not run: the kernel died in code cell 2
dave,99_fixture_lesson,quiz:tiny,false,0,1,not run: the kernel died in code cell 2
erin,99_fixture_lesson,add,false,0,2,check cell edited (its code must stay as in the lesson)
erin,99_fixture_lesson,quiz:tiny,false,0,1,check cell deleted
grace,99_fixture_lesson,add,false,0,2,not a notebook: Notebook does not appear to be JSON
grace,99_fixture_lesson,quiz:tiny,false,0,1,not a notebook: Notebook does not appear to be JSON
"""


def leftover_processes():
    """Processes started by a grading run (they carry its log path in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if plugin.LOG_ENV in proc.environ():
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture(scope="module")
def fixture_quizzes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARALLEL_LAB_QUIZZES", str(FIXTURES / "quizzes"))
        yield


@pytest.fixture(scope="module")
def graded(tmp_path_factory, fixture_quizzes):
    out = tmp_path_factory.mktemp("grades")
    students = ["alice", "bob", "carol", "dave", "erin", "grace"]
    rows = gradebook.grade([FIXTURES / s / REFERENCE.name for s in students], out / "grades.csv", [REFERENCE],
                         cell_timeout=3, notebook_timeout=90, jobs=4)
    return out, rows


def test_gradebook_is_exact(graded):
    out, rows = graded
    assert (out / "grades.csv").read_text() == EXPECTED
    assert [r.points for r in rows if r.student == "alice"] == [2, 1]


def test_feedback_says_which_checks_failed_and_why(graded):
    out, _ = graded
    assert sorted(p.name for p in (out / "feedback").iterdir()) == [
        "alice.md", "bob.md", "carol.md", "dave.md", "erin.md", "grace.md"]
    bob = (out / "feedback" / "bob.md").read_text()
    assert "Score: 0 of 3 points" in bob
    assert "- add (2 points): FAILED: output differs from the reference: add: FAILED" in bob
    assert "expected:\n      add: PASSED\n  got:\n      add: FAILED" in bob
    assert "quiz tiny: PASSED (pass mark: 1 of 2 points)" in bob  # what the quiz check expects
    assert "Score: 3 of 3 points" in (out / "feedback" / "alice.md").read_text()
    assert "FAILED: timed out after 3 s" in (out / "feedback" / "carol.md").read_text()


def test_grading_leaves_no_process_behind(graded):
    assert leftover_processes() == []


def test_notebook_time_limit_fails_what_was_not_reached(tmp_path, fixture_quizzes):
    rows = gradebook.grade([FIXTURES / "heidi" / REFERENCE.name], tmp_path / "g.csv", [REFERENCE],
                         cell_timeout=60, notebook_timeout=4)
    assert [(r.exercise, r.passed, r.reason) for r in rows] == [
        ("add", False, "not run: the notebook exceeded its 4 s limit"),
        ("quiz:tiny", False, "not run: the notebook exceeded its 4 s limit")]
    assert leftover_processes() == []


def test_check_cells_are_found_by_tag_or_metadata():
    cell = nbformat.v4.new_code_cell("x", metadata={"tags": ["check:ex1", "points:2.5"]})
    assert reference.check_tags(cell) == ("ex1", 2.5)
    cell = nbformat.v4.new_code_cell("x", metadata={"parallel_lab": {"check": "ex2"}})
    assert reference.check_tags(cell) == ("ex2", 1.0)
    assert reference.check_tags(nbformat.v4.new_markdown_cell("x", metadata={"tags": ["check:no"]})) == (None, 0)
    with pytest.raises(reference.GradingError, match="points must be a number, got 'two'"):
        reference.check_tags(nbformat.v4.new_code_cell("x", metadata={"tags": ["check:a", "points:two"]}))


def test_test_notebook_restores_check_cells_and_ignores_the_rest(fixture_quizzes):
    ref = reference.load_reference(REFERENCE)
    nb = nbformat.read(FIXTURES / "bob" / REFERENCE.name, as_version=4)
    nb.cells[2].metadata["tags"] = ["check:add", "nbval-skip"]  # a student cannot skip a check
    found = runner.match_checks(nb, ref.checks)
    test, numbers = runner.build_test_notebook(nb, ref.checks, found)
    assert numbers == {1: "add", 3: "quiz:tiny"}
    add = test.cells[2]
    assert add.metadata["tags"] == ["nbval-check-output"] and add.outputs[0]["text"] == "add: PASSED\n"
    quiz = test.cells[5]
    assert quiz.outputs[0]["text"] == "quiz tiny: PASSED (pass mark: 1 of 2 points)\n"
    assert all(c.get("outputs") in (None, []) for i, c in enumerate(test.cells) if i not in (2, 5))


def test_reference_without_checks_is_an_error(tmp_path):
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), tmp_path / "r.ipynb")
    with pytest.raises(reference.GradingError, match="r.ipynb: no check cells"):
        reference.load_reference(tmp_path / "r.ipynb")


def test_cli_grade_writes_gradebook_and_reports_json(tmp_path, monkeypatch, capsys, fixture_quizzes):
    """Through `parallel-lab grade` (registered as the lead will); erin and grace need no kernel."""
    monkeypatch.setitem(cli.COMMANDS, "grade", (cli._grade, "grade", cli._grade_arguments))
    status = cli.main(["grade", str(FIXTURES / "erin" / REFERENCE.name), str(FIXTURES / "grace" / REFERENCE.name),
                       "--reference", str(REFERENCE), "--out", str(tmp_path / "g.csv"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["students"] == 2 and report["submissions"] == 2
    assert [(r["student"], r["exercise"], r["points"]) for r in report["rows"]] == [
        ("erin", "add", 0), ("erin", "quiz:tiny", 0), ("grace", "add", 0), ("grace", "quiz:tiny", 0)]
    assert (tmp_path / "g.csv").read_text().splitlines()[1:] == EXPECTED.splitlines()[9:]
    assert (tmp_path / "feedback" / "grace.md").exists()
    assert cli.main(["grade", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")]) == 2  # nothing to grade


RING_FORGETS_ALL_GATHER = '''import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(p))
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=(rank + 1) % p)
        dist.recv(buffer, src=(rank - 1) % p)
        request.wait()
        chunks[recv] += buffer
    return tensor
'''


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_real_lesson_01_check_cell(tmp_path, monkeypatch):
    """Lesson 01's exercise check on real ranks, graded against the committed lesson: a student who
    kept only the setup, the exercise and the check (deleting other cells is allowed) and forgot the
    all-gather phase. The check cell is tagged here unless the lesson already tags it."""
    monkeypatch.delenv("PARALLEL_LAB_QUIZZES", raising=False)  # the course's banks, not the fixture's
    lesson = nbformat.read(ROOT / "lessons" / "01_ranks_and_collectives.ipynb", as_version=4)
    check = next(c for c in lesson.cells if c.cell_type == "code" and "check_ring_all_reduce(" in c.source)
    tags = check.metadata.setdefault("tags", [])
    if not any(t.startswith("check:") for t in tags):
        tags += ["check:ring-all-reduce", "points:2"]
    nbformat.write(lesson, tmp_path / "01_ranks_and_collectives.ipynb")
    submission = copy.deepcopy(lesson)
    submission.cells = [c for c in submission.cells if c.cell_type == "code" and (
        "setup()" in c.source or "def my_ring_all_reduce" in c.source or c.get("id") == check.get("id"))]
    submission.cells[1].source = RING_FORGETS_ALL_GATHER
    (tmp_path / "ben").mkdir()
    nbformat.write(submission, tmp_path / "ben" / "01_ranks_and_collectives.ipynb")
    rows = gradebook.grade([tmp_path / "ben" / "01_ranks_and_collectives.ipynb"], tmp_path / "g.csv",
                         [tmp_path / "01_ranks_and_collectives.ipynb"], cell_timeout=60, notebook_timeout=110)
    check_id = reference.check_tags(check)[0]
    assert [(r.exercise, r.passed, r.reason) for r in rows if r.exercise == check_id] == [
        (check_id, False, "output differs from the reference: ring all-reduce on 2 ranks: FAILED: "
                          "tensor of 1 element: rank 0: got [0], expected [1]")]
    # The student also deleted the lesson's quiz check cell: graded as failing, with the reason.
    assert [(r.exercise, r.passed, r.reason) for r in rows if r.exercise != check_id] == [
        ("quiz:01", False, "check cell deleted")]
    feedback = (tmp_path / "feedback" / "ben.md").read_text()
    assert "ring all-reduce on 2 ranks: PASSED (5/5 cases)" in feedback  # the reference's verdict
    assert leftover_processes() == []
