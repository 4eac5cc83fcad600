"""The students' release (``parallel-lab release DIR``): it holds no solution line, no quiz key in
plain text and no answer file, and it runs: lesson 01 passes nbval from it, and its quiz widget
gives the same feedback from the sealed bank as the instructor's does from the key."""

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from parallel_lab import cli
from parallel_lab.course import release
from parallel_lab.course.quiz import load, load_all

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402


@pytest.fixture(scope="module")
def students_copy(tmp_path_factory):
    target = tmp_path_factory.mktemp("release") / "parallel-lab-students"
    report = release.write_release(target)
    return target, report


def test_the_release_holds_no_solution_line_no_quiz_key_and_no_answer_file(students_copy):
    target, report = students_copy
    files = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    assert report.problems == [] and release.audit(target) == []
    assert not any(f.startswith(("tests/", "tools/")) for f in files)
    assert not {"grading.yaml", "ARCHITECTURE.md", "quizzes/schema.json", "parallel_lab/course/quiz/answers.py"} & files
    assert {"lessons/01_ranks_and_collectives.ipynb", "lessons/src/01_ranks_and_collectives.py", "course.py",
            "pyproject.toml", "binder/postBuild", "quizzes/faq_source.md", "RELEASE.json"} <= files
    # Every solution region went: 27 of them, and not one of their lines is left anywhere
    assert sum(report.stripped.values()) == sum(
        len(release.SOLUTION.findall(p.read_text())) for p in (ROOT / "lessons" / "src").glob("*.py"))
    lines = release.solution_lines()
    assert len(lines) > 90  # what the audit looks for: every distinctive line of the 27 regions
    released = {line.strip() for f in sorted(files) for line in release._text_of(target / f)}
    assert not lines & released
    text = "\n".join("\n".join(release._text_of(target / f)) for f in sorted(files))
    # No quiz key: no correct mark, no answer value or function, no explanation in plain text
    for path in sorted((target / "quizzes").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data["sealed"]["scheme"] == "sha256-shake256-v1"
        for item in data["items"]:
            assert all(set(o) == {"key", "text"} for o in item.get("options", ()))
            assert set(item.get("answer", {})) <= {"params"} and "explanation" not in item
    # A sealed numeric item keeps its unit in both languages (the widget shows it beside the box)
    units = {item.id: item.unit for b in load_all() for item in b.items if item.unit}
    sealed = {item["id"]: item.get("unit") for p in (target / "quizzes").glob("*.yaml")
              for item in yaml.safe_load(p.read_text())["items"] if item["id"] in units}
    assert sealed["interleaved/gpu0-stash"]["zh-Hant"].startswith("份暫存")
    assert sealed == units and all(set(u) == {"en", "zh-Hant"} for u in sealed.values())
    banks = "".join(p.read_text() for p in (target / "quizzes").glob("*.yaml"))
    assert "correct:" not in banks and not re.search(r"parallel_lab\.[\w.]+:\w", banks)  # no key, no function
    assert "course.quiz.answers:" not in text
    assert not [key for key in release.key_texts() if key in text]


def test_a_stripped_source_is_the_student_edition(students_copy):
    target, _ = students_copy
    for name in ("01_ranks_and_collectives", "05_1f1b_memory", "12_zero_sharding"):
        source = ROOT / "lessons" / "src" / f"{name}.py"
        stripped = build_lessons.parse((target / "lessons" / "src" / f"{name}.py").read_text())
        stripped = build_lessons.with_load(source, stripped, "en")  # the build states the lesson's time
        edition = build_lessons.notebook(source)
        assert [c.source for c in stripped] == [c.source for c in edition.cells[:len(stripped)]]


def test_the_audit_finds_a_leak(tmp_path, students_copy):
    target, _ = students_copy
    copy = tmp_path / "leaky"
    subprocess.run(["cp", "-r", str(target), str(copy)], check=True)
    line = sorted(release.solution_lines())[0]
    (copy / "notes.py").write_text(f"# found it\n    {line}\n")
    bank = next((copy / "quizzes").glob("*.yaml"))
    bank.write_text(bank.read_text().replace("kind: single", "kind: single\n  correct: true", 1))
    problems = release.audit(copy)
    assert any("notes.py: line 2 is a line of a solution region" in p for p in problems)
    (copy / "tests").mkdir()
    (copy / "tests" / "test_x.py").write_text("")
    assert any(p.startswith("tests/test_x.py: a file the release leaves out") for p in release.audit(copy))


def test_the_command_refuses_a_folder_in_use_and_reports_what_it_wrote(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    assert cli.main(["release", str(tmp_path / "full")]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "full" / "x").read_text() == "mine"
    assert cli.main(["release", str(ROOT / "release")]) == 2
    assert "is inside the course" in capsys.readouterr().err


def _released_env(target: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLEL_LAB_")}
    return {**env, "PYTHONPATH": str(target), "PARALLEL_LAB_HOME": str(target / ".home")}


WIDGET = """
import json, sys
from parallel_lab.course.quiz import load, load_all
from parallel_lab.show.quizbox import quiz
assert load("01").items[0].sealed is not None, "the release's bank is not sealed"
box, said = quiz("01"), {}
for view in box.views:
    if view.item.kind == "single":
        for key, _ in view.item.options:
            view.choice.value = key
            view.check_button.click()
            said[f"{view.item.id} {key}"] = [view.status, view.feedback.value]
    elif view.item.kind == "numeric":
        for value in json.loads(sys.argv[1])[view.item.id]:
            view.number_box.value = str(value)
            view.check_button.click()
            said[f"{view.item.id} {value}"] = [view.status, view.feedback.value]
print(json.dumps(said))
"""


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_lesson_01_runs_from_the_release_and_its_quiz_gives_feedback(students_copy):
    target, _ = students_copy
    env = _released_env(target)
    where = subprocess.run([sys.executable, "-c", "import parallel_lab; print(parallel_lab.__file__)"], env=env,
                           cwd=target, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(target))  # the release's own package, not this repository's
    nbval = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "lessons/01_ranks_and_collectives.ipynb"], env=env, cwd=target, capture_output=True,
                           text=True, timeout=540)
    assert nbval.returncode == 0, nbval.stdout[-3000:] + nbval.stderr[-2000:]
    assert " passed" in nbval.stdout.splitlines()[-1]

    bank = load("01")  # the instructor's, with its keys: what the release's widget must agree with
    numbers = {item.id: [item.value(), item.value() * 3, item.mistakes[0].answer["value"]]
               for item in bank.items if item.kind == "numeric"}
    run = subprocess.run([sys.executable, "-c", WIDGET, json.dumps(numbers)], env=env, cwd=target,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout)
    for item in bank.items:
        if item.kind == "single":
            for option in item.options:
                status, message = said[f"{item.id} {option.key}"]
                assert status == ("correct" if option.correct else "wrong")
                assert option.why["en"][:40] in html.unescape(message)
        elif item.kind == "numeric":
            right, off, mistake = numbers[item.id]
            assert said[f"{item.id} {right}"][0] == "correct"
            assert said[f"{item.id} {off}"][0] == "wrong"
            assert said[f"{item.id} {mistake}"][0] == "wrong"
            assert item.mistakes[0].why["en"][:30] in html.unescape(said[f"{item.id} {mistake}"][1])
    nb = nbformat.read(target / "lessons" / "01_ranks_and_collectives.ipynb", as_version=4)
    assert any("graded_quiz(" in cell.source for cell in nb.cells)
