"""Grading: the grader reads each submission's answer cells, runs every check itself in a fresh,
sandboxed process that executes none of the submission's other cells, and writes a gradebook, a
summary and feedback. An untouched notebook earns 0; a correct answer written differently earns
the points; shortcuts, forged verdicts and patched comparisons earn 0 with a reason; hostile
submissions leak nothing and leave no process behind."""

import csv
import json
import os
import re
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import nbformat
import psutil
import pytest

from parallel_lab import cli
from parallel_lab.course.grading import gradebook, reference, runner
from parallel_lab.course.grading.sandbox import ENV_TOKEN, Sandbox
from parallel_lab.course.quiz import load
from parallel_lab.course.quiz.variant import variant

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402
from test_exercises import RING, RING_BY_PARITY, RING_SOLUTION  # noqa: E402

LESSON = ROOT / "lessons" / "src" / "01_ranks_and_collectives.py"
NAME = "01_ranks_and_collectives.ipynb"


def right_sheet(bank_name: str, student: str) -> dict:
    """A correct answer sheet for ``student``'s graded quiz of a bank."""
    sheet = {}
    for item in variant(load(bank_name), student).items:
        if item.kind == "numeric":
            sheet[item.id] = item.value()
        elif item.kind == "single":
            sheet[item.id] = sorted(item.correct_keys())[0]
        else:
            sheet[item.id] = sorted(item.correct_keys())
    return sheet


def with_answer(nb, check: str, source: str):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if f"answer:{check}" in cell.metadata.get("tags", []):
            cell.source = source
    return nb


@pytest.fixture(scope="module")
def lesson01(tmp_path_factory):
    """The reference (the student edition of lesson 01, unexecuted: grading needs only its tags)."""
    root = tmp_path_factory.mktemp("lesson01")
    ref = build_lessons.notebook(LESSON)
    nbformat.write(ref, root / NAME)
    return root / NAME, ref


def submit(root: Path, student: str, nb) -> Path:
    (root / student).mkdir(parents=True, exist_ok=True)
    path = root / student / NAME
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


def rows_by(rows):
    return {(r.student, r.exercise): r for r in rows}


# ----------------------------------------------------------------------------------------------
# The reference and the answer sheet: no process.


def test_reference_lists_its_checks_with_their_answer_cells(lesson01):
    ref = reference.load_reference(lesson01[0])
    assert [(c.id, c.points) for c in ref.checks] == [("ring-all-reduce", 2.0), ("quiz:01", 3.0)]
    assert all(c.answer_cell_id for c in ref.checks) and ref.checks[1].quiz == "01"


def test_reference_errors_name_what_is_wrong(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, tmp_path / "r.ipynb")
    with pytest.raises(reference.GradingError, match="r.ipynb: no check cells"):
        reference.load_reference(tmp_path / "r.ipynb")
    nb.cells.append(nbformat.v4.new_code_cell("check()", metadata={"tags": ["check:ex", "points:2"]}))
    nbformat.write(nb, tmp_path / "r.ipynb")
    with pytest.raises(reference.GradingError, match="check 'ex' has no answer cell"):
        reference.load_reference(tmp_path / "r.ipynb")
    with pytest.raises(reference.GradingError, match="points must be a number, got 'two'"):
        reference.check_tags(nbformat.v4.new_code_cell("x", metadata={"tags": ["check:a", "points:two"]}))


def test_the_answer_sheet_is_read_as_a_literal_never_run():
    assert runner.answer_sheet('my_answers = {"a/b": "c", "a/n": 4.5, "a/m": ["x", "y"], "a/u": None}') == \
        {"a/b": "c", "a/n": 4.5, "a/m": ["x", "y"], "a/u": None}
    assert "not a plain dict of answers" in runner.answer_sheet(
        'my_answers = {"a": __import__("os").system("touch /tmp/pwned")}')
    assert runner.answer_sheet("x = 1") == "the answer sheet cell defines no my_answers"


