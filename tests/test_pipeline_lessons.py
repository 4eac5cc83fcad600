"""Lessons 03-05 (pipeline bubble, GPipe, 1F1B): the 1F1B exercise check (parallel_lab.exercises.one_f_one_b),
``as_schedule``, and what the lesson notebooks promise (widgets for the browser test, graded cells).
Only the tests marked ``ranks`` start processes."""

from pathlib import Path

import nbformat
import pytest

from parallel_lab.exercises import one_f_one_b as exercise
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.show import pipeline as figures
from parallel_lab.pipeline.schedules import Action, ScheduleError, build
from parallel_lab.pipeline.validate import validate
from parallel_lab.pipeline.simulate import Costs, simulate

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Student solutions, right and wrong.


def one_f_one_b_correct(p, m):
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        actions = [f"{r}F{j}" for j in range(warmup)]
        for k in range(m - warmup):
            actions += [f"{r}F{warmup + k}", f"{r}B{k}"]
        actions += [f"{r}B{j}" for j in range(m - warmup, m)]
        ranks.append(actions)
    return ranks


def one_f_one_b_as_actions(p, m):
    """The library's own 1F1B, returned as Action objects in a dict: also accepted."""
    return dict(enumerate(build("1f1b", p, m).ranks))


def gpipe_shaped(p, m):
    return [[f"{r}F{j}" for j in range(m)] + [f"{r}B{j}" for j in range(m)] for r in range(p)]


def back_to_back(p, m):
    """Each micro-batch's F and B right after each other: valid, lean, but serial."""
    return [" ".join(f"{r}F{j} {r}B{j}" for j in range(m)) for r in range(p)]


def crossed_waits(p, m):
    """Rank 0 waits for a gradient before it sends micro-batch 1; rank 1 waits for micro-batch 1
    before it sends that gradient: deadlock."""
    ranks = gpipe_shaped(p, m)
    ranks[0] = [a for j in range(m) for a in (f"0F{j}", f"0B{j}")]
    return ranks


def b_before_f(p, m):
    ranks = one_f_one_b_correct(p, m)
    last = ranks[p - 1]
    last[0], last[1] = last[1], last[0]  # "3B0" before "3F0"
    return ranks


def raises(p, m):
    return [[f"{r}F{j}" for j in range(m)] for r in range(q)]  # noqa: F821


# ------------------------------------------------------------------------------------------------
# as_schedule: plain lists in, a Schedule out (validated separately).


