"""Lesson 10's exercise, open-ended: design a schedule under a memory cap that reaches a bubble
(lessons/10_schedule_search.ipynb). Any schedule passes, by hand or by a search of your own, if it
validates, stays under the cap, reaches the bubble and equals one process on real ranks.

    def my_schedule(p, m, cap):        # per rank r (stage r), its ordered actions
        return [["0F0", "0F1", ..., "0I0", "0W0", ...], ["1F0", ...], ...]

    check_schedule_design(my_schedule)
    # schedule p=4, m=8, cap 3: PASSED: valid; peak per rank [3, 3, 2.94, 2.88] <= 3; bubble 25.0% <= 25.0% ...

The answer runs on a rank of its own, which returns only plain lists of action strings, one per
case; the checking process turns them into a ``actions.Schedule`` and judges each case
(``CASES``: p, m, the cap, the bubble to reach) as the library's search judges its candidates
(``pipeline.search.problem.evaluate``):

1. it validates (``pipeline.validate``): every action once, dependencies in order, no deadlock;
2. counted until W as the simulator counts (F holds M_B; I frees M_B − M_W, W the last M_W, with
   M_W / M_B = 32/34; a full backward B frees all), no rank holds more than the cap, in
   micro-batches of its stage;
3. simulated with F = I = W = 1 (B = 2) and free links, its bubble, the idle share of the device
   time of one step, is at most the case's target;
4. on p real ranks (``pipeline.run.run_pipeline``, the library's executor) the loss and every
   gradient equal the single-process model's to 1e-10 in fp64, and the measured stash is the
   simulated one.

A case passes when all four hold, and ``judge_cases`` counts the cases passed (partial credit). The
answer may not import the library, its search included (``policy``): the skill is designing the
order. Every verdict line is deterministic (no timings), so nbval compares it.
"""

from __future__ import annotations

from parallel_lab.exercises.check import Exercise, Verdict, compile_answer, failure, register, run_answer
from parallel_lab.exercises.one_f_one_b import on_real_ranks, plain_orders, validated_order
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.search.problem import evaluate, make_problem

# (p, m, cap, bubble at most): ZB-H1's memory and bubble; below 1F1B's memory (1F1B does not fit);
# half of it. Each target is what a search reaches there with F = I = W = 1 (tests hold it).
CASES = ((4, 8, 4, 0.112), (4, 8, 3, 0.25), (4, 8, 2, 0.415))
EXACT = 1e-10  # fp64 pipeline vs one process: the same operations in the same order per micro-batch
RUN_TIMEOUT = 60.0
POLICY = Policy("my_schedule", imports=("math", "itertools", "heapq", "collections", "functools"), dist=())
LABEL = _l("schedule p={p}, m={m}, cap {cap}")


# ----------------------------------------------------------------------------------------------
# On a rank: the answer's schedules, as plain data.


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: ``fn(p, m, cap)`` for each case, as ``{"ranks": [...]}`` of plain actions, or
    ``{"error": ...}`` when the answer raised."""
    return plain_orders(compile_answer(source, name), [(p, m, cap) for p, m, cap, _target in cases],
                        error=lambda err: f"{type(err).__name__}: {err}")


# ----------------------------------------------------------------------------------------------
# In the checking process.


def _numbers(values) -> str:
    return "[" + ", ".join(f"{round(v, 3):g}" for v in values) + "]"


def design_case(answer: dict, p: int, m: int, cap: float, target: float, name: str = POLICY.name,
                show_grid: bool = True) -> tuple[bool, list[str]]:
    """Judge the answer's schedule for one case (the four conditions of the module doc, in order);
    ``(passed, lines)``."""
    label = LABEL.format(p=p, m=m, cap=f"{cap:g}")
    schedule, failed = validated_order(answer, p, m, name, label, show_grid, raised=lambda error: failure(_(
        "{label}: FAILED: {name}({p}, {m}, {cap}) raised {error}").format(
            label=label, name=name, p=p, m=m, cap=f"{cap:g}", error=error)))
    if failed:
        return False, failed
    judged = evaluate(make_problem(p, m, cap), schedule, check=False)
    over = [r for r, held in enumerate(judged.peaks) if held > cap + 1e-9]
    if over:
        r = over[0]
        return False, [failure(_("{label}: FAILED: rank {rank} holds up to {held:g} micro-batches of activations at "
                                 "once, over the cap {cap:g} (counted until W: an I frees M_B − M_W, its W the rest); "
                                 "peak per rank {peaks}: start fewer forwards before their backward, or run a pending "
                                 "W before the next F").format(
            label=label, rank=r, held=round(judged.peaks[r], 3), cap=cap, peaks=_numbers(judged.peaks)))]
    bubble = judged.steady_bubble(synchronised=True)
    idle = [judged.makespan - busy for busy in judged.busy]
    if bubble > target + 1e-9:
        return False, [failure(_("{label}: FAILED: bubble {bubble:.1%} with F = I = W = 1, the target is at most "
                                 "{target:.1%} (step {step:g}, idle per rank {idle}); let no rank wait while it could "
                                 "run a forward the cap allows, an input gradient that has arrived, or a pending "
                                 "W").format(
            label=label, bubble=bubble, target=target, step=judged.makespan, idle=_numbers(idle)))]
    shape = _("valid; peak per rank {peaks} <= {cap:g}; bubble {bubble:.1%} <= {target:.1%}").format(
        peaks=_numbers(judged.peaks), cap=cap, bubble=bubble, target=target)
    result, failed = on_real_ranks(schedule, label, p, timeout=RUN_TIMEOUT)
    if failed:
        return False, failed
    return True, [_("{label}: PASSED: {shape}; on {p} real ranks: loss and gradients equal the single-process model, "
                    "measured stash as simulated").format(label=label, shape=shape, p=p)]


def judge_cases(source: str, cases=CASES) -> tuple[bool, list, tuple[int, int]]:
    """The answer run once on an untrusted rank for every case, then each case judged here:
    ``(passed, lines, (cases passed, cases tried))``. Only the first invalid case shows its grid."""
    answers = run_answer(harness, source, POLICY.name, 1, str(EXERCISE.label), args=(cases,))
    if isinstance(answers, str):
        return False, [answers], (0, len(cases))
    lines, good, grid_shown = [], 0, False
    for (p, m, cap, target), answer in zip(cases, answers[0]):
        ok, case_lines = design_case(answer, p, m, cap, target, show_grid=not grid_shown)
        grid_shown |= len(case_lines) > 1
        good += ok
        lines += case_lines
    return good == len(cases), lines, (good, len(cases))


def judge(source: str) -> tuple[bool, list]:
    """The verdict's ``(passed, lines)``; ``judge_cases`` also counts the cases passed."""
    passed, lines, _ = judge_cases(source)
    return passed, lines


EXERCISE = register(Exercise(
    "schedule-design", _l("Your schedule"), POLICY, judge_cases,
    forbids="the library (its search and its schedules): design the order yourself"))


def check_schedule_design(fn) -> Verdict:
    """Lesson 10's exercise: ``fn(p, m, cap)`` returns, per rank, the ordered actions of a schedule
    (strings such as ``"1F3"``, ``"1I3"``, ``"1W3"`` or ``"1B3"``) that stays under ``cap`` and reaches
    the case's bubble. One line per case of ``CASES``; the grid of the first invalid case is shown
    with its offending action marked. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
