"""Predictions that count (parallel_lab.course.predictions, parallel_lab.show.predict): a student's
number is recorded before a run and compared after it; a graded one is read from the answer cell's
source as data and scored against a reference the grader computes; the registry is bilingual and
agrees with the lessons; the student edition leaves every prediction None. No process starts."""

import csv
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from parallel_lab import i18n
from parallel_lab.course import predictions
from parallel_lab.course.grading import gradebook, reference
from parallel_lab.course.grading.sandbox import Sandbox
from parallel_lab.pipeline import balance
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show.predict import predict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402

SOURCES = {p.stem[:2]: p for p in (ROOT / "lessons" / "src").glob("*.py")}
NAME = f"{SOURCES['04'].stem}.ipynb"
LESSONS_WITH_PREDICTIONS = sorted(n for n, p in SOURCES.items() if "answer:predict:" in p.read_text(encoding="utf-8"))


def prediction_cells(nb) -> dict:
    """prediction id -> its answer cell (tag ``answer:predict:<id>``)."""
    return {t[len("answer:predict:"):]: c for c in nb.cells for t in c.metadata.get("tags", [])
            if t.startswith("answer:predict:")}


# ----------------------------------------------------------------------------------------------
# The notebook side: record, then compare.


def test_a_prediction_is_recorded_then_compared(capsys):
    guess = predict("all-reduce-4mb", 12, "gloo's all-reduce of 4 MB on 4 ranks", unit="ms", tolerance=0.5)
    guess.versus(9.87)
    assert capsys.readouterr().out.splitlines() == [
        "prediction all-reduce-4mb: your prediction: 12 ms (recorded before the run)",
        "prediction all-reduce-4mb: predicted 12 ms, measured 9.87 ms: +22 %, within ±50 %"]
    assert predict("m", 26, "micro-batches", tolerance=0.02).comparison(27, "simulated") == \
        "prediction m: predicted 26, simulated 27: -4 %, outside ±2 %"


def test_no_prediction_prompts_for_a_number_and_still_shows_the_measurement(capsys):
    guess = predict("gpipe-bubble", None)
    shown = capsys.readouterr().out
    assert shown.startswith("prediction gpipe-bubble: NOT YET: no number recorded.\n")
    assert "Write it in my_prediction in the cell above" in shown and "Graded: 1 point within ±10 %" in shown
    assert "0.429" not in shown and "3 / 7" not in shown  # the reference is the grader's, not printed
    assert guess.comparison(3 / 7, "simulated") == (
        "prediction gpipe-bubble: simulated 0.429; no prediction was recorded (next time write one in "
        "my_prediction before the run)")
    refused = predict("x", "0.3", "a fraction")
    assert refused.value is None and "NOT YET: my_prediction must be a number, got '0.3'" in capsys.readouterr().out


def test_a_graded_prediction_takes_its_question_from_the_registry_only():
    assert predict("1f1b-peak-stash", 4).tolerance == predictions.GRADED["1f1b-peak-stash"].tolerance
    with pytest.raises(ValueError, match="is graded: its question, unit, tolerance and choices are those of"):
        predict("gpipe-bubble", 0.4, tolerance=0.5)
    with pytest.raises(ValueError, match="is not graded: say what it predicts"):
        predict("not-registered", 0.4)
    with i18n.using("zh-Hant"):
        zh = predict("gpipe-bubble", None)
        assert "氣泡（bubble）" in zh.text() and "尚未完成" in zh.text() and "計分" in zh.text()
        assert "NOT YET" not in zh.text()


def test_a_chinese_prompt_spaces_a_question_that_begins_or_ends_latin(capsys):
    """Taiwan typesetting as the lessons set it: a half-width space between CJK and a Latin word or
    number. The template cannot know the question's first letter, so the prompt puts the space."""
    with i18n.using("zh-Hant"):
        latin = predict("x", None, {"en": "1F1B's stash", "zh-Hant": "1F1B 的暫存"}, unit="steps").text()
        cjk = predict("y", None, {"en": "the naive step", "zh-Hant": "樸素排程的一步"}).text()
        choice = predict("z", None, {"en": "which", "zh-Hant": "ZB-H1 還是 1F1B"}, choices=("a", "b")).text()
    assert "請預測 1F1B 的暫存（單位：" in latin, latin
    assert "請預測樸素排程的一步。" in cjk, cjk
    assert "請預測 ZB-H1 還是 1F1B：寫下" in choice, choice
    english = predict("x", None, "1F1B's stash").text()
    assert "  Predict 1F1B's stash." in english, english
    capsys.readouterr()


