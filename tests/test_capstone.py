"""The capstone's hand-in (lesson 18, ``exercises.capstone``): a correct hand-in passes; an untouched
plan, a plan that breaks a rule, a run never made, a record of another plan, an edited record, a
prediction that is not the model's and a measurement that no run of the plan made each fail with
their reason; the grader reads the record from the submission's outputs, runs the plan itself, and
exports the written analysis with its rubric for the instructor, whose override scores it."""

import json
import sys
from pathlib import Path

import nbformat
import pytest

from parallel_lab.course.grading import gradebook
from parallel_lab.course.grading.policy import DEFAULTS, RUBRIC, Policy, PolicyError
from parallel_lab.exercises import REGISTRY, capstone
from parallel_lab.parallel3d import train3d

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402

LESSON = ROOT / "lessons" / "src" / "18_capstone.py"
PLAN = 'def my_plan():\n    return {"dp": 1, "pp": 2, "tp": 1, "schedule": "1f1b", "microbatches": 2}\n'
OTHER = 'def my_plan():\n    return {"dp": 2, "pp": 1, "tp": 1, "schedule": "1f1b", "microbatches": 2}\n'
CONSTANTS = {"tflops": 0.001, "latency_us": 500.0, "intra_gbps": 0.5}  # what calibrate would measure


def plan_of(source: str) -> dict:
    namespace = {}
    exec(source, namespace)  # the test's own plan source, trusted
    return namespace["my_plan"]()


def hand_in_of(source: str, calibration: dict | None = None) -> str:
    """A correct hand-in of a plan cell's source: predicted, run on real ranks, recorded."""
    cfg = capstone.plan_config(plan_of(source))
    prediction = capstone.predict(cfg, calibration or dict(CONSTANTS))
    return capstone.hand_in(source, capstone.measure(cfg, prediction)["line"])


def with_record(hand: str, change) -> str:
    """The hand-in with its record changed by ``change(record)`` and its digest made consistent."""
    data = json.loads(hand)
    record = capstone.read_record(data["record"])
    change(record)
    record["digest"] = capstone.digest(record)
    data["record"] = capstone.RECORD_PREFIX + json.dumps(record)
    return json.dumps(data)


# ----------------------------------------------------------------------------------------------
# No process.


@pytest.mark.parametrize("plan,match", [
    ([1, 2], "must return a dict"),
    ({"dp": 1, "ep": 2}, r"unknown plan field\(s\) \['ep'\]"),
    ({"dp": 0}, "dp must be an integer from 1 to 8, got 0"),
    ({"recompute": "yes"}, "recompute must be True or False, got 'yes'"),
    ({"schedule": "dualpipe"}, "schedule must be one of"),
    ({"dp": 4, "pp": 2, "tp": 2}, "16 ranks; at most 8"),
    ({"tp": 2, "heads": 3}, "heads"),
    ({"dp": 1, "pp": 2, "tp": 1, "microbatches": 3}, "not divisible by microbatches 3"),
])
def test_a_plan_that_breaks_a_rule_is_refused_with_the_rule(plan, match):
    with pytest.raises(ValueError, match=match):
        capstone.plan_config(plan)


def test_the_model_prediction_is_recomputed_from_the_record():
    cfg = capstone.plan_config(plan_of(PLAN))
    made = {"constants": CONSTANTS, "workload_tflops": 0.002, "cores": 2.0,
            **capstone.model_prediction(cfg, CONSTANTS, 0.002, 2.0)}
    ok, line = capstone.judge_prediction(cfg, {"prediction": made})
    assert ok, line
    off = json.loads(json.dumps(made))
    off["time"]["step_s"] *= 0.57  # a prediction 43 % short, typed in
    ok, line = capstone.judge_prediction(cfg, {"prediction": off})
    assert not ok and "not the course's model for this plan: its time 'step_s'" in line
    other = capstone.plan_config(plan_of(OTHER))
    ok, line = capstone.judge_prediction(other, {"prediction": made})  # the right numbers, another plan
    assert not ok and "not the course's model" in line


def test_the_student_edition_holds_no_plan_and_the_stub_is_not_yet():
    cells = build_lessons.parse(LESSON.read_text(encoding="utf-8"))
    cell = next(c for c in cells if "answer:capstone" in c.metadata.get("tags", []))
    stub = build_lessons.student_source(cell.source)
    assert "return {" not in stub and "raise NotImplementedError" in stub
    verdict = REGISTRY["capstone"].check(capstone.hand_in(stub, ""))
    assert verdict.not_yet and not verdict.passed


def test_the_rubric_is_the_policys_and_translatable():
    policy = Policy()
    assert policy.rubric_points(capstone.ANALYSIS) == 3
    assert [str(text) for text in RUBRIC] == [c["criterion"] for c in DEFAULTS["rubric"][capstone.ANALYSIS]]
    cells = build_lessons.parse(LESSON.read_text(encoding="utf-8"))
    check = next(c for c in cells if "check:capstone-analysis" in c.metadata.get("tags", []))
    assert "points:3" in check.metadata["tags"]
    with pytest.raises(PolicyError, match="rubric.capstone-analysis criterion 1 needs points > 0"):
        Policy.from_dict({"rubric": {"capstone-analysis": [{"points": 0, "criterion": "x"}]}})


