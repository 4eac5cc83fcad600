"""Lesson 05's exercise: write the 1F1B schedule yourself; it is checked as data, by the simulator,
and on real ranks (lessons/05_1f1b_memory.ipynb).

    def my_one_f_one_b(p, m):          # per rank, the ordered actions of 1F1B
        return [["0F0", "0F1", ...], ["1F0", ...], ...]

    check_one_f_one_b(my_one_f_one_b)
    # 1F1B p=2, m=3: PASSED: valid; stash per stage [2, 1] = min(m, p−r); bubble 25.0% as 1F1B; ...

A schedule is data. The answer runs on a rank of its own, which returns only what it computed, plain
lists of action strings, one per case; the checking process turns them into an
``actions.Schedule`` (``pipeline.actions.as_schedule``), validates and simulates it, and only then
runs it on fresh ranks with the library's executor (``pipeline.run.run_pipeline``), against one
process. The library's own schedules are forbidden in the answer (from the source). Every verdict
line is deterministic (no timings), so nbval compares it.
"""

from __future__ import annotations

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    failure,
    register,
    run_answer,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.actions import ScheduleError, as_schedule
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.pipeline.schedules import one_f_one_b
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import launcher

# (p, m): more micro-batches than stages, fewer than stages (a short steady state), on 2 and 4 ranks
CASES = ((2, 3), (4, 8), (4, 2))
EXACT = 1e-10  # fp64 pipeline vs one process: the same operations in the same order per micro-batch
RUN_TIMEOUT = 60.0
POLICY = Policy("my_one_f_one_b", imports=("math", "itertools"), dist=())


# ----------------------------------------------------------------------------------------------
# On a rank: the answer's schedules, as plain data.


def _plain_action(item):
    if item is None or isinstance(item, str):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return (int(item[0]), str(item[1]), int(item[2]))
    return str(item)