def test_a_choice_is_shown_in_the_lesson_language_and_accepted_in_either(capsys):
    choices = ({"en": "more micro-batches", "zh-Hant": "更多微批次"}, {"en": "the same", "zh-Hant": "一樣"})
    with i18n.using("zh-Hant"):
        asked = predict("c", None, "哪一個", choices=choices).text()
        typed_zh = predict("c", "一樣", "哪一個", choices=choices)
        typed_en = predict("c", "the same", "哪一個", choices=choices)
    assert "更多微批次" in asked and "more micro-batches" not in asked, asked
    assert typed_zh.value == typed_en.value == choices[1]
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------
# The grader's side: read as data, scored against its own reference.


def test_the_prediction_is_read_as_data_never_run(tmp_path):
    read = predictions.read_prediction
    assert read("my_prediction = None  # GPipe's bubble") is None
    assert read("my_prediction = None\nmy_prediction = 3 / 11") == pytest.approx(3 / 11)
    assert read("my_prediction: float = -(0.5 * 2) + 1e-3") == pytest.approx(-0.999)
    marker = tmp_path / "pwned"
    for source, why in ((f"my_prediction = __import__('os').system('touch {marker}')", "is not a number"),
                        ("my_prediction = '27 %'", "is not a number"), ("my_prediction = 1 / 0", "is not a number"),
                        ("my_prediction = 10 ** 9 ** 9", "is not a number"), ("x = 1", "defines no my_prediction"),
                        ("my_prediction = (", "does not parse")):
        with pytest.raises(ValueError, match=why):
            read(source)
    assert not marker.exists()


def test_grading_a_right_a_wrong_and_a_missing_prediction():
    right = predictions.grade("gpipe-bubble", "my_prediction = 0.45")
    assert right.passed and str(right) == ("prediction gpipe-bubble: PASSED: predicted 0.45, reference 0.429 "
                                           "(GPipe bubble, p = 4, m = 4): +5 %, within ±10 %")
    wrong = predictions.grade("gpipe-bubble", "my_prediction = 0.1")
    assert not wrong.passed and wrong.reason == ("prediction gpipe-bubble: FAILED: predicted 0.1, reference 0.429 "
                                                 "(GPipe bubble, p = 4, m = 4): -77 %, outside ±10 %")
    missing = predictions.grade("gpipe-bubble", "my_prediction = None  # ...")
    assert not missing.passed and missing.not_yet and "NOT YET: my_prediction is still None" in missing.reason
    assert "knows no graded prediction" in predictions.grade("nope", "my_prediction = 1").reason


def test_the_registry_is_bilingual_and_its_references_are_the_lessons_numbers():
    assert len(predictions.GRADED) >= 2 and {"01", "04", "05", "09"} <= set(LESSONS_WITH_PREDICTIONS)
    for p in predictions.GRADED.values():
        assert set(p.question) == {"en", "zh-Hant"} and all(p.question.values()), p.id
        assert re.search(r"[\u4e00-\u9fff]", p.question["zh-Hant"]) and "数据" not in p.question["zh-Hant"], p.id
        assert 0 < p.tolerance < 1 and p.points > 0 and p.lesson in SOURCES, p.id
        assert p.function.startswith("parallel_lab.") and p.about
    ref = {k: p.reference() for k, p in predictions.GRADED.items()}
    # What lessons 04, 05 and 09 compute and show next to the prediction.
    gpipe = simulate(build("gpipe", 4, 4), Costs(F=1, B=2))
    assert ref["gpipe-bubble"] == gpipe.bubble_fraction == pytest.approx(3 / 7)
    assert ref["1f1b-peak-stash"] == max(simulate(build("1f1b", 4, 8), Costs(F=1, B=2)).peak_activations) == 4
    even_cut = simulate(build("1f1b", 4, 8), balance.stage_costs([1, 2, 2, 2, 2, 2, 4], [0, 3, 4, 5, 7]))
    assert ref["uneven-cut-step"] == even_cut.makespan == 171


# ----------------------------------------------------------------------------------------------
# The lessons and their two editions.


