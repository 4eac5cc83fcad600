"""Lessons 03-05 (pipeline bubble, GPipe, 1F1B): the 1F1B exercise check (parallel_lab.exercises.one_f_one_b),
``as_schedule``, and what the lesson notebooks promise (widgets for the browser test, graded cells).
Only the tests marked ``ranks`` start processes."""

from pathlib import Path

import nbformat
import pytest

from parallel_lab.exercises import one_f_one_b as exercise
from parallel_lab.pipeline.actions import Action, ScheduleError, as_schedule
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.show import pipeline as figures

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Student solutions, right and wrong (answer cells, as the grader reads them).

CORRECT = """def my_one_f_one_b(p, m):
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        actions = [f"{r}F{j}" for j in range(warmup)]
        for k in range(m - warmup):
            actions += [f"{r}F{warmup + k}", f"{r}B{k}"]
        actions += [f"{r}B{j}" for j in range(m - warmup, m)]
        ranks.append(actions)
    return ranks
"""

# The same order written differently: (stage, kind, micro-batch) tuples in a dict, built by
# walking the steady state with two counters.
AS_TUPLES = """def my_one_f_one_b(p, m):
    out = {}
    for r in range(p):
        f = b = 0
        order = []
        while f < min(p - r - 1, m):
            order.append((r, "F", f))
            f += 1
        while b < m:
            if f < m:
                order.append((r, "F", f))
                f += 1
            order.append((r, "B", b))
            b += 1
        out[r] = order
    return out
"""

GPIPE_SHAPED = """def my_one_f_one_b(p, m):
    return [[f"{r}F{j}" for j in range(m)] + [f"{r}B{j}" for j in range(m)] for r in range(p)]
"""

BACK_TO_BACK = """def my_one_f_one_b(p, m):
    return [" ".join(f"{r}F{j} {r}B{j}" for j in range(m)) for r in range(p)]
"""

CROSSED_WAITS = GPIPE_SHAPED.replace("def my_one_f_one_b", "def gpipe_shaped") + """

def my_one_f_one_b(p, m):
    ranks = gpipe_shaped(p, m)
    ranks[0] = [a for j in range(m) for a in (f"0F{j}", f"0B{j}")]
    return ranks
"""

B_BEFORE_F = CORRECT.replace("def my_one_f_one_b", "def correct") + """

def my_one_f_one_b(p, m):
    ranks = correct(p, m)
    last = ranks[p - 1]
    last[0], last[1] = last[1], last[0]
    return ranks
"""

RAISES = """def my_one_f_one_b(p, m):
    return [[f"{r}F{j}" for j in range(m)] for r in range(q)]
"""


def back_to_back(p, m):
    """Each micro-batch's F and B right after each other: valid, lean, but serial."""
    return [" ".join(f"{r}F{j} {r}B{j}" for j in range(m)) for r in range(p)]


# ------------------------------------------------------------------------------------------------
# as_schedule: plain lists in, a Schedule out (validated separately).