# ----------------------------------------------------------------------------------------------
# A class of submissions on lesson 01, graded for real.


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_gradebook_of_a_class(lesson01, tmp_path):
    ref_path, ref = lesson01
    sheet = f"my_answers = {right_sheet('01', 's1001')!r}"
    forged = with_answer(ref, "ring-all-reduce", ref_cell(ref, "ring-all-reduce"))  # the stub, untouched
    forged.cells.append(nbformat.v4.new_code_cell('print("ring all-reduce on 2 ranks: PASSED (5/5 cases)")'))
    for cell in forged.cells:  # and the check cell's stored output says PASSED
        if "check:ring-all-reduce" in cell.metadata.get("tags", []):
            cell.source = 'print("ring all-reduce on 4 ranks: PASSED (5/5 cases)")'
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ring all-reduce: PASSED\n")]
    deleted = with_answer(ref, "ring-all-reduce", "")
    deleted.cells = [c for c in deleted.cells if "answer:ring-all-reduce" not in c.metadata.get("tags", [])]
    students = {
        "alice": with_answer(with_answer(ref, "ring-all-reduce", RING_SOLUTION), "quiz:01", sheet),
        "carl": with_answer(ref, "ring-all-reduce", RING_BY_PARITY),
        # carl's answer again, renamed and laid out anew, and alice's sheet: the similarity report lists them
        "ola": with_answer(with_answer(ref, "ring-all-reduce", RING_BY_PARITY.replace("parts", "pieces").replace(
            "incoming", "got").replace("_exchange", "swap") + "# mine\n"), "quiz:01", sheet),
        "dan": ref,
        "eve": with_answer(ref, "ring-all-reduce", "def my_ring_all_reduce(tensor):\n    dist.all_reduce(tensor)\n"
                                                   "    return tensor\n"),
        "fay": with_answer(ref, "ring-all-reduce",
                           "from parallel_lab.runtime.collectives import ring_all_reduce\n\n"
                           "def my_ring_all_reduce(tensor):\n    return ring_all_reduce(tensor)\n"),
        "gus": forged,
        "hal": with_answer(ref, "ring-all-reduce", "t = torch\nt.equal = lambda a, b: True\n\n"
                                                   "def my_ring_all_reduce(tensor):\n    return tensor\n"),
        "ivy": with_answer(ref, "ring-all-reduce", "def my_ring_all_reduce(tensor):\n    b = torch.empty_like(tensor)\n"
                                                   "    dist.recv(b, src=(dist.get_rank() + 1) % 2)\n    return b\n"),
        "kim": "this is not a notebook {",
        "lea": deleted,
    }
    root = tmp_path / "submissions"
    for student, nb in students.items():
        submit(root, student, nb)
    # dan handed in twice: the older file (a correct ring) is listed, the newer graded
    older = submit(root / "dan" / "old", "x", with_answer(ref, "ring-all-reduce", RING_SOLUTION))
    older = older.rename(root / "dan" / f"copy of {NAME}")
    os.utime(older, (1_000_000_000, 1_000_000_000))
    roster = tmp_path / "roster.csv"
    roster.write_text("folder,student_id,email,first_name,last_name\n" + "".join(
        f"{name},s{1001 + n},{name}@uni.example,{name.title()},Student\n" for n, name in enumerate(students)))
    ids = {name: f"s{1001 + n}" for n, name in enumerate(students)}
    out = tmp_path / "out" / "grades.csv"
    rows = gradebook.grade([root], out, [ref_path], check_timeout=5, jobs=2, progress=False, roster=roster)
    rows = [replace(r, student={v: k for k, v in ids.items()}[r.student]) for r in rows]
    got = rows_by(rows)
    points = {s: sum(r.points for r in rows if r.student == s) for s in students}
    # alice: ring 2 + quiz 3 (her own quiz); ola: the ring, but alice's sheet answers alice's quiz, not hers
    assert points == {"alice": 5, "carl": 2, "ola": 2, "dan": 0, "eve": 0, "fay": 0, "gus": 0, "hal": 0, "ivy": 0,
                      "kim": 0, "lea": 0}
    assert not got["ola", "quiz:01"].passed and got["ola", "quiz:01"].cases[0] < 6
    ring = {s: got[s, "ring-all-reduce"].reason for s in students}
    assert ring["alice"] == ring["carl"] == ""
    assert ring["dan"].startswith("ring all-reduce: NOT YET: my_ring_all_reduce still raises NotImplementedError")
    assert ring["gus"] == ring["dan"]  # a forged output, another cell, an edited check: all ignored
    assert "uses dist.all_reduce; this exercise builds it from isend/recv" in ring["eve"]
    assert "imports parallel_lab.runtime.collectives: the library's own implementation is not an answer" in ring["fay"]
    assert ring["hal"].startswith("ring all-reduce on 2 ranks: FAILED (0/5 cases): tensor of 1 element: rank 0: got [")
    assert "did not finish within 5 s" in ring["ivy"]
    assert ring["kim"].startswith("not a notebook: ") and "{" not in ring["kim"]
    assert ring["lea"] == "answer cell deleted (the cell tagged answer:ring-all-reduce)"
    assert got["dan", "quiz:01"].reason.startswith("quiz collectives (lesson 01): NOT PASSED: 0 of 8 points")
    sandbox = Sandbox.detect().kind
    assert {r.sandbox for r in rows} == {sandbox}

    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(gradebook.GRADEBOOK_COLUMNS) and len(table) == 2 * len(students)
    with open(out.with_name("grades-summary.csv"), newline="") as f:
        summary = {row["student"]: row for row in csv.DictReader(f)}
    assert summary["s1001"]["01_ranks_and_collectives points"] == "5" and summary["s1001"]["total max"] == "5"
    assert summary["s1001"]["score %"] == "100.0" and summary["s1001"]["lessons passed"] == "01"
    assert summary[ids["dan"]]["total points"] == "0" and summary[ids["dan"]]["email"] == "dan@uni.example"
    feedback = (out.parent / "feedback" / f"{ids['hal']}.md").read_text()
    assert "Score: 0 of 5 points" in feedback and "expected [" in feedback and "got [" in feedback
    assert "collectives/" in (out.parent / "feedback" / f"{ids['ola']}.md").read_text()  # wrong items explained
    with open(out.with_name("submissions.csv"), newline="") as f:
        handed = [row for row in csv.DictReader(f) if row["folder"] == "dan"]
    assert sorted((Path(r["submission"]).name, r["graded"]) for r in handed) == [
        (NAME, "yes"), (f"copy of {NAME}", "no")]
    assert "is newer" in next(r["note"] for r in handed if r["graded"] == "no")
    with open(out.with_name("similarity.csv"), newline="") as f:
        pairs = {(r["check"], r["student_a"], r["student_b"]) for r in csv.DictReader(f)}
    assert ("ring-all-reduce", ids["carl"], ids["ola"]) in pairs  # renamed and laid out anew: the same answer
    assert ("quiz:01", ids["ola"], ids["alice"]) in pairs  # ola's sheet answers alice's quiz
    assert not any(ids["alice"] in (a, b) and check == "ring-all-reduce" for check, a, b in pairs)
    with open(out.with_name("grades-canvas.csv"), newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert ["Student, Alice", "", "s1001", "alice@uni.example", ""] == canvas[2][:5]


def ref_cell(nb, check):
    return next(c.source for c in nb.cells if f"answer:{check}" in c.metadata.get("tags", []))


# ----------------------------------------------------------------------------------------------
# Hostile submissions: the sandbox, not the review, stops them (the probe exercise allows anything).

SECRET = "s3cr3t-grader-token-8d1f"


def probe_reference(root: Path) -> Path:
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def probe():\n    # YOUR CODE HERE\n    raise NotImplementedError\n",
                                  metadata={"tags": ["answer:probe"]}),
        nbformat.v4.new_code_cell("check(probe)", metadata={"tags": ["check:probe", "points:1"]})])
    nbformat.write(nb, root / "99_probe.ipynb")
    return root / "99_probe.ipynb"