@pytest.mark.parametrize("lesson", LESSONS_WITH_PREDICTIONS)
def test_the_student_edition_leaves_every_prediction_none(lesson):
    source = SOURCES[lesson]
    student, solutions = build_lessons.notebook(source), build_lessons.notebook(source, "solutions")
    cells, answered = prediction_cells(student), prediction_cells(solutions)
    assert cells and set(cells) == set(answered)
    for pid, cell in cells.items():
        assert predictions.read_prediction(cell.source) is None, (lesson, pid)
        assert "SOLUTION" not in cell.source and cell.source.startswith("my_prediction = None  # ")
        assert len(answered[pid].source.splitlines()) > len(cell.source.splitlines())  # the answer is there
        if pid in predictions.GRADED:  # the stub is "not yet", the solution passes
            assert predictions.grade(pid, cell.source).not_yet
            assert predictions.grade(pid, answered[pid].source).passed, (lesson, pid)
    graded = {t[len("check:predict:"):] for c in student.cells for t in c.metadata.get("tags", [])
              if t.startswith("check:predict:")}
    assert graded == {p.id for p in predictions.GRADED.values() if p.lesson == lesson}


def test_the_build_refuses_an_unregistered_graded_prediction_and_a_filled_in_stub():
    cells = build_lessons.parse('# %% tags=["answer:predict:guess"]\nmy_prediction = 0.5\n'
                                '### BEGIN SOLUTION\nmy_prediction = 0.5\n### END SOLUTION\n')
    with pytest.raises(SystemExit, match="must leave my_prediction = None for the student"):
        build_lessons.check_predictions("99_x.py", cells)
    cells += build_lessons.parse('# %% tags=["check:predict:guess"]\nguess = predict("guess", my_prediction)\n')
    with pytest.raises(SystemExit, match=r"tagged \['guess'\] != registered for lesson 99 \[\]"):
        build_lessons.check_predictions("99_x.py", cells)


# ----------------------------------------------------------------------------------------------
# Through the grader: the prediction is a check of the lesson's grade.


@pytest.fixture(scope="module")
def lesson04(tmp_path_factory):
    root = tmp_path_factory.mktemp("lesson04")
    ref = build_lessons.notebook(SOURCES["04"])
    path = root / NAME
    nbformat.write(ref, path)
    return path, ref


def submission(ref, root: Path, student: str, prediction: str, measured_output: str = "") -> Path:
    nb = nbformat.from_dict(json.loads(json.dumps(ref)))
    for cell in nb.cells:
        if "answer:predict:gpipe-bubble" in cell.metadata.get("tags", []):
            cell.source = prediction
        if measured_output and "check:predict:gpipe-bubble" in cell.metadata.get("tags", []):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=measured_output)]
    (root / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, root / student / NAME)
    return root / student / NAME


def test_a_graded_prediction_is_a_check_of_the_reference_with_the_registrys_points(lesson04, tmp_path):
    ref = reference.load_reference(lesson04[0])
    check = next(c for c in ref.checks if c.id == "predict:gpipe-bubble")
    assert check.prediction == "gpipe-bubble" and check.points == predictions.GRADED["gpipe-bubble"].points
    assert check.answer_cell_id and not check.quiz
    assert "predict:gpipe-microbatches" not in {c.id for c in ref.checks}  # ungraded: no check
    nb = nbformat.from_dict(json.loads(json.dumps(lesson04[1])))
    for cell in nb.cells:
        if "check:predict:gpipe-bubble" in cell.metadata.get("tags", []):
            cell.metadata["tags"].append("points:5")
    nbformat.write(nb, tmp_path / "bad.ipynb")
    with pytest.raises(reference.GradingError, match="tagged points:5, but a prediction's points are the registry's"):
        reference.load_reference(tmp_path / "bad.ipynb")