def test_as_schedule_accepts_strings_actions_tuples_idle_slots_and_lines():
    s = as_schedule([["0F0", ".", Action(0, "B", 0)], "1F0 1B0"], p=2, m=1, name="mine")
    assert s.name == "mine" and s.stage_to_rank == (0, 1) and s.virtual == 1
    assert s.ranks == [[Action(0, "F", 0), None, Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    assert validate(s) is s
    t = as_schedule({1: [(1, "F", 0), (1, "B", 0)], 0: ["0F0", None, "0B0"]}, p=2, m=1)
    assert t.ranks == s.ranks


@pytest.mark.parametrize("ranks,message", [
    ([["0F0", "0B0"]], "returned 1 rank lists for p=2; expected one per rank"),
    ("0F0 0B0", "expected one list of actions per rank, got str"),
    ([["0F0", "0X0"], ["1F0", "1B0"]], "rank 0, position 1: cannot parse action '0X0'"),
    ([["0F0", 3], ["1F0", "1B0"]],
     "rank 0, position 1: expected an action like '0F1' (a string) or an Action, got int 3"),
    ([["0F0", "0B0"], 7], "rank 1: expected a list of actions, got int"),
])
def test_as_schedule_names_what_it_cannot_read(ranks, message):
    with pytest.raises(ScheduleError) as err:
        as_schedule(ranks, p=2, m=1)
    assert message in str(err.value)


# ------------------------------------------------------------------------------------------------
# The check: the answer runs on a rank of its own; its schedules are judged here.

ONE = exercise.EXERCISE


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_gpipe_shaped_solution_fails_on_memory_with_a_clear_line():
    verdict = ONE.check(GPIPE_SHAPED)
    assert not verdict.passed
    assert verdict.lines[0] == (
        "1F1B p=2, m=3: FAILED: stage 0 stashes up to 3 micro-batches at once, 1F1B at most min(m, p−r) = 2 "
        "(GPipe's shape: all forwards before any backward); start each backward as soon as its gradient can "
        "arrive (stash per stage [3, 3], 1F1B [2, 1])")
    assert len(verdict.lines) == 3 and all("FAILED" in line for line in verdict.lines)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_serial_solution_fails_on_the_bubble():
    verdict = ONE.check(BACK_TO_BACK)
    assert verdict.lines[1] == ("1F1B p=4, m=8: FAILED: the step takes 96 time units (F=1, B=2), 1F1B takes 33: "
                                "bubble 75.0% instead of 27.3%; run the p−r−1 warm-up forwards first, then alternate")


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_invalid_and_deadlocking_solutions_fail_pointing_at_the_first_offending_action():
    verdict = ONE.check(B_BEFORE_F)
    assert not verdict.passed
    assert verdict.lines[0].startswith("1F1B p=2, m=3: FAILED: my_one_f_one_b: rank 1, step 0: 1B0 runs before "
                                       "its input 1F0")
    assert any(">1B0<" in line for line in verdict.lines[1:])  # the grid, with the action marked
    # only the first invalid case shows its grid; the next ones are one line each
    assert verdict.lines[-1].startswith("1F1B p=4, m=2: FAILED: my_one_f_one_b: rank 3, step 0: 3B0 runs before")
    assert sum(line.startswith("1F1B") for line in verdict.lines) == 3
    deadlock = ONE.check(CROSSED_WAITS)
    assert "no rank can progress (deadlock)" in deadlock.lines[0] and "rank 0, step 1: 0B0 waits" in deadlock.lines[0]


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_exception_in_the_answer_is_a_failed_line_per_case():
    verdict = ONE.check(RAISES)
    assert verdict.lines[0].splitlines()[0] == \
        "1F1B p=2, m=3: FAILED: my_one_f_one_b(2, 3) raised NameError: name 'q' is not defined"
    assert verdict.lines[0].splitlines()[1].startswith("  your answer, line ")


def test_the_library_schedules_are_not_an_answer():
    library = "from parallel_lab.pipeline.schedules import build\n\ndef my_one_f_one_b(p, m):\n" \
              "    return build('1f1b', p, m).ranks\n"
    assert "imports parallel_lab.pipeline.schedules: the library's own implementation is not an answer" in \
        ONE.check(library).lines[0]


# ------------------------------------------------------------------------------------------------
# The check on real ranks.


@pytest.mark.ranks
@pytest.mark.timeout(240)
def test_correct_solutions_pass_on_2_and_4_real_ranks():
    verdict = ONE.check(CORRECT)
    assert verdict.passed
    assert str(verdict) == (
        "1F1B p=2, m=3: PASSED: valid; stash per stage [2, 1] = min(m, p−r); bubble 25.0% as 1F1B; "
        "on 2 real ranks: gradients equal the single-process model, measured stash [2, 1]\n"
        "1F1B p=4, m=8: PASSED: valid; stash per stage [4, 3, 2, 1] = min(m, p−r); bubble 27.3% as 1F1B; "
        "on 4 real ranks: gradients equal the single-process model, measured stash [4, 3, 2, 1]\n"
        "1F1B p=4, m=2: PASSED: valid; stash per stage [2, 2, 2, 1] = min(m, p−r); bubble 60.0% as 1F1B; "
        "on 4 real ranks: gradients equal the single-process model, measured stash [2, 2, 2, 1]")
    assert ONE.check(AS_TUPLES).passed


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_run_pipeline_runs_a_hand_written_schedule():
    sched = as_schedule(back_to_back(2, 2), p=2, m=2, name="serial")
    result = run_pipeline(sched, batch=8)
    assert result["schedule"] == "serial" and result["max_grad_diff"] < 1e-10 and result["loss_diff"] < 1e-10
    assert result["peak_activations"] == [1, 1] == simulate(sched).peak_activations
    with pytest.raises(ScheduleError, match="runs before its input"):
        run_pipeline(as_schedule(["0B0 0F0", "1F0 1B0"], p=2, m=1))


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


def test_lesson_05_stores_the_not_yet_verdict_of_the_exercise():
    """The student edition: the answer cell is the stub, and its check shows "not yet"."""
    check = next(c for c in _cells("05") if "check:one-f-one-b" in c.metadata.get("tags", []))
    out = "".join(o.get("text", "") for o in check.outputs)
    assert out.startswith("1F1B: NOT YET: my_one_f_one_b still raises NotImplementedError") and "PASSED" not in out