def probe(body: str) -> str:
    return "def probe():\n" + "".join(f"    {line}\n" for line in body.splitlines())


def hostile_answers(outside: Path, inside_repo: Path | None) -> dict:
    writes = f'open({str(outside)!r}, "w").write("x")\n'
    if inside_repo is not None:  # only where the sandbox can refuse it
        writes += f'open({str(inside_repo)!r}, "w")\n'
    return {
        "secret": probe('import os\nreturn os.environ.get("PARALLEL_LAB_TEST_SECRET", "no secret")'),
        "writer": probe(writes + 'return "wrote"'),
        # a daemon: a grandchild in a session of its own, reparented away from the rank; the answer
        # returns once it runs (it writes on a pipe before it becomes `sleep`), never after a guess of time
        "forker": probe('import os\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n'
                        '        os.write(w, b"x")\n        os.execvp("sleep", ["sleep", "301"])\n    os._exit(0)\n'
                        'os.close(w)\nreturn "forked" if os.read(r, 1) == b"x" else "no grandchild"'),
        "bomber": probe("import os\nwhile True:\n    os.fork()"),
        "hoarder": probe("x = []\nwhile True:\n    x.append(bytearray(2**28))"),
        "sleeper": probe("import time\nwhile True:\n    time.sleep(1)"),
    }


RUN_VAR = "PARALLEL_LAB_TEST_RUN"  # set in every job of one test run, so a run finds its own leftovers only