def test_the_gradebook_scores_predictions_without_a_process(lesson04, tmp_path):
    """Right, wrong (whatever the stored output claims) and untouched; lesson 04 has no exercise, so
    nothing is sent to the sandbox."""
    ref_path, ref = lesson04
    subs = tmp_path / "subs"
    submission(ref, subs, "ada", "my_prediction = 3 / 7")
    submission(ref, subs, "bob", "my_prediction = 0.1",
               measured_output="prediction gpipe-bubble: PASSED: predicted 0.1, reference 0.1")
    submission(ref, subs, "cy", build_lessons.student_source(
        prediction_cells(ref)["gpipe-bubble"].source, stub=""))
    out = tmp_path / "grades.csv"
    rows = gradebook.grade([subs], out, references=[ref_path], sandbox=Sandbox("subreaper"), progress=False)
    got = {r.student: r for r in rows if r.exercise == "predict:gpipe-bubble"}
    assert got["ada"].passed and got["ada"].points == 1 and got["ada"].reason == ""
    assert not got["bob"].passed and got["bob"].points == 0 and got["bob"].reason == (
        "prediction gpipe-bubble: FAILED: predicted 0.1, reference 0.429 (GPipe bubble, p = 4, m = 4): "
        "-77 %, outside ±10 %")
    assert "NOT YET: my_prediction is still None" in got["cy"].reason
    table = list(csv.DictReader(out.open()))
    assert {(r["student"], r["exercise"], r["points"]) for r in table} >= {
        ("ada", "predict:gpipe-bubble", "1"), ("bob", "predict:gpipe-bubble", "0")}
    feedback = (tmp_path / "feedback" / "bob.md").read_text()
    assert "predict:gpipe-bubble (0 of 1 point): FAILED: prediction gpipe-bubble: FAILED: predicted 0.1" in feedback


# ----------------------------------------------------------------------------------------------
# Predictions that are not numbers: a count, a choice, an order.


def test_a_count_a_choice_and_an_order_are_recorded_and_compared_exactly(capsys):
    stash = predict("stash", 3, "the most micro-batches stage 0 keeps", unit="micro-batches", tolerance=0)
    assert stash.comparison(4, "simulated") == \
        "prediction stash: predicted 3 micro-batches, simulated 4 micro-batches: not this time"
    assert stash.comparison(3, "simulated").endswith(": right")
    split = predict("split", "Rows", "which split needs no communication", choices=("columns", "rows"))
    assert split.value == "rows" and split.comparison("columns") == "prediction split: predicted rows, measured " \
                                                                     "columns: not this time"
    order = predict("order", ["time", "even", "params"], "the cuts from fastest to slowest",
                    order=("even", "time", "params"))
    assert order.value == ("time", "even", "params")
    assert order.comparison(["time", "params", "even"], "simulated") == (
        "prediction order: predicted time → even → params, simulated time → params → even: 1 of 3 in place")
    capsys.readouterr()
    refused = predict("split", "diagonals", "which split", choices=("columns", "rows"))
    assert refused.value is None and "must be one of 'columns', 'rows', got 'diagonals'" in capsys.readouterr().out
    asked = predict("order", None, "the cuts from fastest to slowest", order=("even", "time", "params"))
    assert "write 'even', 'time', 'params' as a list, in your order" in asked.text()
    with pytest.raises(ValueError, match="is not one of"):
        split.versus("diagonals")
    with pytest.raises(ValueError, match="needs at least two choices"):
        predict("x", None, "?", choices=("only",))


def test_versus_carries_the_reference_in_the_outputs_metadata_in_a_notebook(monkeypatch):
    import IPython
    from IPython.core.interactiveshell import InteractiveShell

    from parallel_lab.show import predict as module

    shown = []
    shell = InteractiveShell.instance()
    monkeypatch.setattr(shell, "kernel", object(), raising=False)  # as under ipykernel
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr("IPython.display.display", lambda obj, raw, metadata: shown.append((obj, metadata)))
    module.predict("gpipe-bubble", None).versus(3 / 7, "simulated")
    (data, metadata), = shown
    assert data["text/plain"].startswith("prediction gpipe-bubble: simulated 0.429")
    assert metadata == {"parallel_lab": {"prediction": "gpipe-bubble", "kind": "number", "unit": "",
                                         "reference": pytest.approx(3 / 7)}}


def test_the_grader_reads_a_choice_and_an_order_as_data():
    read = predictions.read_prediction
    assert read("my_prediction = 'rows'", "choice") == "rows"
    assert read("my_prediction = ['b', 'a']", "order") == ("b", "a")
    assert read("my_prediction = ('b', 'a')", None) == ("b", "a") and read("my_prediction = 2", None) == 2.0
    with pytest.raises(ValueError, match="is not one of the choices"):
        read("my_prediction = 3", "choice")
    with pytest.raises(ValueError, match="is not an order"):
        read("my_prediction = 'a'", "order")
    with pytest.raises(ValueError, match="is not a number"):
        read("my_prediction = 'a'")