def test_as_schedule_accepts_strings_actions_tuples_idle_slots_and_lines():
    s = exercise.as_schedule([["0F0", ".", Action(0, "B", 0)], "1F0 1B0"], p=2, m=1, name="mine")
    assert s.name == "mine" and s.stage_to_rank == (0, 1) and s.virtual == 1
    assert s.ranks == [[Action(0, "F", 0), None, Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    assert validate(s) is s
    t = exercise.as_schedule({1: [(1, "F", 0), (1, "B", 0)], 0: ["0F0", None, "0B0"]}, p=2, m=1)
    assert t.ranks == s.ranks


@pytest.mark.parametrize("ranks,message", [
    ([["0F0", "0B0"]], "returned 1 rank lists for p=2; expected one per rank"),
    ("0F0 0B0", "expected one list of actions per rank, got str"),
    ([["0F0", "0X0"], ["1F0", "1B0"]], "rank 0, position 1: cannot parse action '0X0'"),
    ([["0F0", 3], ["1F0", "1B0"]], "rank 0, position 1: expected an action like '0F1' (a string) or an Action, got int 3"),
    ([["0F0", "0B0"], 7], "rank 1: expected a list of actions, got int"),
])
def test_as_schedule_names_what_it_cannot_read(ranks, message):
    with pytest.raises(ScheduleError) as err:
        exercise.as_schedule(ranks, p=2, m=1)
    assert message in str(err.value)


# ------------------------------------------------------------------------------------------------
# The check: everything that fails before a process starts.


def test_gpipe_shaped_solution_fails_on_memory_with_a_clear_line(capsys):
    verdict = exercise.check_one_f_one_b(gpipe_shaped)
    assert not verdict.passed
    assert verdict.lines[0] == (
        "1F1B p=2, m=3: FAILED: stage 0 stashes up to 3 micro-batches at once, 1F1B at most min(m, p−r) = 2 "
        "(GPipe's shape: all forwards before any backward); start each backward as soon as its gradient can "
        "arrive (stash per stage [3, 3], 1F1B [2, 1])")
    assert len(verdict.lines) == 3 and all("FAILED" in line for line in verdict.lines)
    assert capsys.readouterr().out == str(verdict) + "\n"


def test_serial_solution_fails_on_the_bubble():
    verdict = exercise.check_one_f_one_b(back_to_back, cases=((4, 8),))
    assert verdict.lines == ["1F1B p=4, m=8: FAILED: the step takes 96 time units (F=1, B=2), 1F1B takes 33: "
                             "bubble 75.0% instead of 27.3%; run the p−r−1 warm-up forwards first, then alternate"]


def test_invalid_solution_fails_pointing_at_the_first_offending_action():
    verdict = exercise.check_one_f_one_b(b_before_f, cases=((2, 3), (4, 2)))
    assert not verdict.passed
    first = verdict.lines[0]
    assert first.startswith("1F1B p=2, m=3: FAILED: b_before_f: rank 1, step 0: 1B0 runs before its input 1F0")
    assert any(">1B0<" in line for line in verdict.lines[1:])  # the grid, with the action marked
    # only the first invalid case shows its grid; the next is one line
    assert verdict.lines[-1].startswith("1F1B p=4, m=2: FAILED: b_before_f: rank 3, step 0: 3B0 runs before")
    assert sum(line.startswith("1F1B") for line in verdict.lines) == 2


def test_deadlocking_solution_is_caught_by_the_validator():
    verdict = exercise.check_one_f_one_b(crossed_waits, cases=((2, 3),))
    assert not verdict.passed
    assert "no rank can progress (deadlock)" in verdict.lines[0] and "rank 0, step 1: 0B0 waits" in verdict.lines[0]


def test_exception_in_the_students_function_is_a_failed_line():
    verdict = exercise.check_one_f_one_b(raises, cases=((2, 3),))
    assert verdict.lines == ["1F1B p=2, m=3: FAILED: raises(2, 3) raised NameError: name 'q' is not defined"]


def test_a_lambda_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="cannot read the source"):
        exercise.check_one_f_one_b(eval("lambda p, m: []"))


# ------------------------------------------------------------------------------------------------
# The check on real ranks.


@pytest.mark.ranks
@pytest.mark.timeout(240)
def test_correct_solution_passes_on_2_and_4_real_ranks(capsys):
    verdict = exercise.check_one_f_one_b(one_f_one_b_correct)
    assert verdict.passed
    assert capsys.readouterr().out == (
        "1F1B p=2, m=3: PASSED: valid; stash per stage [2, 1] = min(m, p−r); bubble 25.0% as 1F1B; "
        "on 2 real ranks: gradients equal the single-process model, measured stash [2, 1]\n"
        "1F1B p=4, m=8: PASSED: valid; stash per stage [4, 3, 2, 1] = min(m, p−r); bubble 27.3% as 1F1B; "
        "on 4 real ranks: gradients equal the single-process model, measured stash [4, 3, 2, 1]\n"
        "1F1B p=4, m=2: PASSED: valid; stash per stage [2, 2, 2, 1] = min(m, p−r); bubble 60.0% as 1F1B; "
        "on 4 real ranks: gradients equal the single-process model, measured stash [2, 2, 2, 1]\n")
    assert exercise.check_one_f_one_b(one_f_one_b_as_actions, cases=((2, 2),)).passed


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_run_pipeline_runs_a_hand_written_schedule():
    sched = exercise.as_schedule(back_to_back(2, 2), p=2, m=2, name="serial")
    result = run_pipeline(sched, batch=8)
    assert result["schedule"] == "serial" and result["max_grad_diff"] < 1e-10 and result["loss_diff"] < 1e-10
    assert result["peak_activations"] == [1, 1] == simulate(sched).peak_activations
    with pytest.raises(ScheduleError, match="runs before its input"):
        run_pipeline(exercise.as_schedule(["0B0 0F0", "1F0 1B0"], p=2, m=1))


# ------------------------------------------------------------------------------------------------
# What the lessons promise.


def _fake_result(name="gpipe", p=2, m=2):
    measured = simulate(build(name, p, m), Costs(F=1.1, B=2.3))
    predicted = simulate(build(name, p, m), Costs(F=1, B=2))

    def timed(t):
        return [[[str(a), s * 1e-3, e * 1e-3] for a, s, e in row] for row in t.ranks]

    return {"schedule": name, "stages": p, "microbatches": m, "bubble_measured": measured.bubble_fraction,
            "bubble_predicted": predicted.bubble_fraction,
            "timeline": {"virtual": timed(measured), "predicted": timed(predicted)}}


def test_compare_labels_measured_and_predicted_in_the_legend():
    """The browser test presses "run on real ranks" and waits for a legend entry with "measured"."""
    fig = figures.compare(_fake_result())
    titles = [t.legendgrouptitle.text for t in fig.data if t.legendgrouptitle.text]
    assert titles == ["measured (filled)", "predicted (outlined)"]
    assert {t.legendgroup for t in fig.data if "predicted" in t.name} == {"predicted (outlined)"}


def _cells(prefix):
    path = next((ROOT / "lessons").glob(f"{prefix}_*.ipynb"))
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_lesson_03_has_the_schedule_panel_in_an_unchecked_cell():
    cells = [c for c in _cells("03") if "schedule_panel(" in c.source]
    assert len(cells) == 1 and "nbval-ignore-output" in cells[0].metadata.get("tags", [])
    panel = figures.schedule_panel("gpipe", ranks=4, microbatches=1)
    assert "bubble 75.0%" in panel.numbers.value  # GPipe with one micro-batch is the naive schedule


def test_lesson_05_stores_the_passing_verdict_of_the_exercise():
    check = next(c for c in _cells("05") if "check:one-f-one-b" in c.metadata.get("tags", []))
    out = "".join(o.get("text", "") for o in check.outputs)
    assert out.count(": PASSED: ") == len(exercise.CASES) and "FAILED" not in out