def leftovers(run: str) -> list:
    """This run's processes still alive: each job's environment carries the run's token (beside the
    sandbox's per-job ENV_TOKEN), and a forked or exec'd orphan keeps it. Grading by another test
    session or a course service on the same machine is not ours to count."""
    found = []
    for p in psutil.process_iter():
        try:
            environ = p.environ()
            if environ.get(RUN_VAR) == run and ENV_TOKEN in environ:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


# Time limits that no submission of this test can reach but the one that never ends: what the test
# holds is where each ends (its own return, an rlimit, the watchdog) and that nothing outlives
# grading, so no result may depend on how fast a loaded machine runs the others.
NEVER = 480.0


@pytest.mark.ranks
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", ["bwrap", "subreaper"])
def test_hostile_submissions_are_graded_and_harm_nothing(kind, tmp_path, monkeypatch):
    """The submissions that end by themselves (or at an rlimit or the watchdog) are graded under
    limits they cannot reach, so that a loaded machine changes none of their reasons; the sleeper,
    which never ends, alone under a short wall-clock limit, which it reaches however fast the
    machine is. Afterwards no process of this run is left, the escaped daemon included."""
    sandbox = Sandbox.detect(prefer_bwrap=kind == "bwrap")
    if sandbox.kind != kind:  # CI installs bubblewrap (.ci/run): there its absence is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"bubblewrap does not work here: {sandbox.missing}")
    monkeypatch.setenv("PARALLEL_LAB_TEST_SECRET", SECRET)
    outside = tmp_path / "outside.txt"
    ref = probe_reference(tmp_path)
    in_repo = ROOT / "pwned-by-a-submission.txt" if kind == "bwrap" else None
    for student, source in hostile_answers(outside, in_repo).items():
        root = tmp_path / ("endless" if student == "sleeper" else "ending") / "submissions"
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["answer:probe"]})
        submit(root, student, nbformat.v4.new_notebook(cells=[cell])).rename(root / student / "99_probe.ipynb")
    run = uuid.uuid4().hex
    grade = dict(references=[ref], jobs=2, sandbox=sandbox, modules=("grading_probe",),
                 env={"PYTHONPATH": str(TESTS), RUN_VAR: run}, progress=False)
    rows = gradebook.grade([tmp_path / "ending" / "submissions"], tmp_path / "ending" / "grades.csv",
                           check_timeout=NEVER, notebook_timeout=NEVER, **grade)
    rows += gradebook.grade([tmp_path / "endless" / "submissions"], tmp_path / "endless" / "grades.csv",
                            check_timeout=NEVER, notebook_timeout=10, **grade)
    reasons = {r.student: r.reason for r in rows}
    assert not any(r.passed for r in rows) and all(reasons.values())
    assert reasons["secret"] == "probe: FAILED: it said no secret"
    written = [p for part in ("ending", "endless") for p in (tmp_path / part).rglob("*") if p.is_file()]
    assert SECRET not in "".join(p.read_text() for p in written)
    assert "MemoryError" in reasons["hoarder"] or "memory" in reasons["hoarder"]
    assert "exceeded its 10 s limit" in reasons["sleeper"]
    assert any(word in reasons["bomber"] for word in ("processes", "BlockingIOError", "Resource temporarily")), \
        reasons["bomber"]
    if kind == "bwrap":  # a private, read-only view of the file system
        assert not outside.exists() and not in_repo.exists()
        assert "No such file" in reasons["writer"] or "Read-only" in reasons["writer"]
    assert reasons["forker"] in ("probe: FAILED: it said forked",)
    assert leftovers(run) == []


# ----------------------------------------------------------------------------------------------
# The command line.


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_grade_command_json_contract(lesson01, tmp_path, capsys):
    ref_path, ref = lesson01
    submit(tmp_path / "subs", "ada", with_answer(ref, "ring-all-reduce", RING_SOLUTION))
    status = cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "g.csv"), "--reference", str(ref_path),
                       "--json"])
    out = capsys.readouterr().out
    assert status == 0
    report = json.loads(out)
    assert report["students"] == 1 and report["summary"].endswith("g-summary.csv")
    assert [(r["exercise"], r["passed"]) for r in report["rows"]] == [("ring-all-reduce", True), ("quiz:01", False)]
    assert os.path.exists(report["summary"]) and report["sandbox"] in ("bwrap", "subreaper")
    assert report["standings"]["ada"]["points"] == 2 and report["policy"]["certificate"]["threshold"] == 0.8
    # A regrade without grading again: the overrides reach the summary and the standings
    (tmp_path / "o.csv").write_text("student,check,points,reason\nada,quiz:01,3,paper quiz accepted\n")
    status = cli.main(["grade", "--from", str(tmp_path / "g.csv"), "--out", str(tmp_path / "g2.csv"),
                       "--overrides", str(tmp_path / "o.csv"), "--json"])
    again = json.loads(capsys.readouterr().out)
    assert status == 0 and again["standings"]["ada"]["points"] == 5 and again["standings"]["ada"]["passed"]
    assert "paper quiz accepted (was 0)" in (tmp_path / "feedback" / "ada.md").read_text()