def test_the_similarity_report_lists_alike_analyses_and_one_run_in_two_hand_ins():
    from parallel_lab.course.grading import similarity
    from parallel_lab.course.grading.runner import Row

    text = ("The model put the step at a third of what the ranks took, because four ranks shared two cores "
            "while the model gave each its own; with one replica the gap shrank as the shared bound says.")
    record = capstone.RECORD_PREFIX + json.dumps({"version": 1, "nonce": "abc123"})

    def row(student, check, answer):
        return Row(student, "18_capstone", check, False, 0, 3, "", category="capstone", answer=answer)

    rows = [row("ada", "capstone-analysis", text), row("bob", "capstone-analysis", text.replace("third", "half")),
            row("cy", "capstone-analysis", "My own words about something else entirely, " * 3),
            row("ada", "capstone", capstone.hand_in(PLAN, record)),
            row("bob", "capstone", capstone.hand_in(OTHER, record)),
            row("cy", "capstone", capstone.hand_in(PLAN, ""))]
    pairs = {(p.check, p.student_a, p.student_b) for p in similarity.report(rows, 0.9)}
    assert pairs == {("capstone-analysis", "ada", "bob"), ("capstone", "ada", "bob")}


# ----------------------------------------------------------------------------------------------
# On ranks.


@pytest.fixture(scope="module")
def correct():
    return hand_in_of(PLAN)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_correct_hand_in_passes_all_three_cases(correct):
    verdict = REGISTRY["capstone"].check(correct)
    assert verdict.passed and verdict.cases == (3, 3), str(verdict)
    text = str(verdict)
    assert "equals one process in fp64" in text and "the course's model for this plan" in text
    assert "a run of this plan" in text


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_what_is_not_theirs_fails_with_its_reason(correct):
    check = REGISTRY["capstone"].check
    data = json.loads(correct)
    cases = {
        "unrun": (capstone.hand_in(PLAN, ""), "no measurement: run the plan"),
        "another plan": (capstone.hand_in(OTHER, data["record"]), "the record is of another plan (dp, pp differ"),
        "edited": (capstone.hand_in(PLAN, data["record"].replace('"steps_s":[', '"steps_s":[0.001,', 1)),
                   "the record was edited after the run"),
        "prediction typed in": (with_record(correct, lambda r: r["prediction"]["time"].update(step_s=0.5)),
                                "the prediction is not the course's model for this plan"),
        "memory typed in": (with_record(correct, lambda r: r["prediction"]["memory"].update(total=1.0)),
                            "its memory 'total' is 1.0"),
        "losses made up": (with_record(correct, lambda r: r["measurement"].update(losses=[4.0, 3.9, 3.8])),
                           "the measurement is not of a run of this plan"),
        "median made up": (with_record(correct, lambda r: r["measurement"].update(step_s=1e-6)),
                           "is not the median of the record's steps"),
    }
    for name, (hand, reason) in cases.items():
        verdict = check(hand)
        assert not verdict.passed, name
        assert reason in str(verdict), (name, str(verdict))
        assert verdict.cases[0] >= 1, (name, verdict.cases)  # the plan itself ran and equals one process


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_the_grader_reads_the_record_runs_the_plan_and_exports_the_analysis(correct, tmp_path):
    ref = build_lessons.notebook(LESSON)
    reference = tmp_path / "ref" / "18_capstone.ipynb"
    reference.parent.mkdir()
    nbformat.write(ref, reference)
    record = json.loads(correct)["record"]

    def submission(student, plan, record_text, analysis=None):
        nb = nbformat.from_dict(json.loads(json.dumps(ref)))
        for cell in nb.cells:
            tags = cell.metadata.get("tags", [])
            if "answer:capstone" in tags:
                cell.source = plan
            if "answer:capstone-analysis" in tags and analysis is not None:
                cell.source = analysis
        run = nbformat.v4.new_code_cell("measurement = capstone.measure(cfg, prediction)")
        run.outputs = [nbformat.v4.new_output("stream", name="stdout", text=record_text + "\n")]
        nb.cells.append(run)
        path = tmp_path / "in" / student / "18_capstone.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        return path

    analysis = "The model predicted less than the run took: the ranks shared fewer cores than ranks ..."
    submission("ada", PLAN, record, analysis)
    submission("bob", OTHER, record)  # another student's record, the analysis left as it was
    out = tmp_path / "out" / "grades.csv"
    rows = {(r.student, r.exercise): r for r in gradebook.grade([tmp_path / "in"], out, references=[reference],
                                                                progress=False)}
    assert rows["ada", "capstone"].passed and rows["ada", "capstone"].points == 2, rows["ada", "capstone"].detail
    assert not rows["bob", "capstone"].passed and "another plan" in rows["bob", "capstone"].reason
    assert rows["ada", "capstone-analysis"].points == 0
    assert "to be scored by your instructor (3 points" in rows["ada", "capstone-analysis"].reason
    assert rows["bob", "capstone-analysis"].reason.startswith("no analysis written")
    analyses = (out.parent / "capstone-analyses.md").read_text(encoding="utf-8")
    assert "> " + analysis in analyses and "Locates the gap" in analyses and "### ada" in analyses
    assert "the course's model for this plan" in analyses  # the automatic verdict beside the text
    assert analysis in (out.parent / "feedback" / "ada.md").read_text(encoding="utf-8")
    similar = (out.parent / "similarity.csv").read_text(encoding="utf-8")
    assert "18_capstone,capstone,ada,bob,1.000" in similar and "the same run" in similar  # one run, two hand-ins
    # the instructor scores it: an override enters the summary
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("student,check,points,reason\nada,capstone-analysis,2,rubric: 1 + 1 + 0\n")
    scored = gradebook.summarize(list(rows.values()), out, overrides=overrides)
    again = {(r.student, r.exercise): r for r in gradebook.read_gradebook(scored["gradebook"])}
    assert again["ada", "capstone-analysis"].points == 2
    assert "rubric: 1 + 1 + 0" in again["ada", "capstone-analysis"].override
    assert train3d  # the plan's module, imported by the hand-in's check
