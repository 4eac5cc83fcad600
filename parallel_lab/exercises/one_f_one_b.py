"""Lesson 05's exercise: write the 1F1B schedule yourself; it is checked as data, by the simulator,
and on real ranks (lessons/05_1f1b_memory.ipynb).

    def my_one_f_one_b(p, m):          # per rank, the ordered actions of 1F1B
        return [["0F0", "0F1", ...], ["1F0", ...], ...]

    check_one_f_one_b(my_one_f_one_b)
    # 1F1B p=2, m=3: PASSED: valid; stash per stage [2, 1] = min(m, p−r); bubble 25.0% as 1F1B; ...

A schedule is data, so unlike lesson 01's exercise (whose *code* runs on the ranks, see
``parallel_lab.exercises``) the student's function runs here, in the notebook's process: what it
returns is turned into a ``schedules.Schedule``, validated before any process starts, simulated, and
only then sent to the ranks, which run exactly that schedule (``pipeline.run.run_pipeline``). Every
verdict line is deterministic (no timings), so nbval can grade it. Plain lists become a Schedule with
``pipeline.schedules.as_schedule``.
"""

from __future__ import annotations

from parallel_lab.exercises.check import Verdict, source_of
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.pipeline.schedules import ScheduleError, as_schedule, one_f_one_b
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import launcher

# (p, m): more micro-batches than stages, fewer than stages (a short steady state), on 2 and 4 ranks
CASES = ((2, 3), (4, 8), (4, 2))
EXACT = 1e-10  # fp64 pipeline vs one process: the same operations in the same order per micro-batch
RUN_TIMEOUT = 60.0


# ----------------------------------------------------------------------------------------------
# The check.


def _indent(text: str) -> list[str]:
    return ["    " + line for line in text.splitlines()]


def one_f_one_b_case(fn, p: int, m: int, name: str, show_grid: bool = True) -> tuple[bool, list[str]]:
    """Check ``fn(p, m)`` against 1F1B; ``(passed, lines)``. In order: it returns readable actions;
    they validate; simulated (F=1, B=2, free links) no stage stashes more than min(m, p−r)
    micro-batches and the step is as short as 1F1B's; on p real ranks the gradients equal the
    single-process model's and the measured stash peaks equal the simulated ones."""
    label = f"1F1B p={p}, m={m}"
    try:
        sched = validate(as_schedule(fn(p, m), p, m, name))
    except ScheduleError as err:
        first, *grid = str(err).splitlines()
        return False, [f"{label}: FAILED: {first}"] + (_indent("\n".join(grid)) if show_grid else [])
    except Exception as err:  # the student's function itself failed
        return False, [f"{label}: FAILED: {name}({p}, {m}) raised {type(err).__name__}: {err}"]

    costs = Costs(F=1.0, B=2.0)
    mine, ref = simulate(sched, costs), simulate(one_f_one_b(p, m), costs)
    limit = [min(m, p - r) for r in range(p)]
    over = [r for r in range(p) if mine.peak_activations[r] > limit[r]]
    if over:
        r = over[0]
        shape = " (GPipe's shape: all forwards before any backward)" if mine.peak_activations == [m] * p else ""
        return False, [f"{label}: FAILED: stage {r} stashes up to {mine.peak_activations[r]} micro-batches at "
                       f"once, 1F1B at most min(m, p−r) = {limit[r]}{shape}; start each backward as soon as "
                       f"its gradient can arrive (stash per stage {mine.peak_activations}, 1F1B {limit})"]
    if mine.makespan > ref.makespan + 1e-9:
        return False, [f"{label}: FAILED: the step takes {mine.makespan:g} time units (F=1, B=2), 1F1B takes "
                       f"{ref.makespan:g}: bubble {mine.bubble_fraction:.1%} instead of {ref.bubble_fraction:.1%}; "
                       f"run the p−r−1 warm-up forwards first, then alternate"]
    shape = f"valid; stash per stage {mine.peak_activations} = min(m, p−r); bubble {mine.bubble_fraction:.1%} as 1F1B"

    try:
        result = run_pipeline(sched, timeout=RUN_TIMEOUT)
    except (launcher.RankError, launcher.RanksHung, launcher.RankDied) as err:
        return False, [f"{label}: FAILED on {p} real ranks: {str(err).splitlines()[0]}"]
    equal = result["max_grad_diff"] < EXACT and result["loss_diff"] < EXACT
    peaks_ok = result["peak_activations"] == mine.peak_activations
    if not equal:
        worst = max(result["grad_diffs"], key=result["grad_diffs"].get)
        return False, [f"{label}: FAILED on {p} real ranks: gradients differ from the single-process model "
                       f"(first at parameter {worst})"]
    if not peaks_ok:
        return False, [f"{label}: FAILED on {p} real ranks: measured stash {result['peak_activations']}, "
                       f"simulated {mine.peak_activations}"]
    return True, [f"{label}: PASSED: {shape}; on {p} real ranks: gradients equal the single-process model, "
                  f"measured stash {result['peak_activations']}"]


def check_one_f_one_b(fn, cases=CASES) -> Verdict:
    """Lesson 05's exercise: ``fn(p, m)`` returns, per rank, 1F1B's ordered actions (see
    ``as_schedule`` for the accepted forms). One line per ``(p, m)`` case; the grid of the first
    invalid case is shown with its offending action marked ``>1B3<``. Prints and returns the verdict."""
    _, name = source_of(fn)  # a function defined with `def` (its name labels the schedule)
    lines, passed, grid_shown = [], True, False
    for p, m in cases:
        ok, case_lines = one_f_one_b_case(fn, p, m, name, show_grid=not grid_shown)
        grid_shown |= len(case_lines) > 1
        passed &= ok
        lines += case_lines
    verdict = Verdict(passed, lines)
    print(verdict)
    return verdict