# ----------------------------------------------------------------------------------------------
# Grading in either language.

ZH_LESSON = ROOT / "lessons" / "zh-Hant" / "10_schedule_search.ipynb"
EN_LESSON = ROOT / "lessons" / "10_schedule_search.ipynb"
CJK = re.compile(r"[\u4e00-\u9fff]")


def answered(nb):
    """The lesson as a student hands it in: an answer that raises on its rank, a wrong prediction,
    an answer sheet with one answer."""
    nb = with_answer(nb, "schedule-design", "def my_schedule(p, m, cap):\n    return p / 0\n")
    nb = with_answer(nb, "predict:synchronised-bubble", "my_prediction = 0.5\n")
    return with_answer(nb, "quiz:10", "my_answers = {'schedule-search/same-as-zb-h1': 'a'}\n")


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_zh_hant_submission_is_graded_against_its_edition_with_chinese_feedback(tmp_path, capsys):
    """The same answers handed in from the English lesson and from its zh-Hant edition (whose
    metadata says so): the same checks, points and verdicts, the zh-Hant one's words in Chinese --
    the exercise's verdict from the sandboxed checking process included."""
    subs = tmp_path / "subs"
    for student, lesson in (("ada", EN_LESSON), ("mei", ZH_LESSON)):
        (subs / student).mkdir(parents=True)
        nbformat.write(answered(nbformat.read(lesson, as_version=4)), subs / student / lesson.name)
    status = cli.main(["grade", str(subs), "--out", str(tmp_path / "g.csv"), "--reference", str(EN_LESSON),
                       "--reference", str(ZH_LESSON), "--check-timeout", "60", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    rows = {(r["student"], r["exercise"]): r for r in report["rows"]}
    checks = ["predict:synchronised-bubble", "schedule-design", "quiz:10"]
    for check in checks:
        en, zh = rows["ada", check], rows["mei", check]
        assert (zh["lesson"], zh["passed"], zh["points"], zh["max_points"]) == \
            (en["lesson"], en["passed"], en["points"], en["max_points"]), check
        assert not zh["passed"] and not CJK.search(en["reason"]) and CJK.search(zh["reason"]), (en, zh)
    assert rows["mei", "schedule-design"]["reason"] == \
        "排程 p=4、m=8、上限 4：未通過：my_schedule(4, 8, 4) 引發了 ZeroDivisionError: division by zero"
    with open(tmp_path / "g.csv", newline="", encoding="utf-8") as f:
        assert {r["student"]: r["lang"] for r in csv.DictReader(f)} == {"ada": "en", "mei": "zh-Hant"}
    english = (tmp_path / "feedback" / "ada.md").read_text(encoding="utf-8")
    chinese = (tmp_path / "feedback" / "mei.md").read_text(encoding="utf-8")
    assert english.startswith("# Feedback for ada") and "FAILED" in english and not CJK.search(english)
    assert chinese.startswith("# 給 mei 的回饋") and "得分：" in chinese and "FAILED" not in chinese
    assert "排程 p=4、m=8、上限 2：未通過：my_schedule(4, 8, 2) 引發了 ZeroDivisionError" in chinese  # the sandbox's
    assert "測驗 schedule-search（第 10 課）：未通過" in chinese and "不太對。" in chinese  # the quiz, its explanation


def test_the_feedback_on_a_wrong_number_gives_it_with_its_unit_in_the_editions_language():
    from parallel_lab.i18n import using

    item = load("schedule-search").item("schedule-search/uneven-ends")
    with using("zh-Hant"):
        chinese = runner._wrong_line(item, "5")
    with using("en"):
        english = runner._wrong_line(item, "5")
    assert chinese.startswith("schedule-search/uneven-ends (5 個區塊): 不太對。"), chinese
    assert english.startswith("schedule-search/uneven-ends (5 blocks): Not quite."), english
    assert runner._wrong_line(item, "five").startswith("schedule-search/uneven-ends: ")  # unreadable: no unit to give


ZH_TENSOR = ROOT / "lessons" / "zh-Hant" / "02_tensor_parallelism.ipynb"
G_WORLD_ONLY = '''class MyG(torch.autograd.Function):
    """g: all-reduce forward, identity backward -- over the whole world, whatever group it is given."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None
'''


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_zh_hant_submission_gets_its_points_and_reasons_from_the_verdicts_not_their_words(tmp_path, capsys):
    """Lesson 02 handed in from its zh-Hant edition: the row-parallel forward right, the g operator
    right on 2 ranks and wrong in groups of 2 on 4. The grader reads the verdicts the checking process
    sends (passed, cases, reason: the line made as a failure), not the words in them: the row-parallel
    check gets all its points and no reason, the g operator its partial credit and, as its reason, the
    Chinese line of the 4-rank run, not the 2-rank one that passed before it."""
    from exercise_support import lesson_solution

    from parallel_lab.course.grading.policy import Policy, default_file

    nb = nbformat.read(ZH_TENSOR, as_version=4)
    nb = with_answer(nb, "row-parallel-forward", lesson_solution("02_tensor_parallelism.py", "row-parallel-forward"))
    nb = with_answer(nb, "g-operator", G_WORLD_ONLY)
    (tmp_path / "subs" / "mei").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "subs" / "mei" / ZH_TENSOR.name)
    status = cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "g.csv"), "--reference",
                       str(ZH_TENSOR), "--check-timeout", "120", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    rows = {r["exercise"]: r for r in report["rows"]}
    row, g = rows["row-parallel-forward"], rows["g-operator"]
    assert (row["passed"], row["points"], row["max_points"], row["reason"]) == (True, 2, 2, "")
    assert not g["passed"]
    policy = Policy.load(default_file())
    assert g["points"] == pytest.approx(policy.points("exercises", 2, False, (4, 6))) and 0 < g["points"] < 2
    assert g["reason"].startswith("4 個 rank 上的 g 運算子：未通過（4 個案例中通過 2 個）："), g
    feedback = (tmp_path / "feedback" / "mei.md").read_text(encoding="utf-8")
    assert f"未通過：{g['reason']}" in feedback and "FAILED" not in feedback
    with open(tmp_path / "g.csv", newline="", encoding="utf-8") as f:
        csv_rows = {r["exercise"]: r for r in csv.DictReader(f)}
    assert csv_rows["g-operator"]["cases_passed"] == "4" and csv_rows["g-operator"]["cases_tried"] == "6"
    assert csv_rows["g-operator"]["lang"] == "zh-Hant" and csv_rows["g-operator"]["reason"] == g["reason"]