def _plain_rank(entry):
    return entry if isinstance(entry, str) else [_plain_action(item) for item in entry]


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: ``fn(p, m)`` for each case, as ``{"ranks": [...]}`` of strings, tuples and None, or
    ``{"error": ...}`` when the answer raised."""
    return plain_orders(compile_answer(source, name), cases)


def plain_orders(fn, cases, error=answer_error) -> list[dict]:
    """On a rank: ``fn(*case)`` for each case, as ``{"ranks": [...]}`` of plain actions (a dict of
    ranks taken in rank order), or ``{"error": error(exception)}`` when the answer raised (a
    NotImplementedError too: the stub never runs, ``check.is_stub``). The schedule-order exercises'
    harnesses all read so."""
    out = []
    for case in cases:
        try:
            ranks = fn(*case)
            if isinstance(ranks, dict):
                ranks = [ranks[key] for key in sorted(ranks)]
            out.append({"ranks": [_plain_rank(entry) for entry in ranks]})
        except Exception as err:  # the answer's own error: reported per case
            out.append({"error": error(err)})
    return out


# ----------------------------------------------------------------------------------------------
# In the checking process.


def _indent(text: str) -> list[str]:
    return ["    " + line for line in text.splitlines()]


def validated_order(answer: dict, p: int, m: int, name: str, label: str, show_grid: bool, raised=None) -> tuple:
    """The answer's order for one case as a validated Schedule: ``(schedule, None)``, or ``(None,
    FAILED lines)`` when it raised or does not validate (with the grid, marked, if ``show_grid``).
    ``raised(error)`` is the line for an answer that raised (by default ``name(p, m) raised ...``).
    Every schedule-order exercise (1F1B, ZB-H1, the hand schedule, the
    designed schedule) reads its answer so."""
    if "error" in answer:
        if raised is not None:
            return None, [raised(answer["error"])]
        return None, [failure(_("{label}: FAILED: {name}({p}, {m}) raised {error}").format(
            label=label, name=name, p=p, m=m, error=answer["error"]))]
    try:
        return validate(as_schedule(answer["ranks"], p, m, name)), None
    except ScheduleError as err:
        first, *grid = str(err).splitlines()
        return None, [failure(_("{label}: FAILED: {reason}").format(label=label, reason=first))] + \
            (_indent("\n".join(grid)) if show_grid else [])


def on_real_ranks(schedule, label: str, p: int, stash="simulated", differ=None, timeout: float = RUN_TIMEOUT) -> tuple:
    """Run a schedule-order answer's validated ``schedule`` on ``p`` real ranks (``run_pipeline``, fp64)
    and compare it with the single-process model: ``(result, None)``, or ``(None, FAILED lines)`` when a
    rank failed, the loss or a gradient differs beyond ``EXACT`` (``differ(parameter)`` words that
    line, if given), or the measured stash is not ``stash`` (the run's own simulated peaks for "simulated";
    ``None`` skips that comparison). Shared by every schedule-order exercise."""
    try:
        result = run_pipeline(schedule, timeout=timeout)
    except (launcher.RankError, launcher.RanksHung, launcher.RankDied) as err:
        return None, [failure(_("{label}: FAILED on {p} real ranks: {reason}").format(
            label=label, p=p, reason=str(err).splitlines()[0]))]
    if not (result["max_grad_diff"] < EXACT and result["loss_diff"] < EXACT):
        worst = max(result["grad_diffs"], key=result["grad_diffs"].get)
        if differ is not None:
            return None, [differ(worst)]
        return None, [failure(_("{label}: FAILED on {p} real ranks: the loss or the gradients differ from the "
                                "single-process model (first at parameter {parameter})").format(
            label=label, p=p, parameter=worst))]
    if stash is not None:
        simulated = result["peak_activations_predicted"] if stash == "simulated" else stash
        if result["peak_activations"] != simulated:
            return None, [failure(_("{label}: FAILED on {p} real ranks: measured stash {measured}, simulated "
                                    "{simulated}"
                            ).format(label=label, p=p, measured=result["peak_activations"], simulated=simulated))]
    return result, None


def one_f_one_b_case(answer: dict, p: int, m: int, name: str, show_grid: bool = True) -> tuple[bool, list[str]]:
    """Judge the answer's schedule for one case against 1F1B; ``(passed, lines)``. In order: it is
    readable; it validates; simulated (F=1, B=2, free links) no stage stashes more than min(m, p−r)
    micro-batches and the step is as short as 1F1B's; on p real ranks the gradients equal the
    single-process model's and the measured stash peaks equal the simulated ones."""
    label = _("1F1B p={p}, m={m}").format(p=p, m=m)
    sched, failed = validated_order(answer, p, m, name, label, show_grid)
    if failed:
        return False, failed

    costs = Costs(F=1.0, B=2.0)
    mine, ref = simulate(sched, costs), simulate(one_f_one_b(p, m), costs)
    limit = [min(m, p - r) for r in range(p)]
    over = [r for r in range(p) if mine.peak_activations[r] > limit[r]]
    if over:
        r = over[0]
        shape = _(" (GPipe's shape: all forwards before any backward)") if mine.peak_activations == [m] * p else ""
        return False, [failure(_("{label}: FAILED: stage {stage} stashes up to {held} micro-batches at once, 1F1B at "
                                 "most min(m, p−r) = {limit}{shape}; start each backward as soon as its gradient can "
                                 "arrive (stash per stage {stash}, 1F1B {limits})").format(
            label=label, stage=r, held=mine.peak_activations[r], limit=limit[r], shape=shape,
            stash=mine.peak_activations, limits=limit))]
    if mine.makespan > ref.makespan + 1e-9:
        return False, [failure(_("{label}: FAILED: the step takes {step:g} time units (F=1, B=2), 1F1B takes {ref:g}: "
                         "bubble {bubble:.1%} instead of {ref_bubble:.1%}; run the p−r−1 warm-up forwards first, "
                         "then alternate").format(label=label, step=mine.makespan, ref=ref.makespan,
                                                  bubble=mine.bubble_fraction, ref_bubble=ref.bubble_fraction))]
    shape = _("valid; stash per stage {stash} = min(m, p−r); bubble {bubble:.1%} as 1F1B").format(
        stash=mine.peak_activations, bubble=mine.bubble_fraction)

    result, failed = on_real_ranks(sched, label, p, stash=mine.peak_activations,
                                   differ=lambda worst: failure(_("{label}: FAILED on {p} real ranks: gradients "
                                                                  "differ from the single-process model (first at "
                                                                  "parameter {parameter})"
                                                          ).format(label=label, p=p, parameter=worst)))
    if failed:
        return False, failed
    return True, [_("{label}: PASSED: {shape}; on {p} real ranks: gradients equal the single-process model, "
                    "measured stash {measured}").format(label=label, shape=shape, p=p,
                                                         measured=result["peak_activations"])]


def judge_orders(source: str, name: str, label: str, cases, judge_case):
    """A schedule-order exercise's verdict: the answer ``name`` run on one untrusted rank for every
    ``(p, m)`` of ``cases`` (``harness``), then ``judge_case(answer, p, m, name, show_grid)`` per case;
    only the first case that fails with a grid shows it."""
    answers = run_answer(harness, source, name, 1, label, args=(cases,))
    if isinstance(answers, str):
        return False, [answers], (0, len(cases))
    lines, passed, grid_shown, good = [], True, False, 0
    for (p, m), answer in zip(cases, answers[0]):
        ok, case_lines = judge_case(answer, p, m, name, show_grid=not grid_shown)
        grid_shown |= len(case_lines) > 1
        passed &= ok
        good += ok
        lines += case_lines
    return passed, lines, (good, len(cases))


def judge(source: str):
    return judge_orders(source, POLICY.name, "1F1B", CASES, one_f_one_b_case)


EXERCISE = register(Exercise(
    "one-f-one-b", _l("1F1B"), POLICY, judge,
    forbids="the library's schedules (one_f_one_b, build): write the order yourself",
    copies=("parallel_lab.pipeline.schedules:_one_f_one_b_rank",)))


def check_one_f_one_b(fn) -> Verdict:
    """Lesson 05's exercise: ``fn(p, m)`` returns, per rank, 1F1B's ordered actions (strings such as
    ``"1F3"``, ``(stage, kind, microbatch)`` tuples or None). One line per ``(p, m)`` case; the grid of
    the first invalid case is shown with its offending action marked ``>1B3<``. Prints and returns
    the verdict."""
    return EXERCISE.check_object(fn)