def test_the_similarity_report_leaves_out_unwritten_answers_in_either_language():
    """Two zh-Hant students who wrote the same lines and left the stub's raise in: "not yet" (尚未完成),
    so not a pair to look at -- decided from the answer (its exercise's screen), not from the English
    words NOT YET in the verdict. The same lines finished are a pair."""
    from parallel_lab.course.grading import similarity
    from parallel_lab.course.grading.runner import Row
    from parallel_lab.i18n import using

    body = ("    world, rank = dist.get_world_size(), dist.get_rank()\n    chunks = list(tensor.chunk(world))\n"
            "    right, left = (rank + 1) % world, (rank - 1) % world\n    for step in range(world - 1):\n"
            "        dist.send(chunks[(rank - step) % world], right)\n"
            "        dist.recv(chunks[(rank - step - 1) % world], left)\n")
    unfinished = f"def my_ring_all_reduce(tensor):\n{body}    # YOUR CODE HERE\n    raise NotImplementedError\n"
    finished = f"def my_ring_all_reduce(tensor):\n{body}    return torch.cat(chunks)\n"
    with using("zh-Hant"):
        said = RING.check(unfinished)
    assert said.not_yet and "NOT YET" not in str(said)

    def row(student, answer, verdict):
        return Row(student, "01_ranks_and_collectives", "ring-all-reduce", False, 0, 2, verdict.reason,
                   detail=str(verdict), category="exercises", answer=answer, lang="zh-Hant")

    stubs = [row("mei", unfinished, said), row("lin", unfinished, said)]
    assert similarity.code_pairs(stubs, 0.9) == []
    done = [row("mei", finished, said), row("lin", finished, said)]
    assert [(p.student_a, p.student_b) for p in similarity.code_pairs(done, 0.9)] == [("mei", "lin")]
