"""Lesson 03's exercise: write a pipeline schedule by hand, for 3 ranks and 2 micro-batches, that the
validator accepts (lessons/03_pipeline_bubble.ipynb).

    def my_schedule():                 # per rank r (stage r), its ordered actions
        return [["0F0", "0F1", "0B0", "0B1"], ["1F0", ...], ["2F0", ...]]

    check_hand_schedule(my_schedule)
    # hand schedule p=3, m=2: PASSED: valid; step 12 time units (F=1, B=2), bubble 50.0%; on 3 real ranks ...

The answer is data. It runs on a rank of its own, which returns only plain lists of action strings;
the checking process turns them into an ``actions.Schedule`` (``pipeline.actions.as_schedule``) and

1. validates it (``pipeline.validate``): every (stage, micro-batch) has one F and one B on the rank
   that holds its stage, no action comes before its input on its own rank, and the lists cannot
   deadlock with blocking receives; a refused schedule fails with the validator's message and the
   grid, the first offending action marked ``>1B0<``, before any process starts;
2. simulates it (F = 1, B = 2, free links) for the step and the bubble the verdict reports;
3. runs it on 3 real ranks (``pipeline.run.run_pipeline``, the library's executor) and compares the
   loss and every gradient with one process (fp64, 1e-10).

Any order that passes all three is an answer: the skill is the invariants, not one order. The answer
may import nothing (``POLICY``). Every verdict line is deterministic (no timings), so nbval compares it.
"""

from __future__ import annotations

from parallel_lab.exercises.check import Exercise, Verdict, answer_error, compile_answer, failure, register, run_answer
from parallel_lab.exercises.one_f_one_b import _plain_rank, on_real_ranks, validated_order
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.simulate import Costs, simulate

P, M = 3, 2  # three stages, the batch cut into two micro-batches: enough to order wrongly
EXACT = 1e-10  # fp64 pipeline vs one process: the same operations in the same order per micro-batch
RUN_TIMEOUT = 60.0
POLICY = Policy("my_schedule", imports=(), dist=())
LABEL = _l("hand schedule p={p}, m={m}")


def harness(source: str, name: str) -> dict:
    """On a rank: ``fn()`` as ``{"ranks": [...]}`` of plain actions, or ``{"error": ...}`` when the
    answer raised."""
    fn = compile_answer(source, name)
    try:
        ranks = fn()
        if isinstance(ranks, dict):
            ranks = [ranks[key] for key in sorted(ranks)]
        if isinstance(ranks, str) or not isinstance(ranks, (list, tuple)):
            return {"ranks": ranks if isinstance(ranks, str) else repr(ranks)}
        return {"ranks": [_plain_rank(entry) for entry in ranks]}
    except Exception as err:  # the answer's own error
        return {"error": answer_error(err)}


def hand_case(answer: dict, p: int = P, m: int = M, name: str = POLICY.name) -> tuple[bool, list[str]]:
    """Judge the answer's schedule (the three steps of the module doc, in order): ``(passed, lines)``."""
    label = LABEL.format(p=p, m=m)
    schedule, failed = validated_order(answer, p, m, name, label, True, raised=lambda error: failure(_(
        "{label}: FAILED: {name}() raised {error}").format(label=label, name=name, error=error)))
    if failed:
        return False, failed
    timeline = simulate(schedule, Costs(F=1, B=2))
    shape = _("valid; step {step:g} time units (F = 1, B = 2), bubble {bubble:.1%}").format(
        step=timeline.makespan, bubble=timeline.bubble_fraction)
    result, failed = on_real_ranks(schedule, label, p, stash=None, timeout=RUN_TIMEOUT)
    if failed:
        return False, failed
    return True, [_("{label}: PASSED: {shape}; on {p} real ranks: loss and gradients equal the single-process "
                    "model").format(label=label, shape=shape, p=p)]


def judge(source: str) -> tuple[bool, list]:
    """The answer run once on an untrusted rank, then judged here."""
    answers = run_answer(harness, source, POLICY.name, 1, str(EXERCISE.label))
    if isinstance(answers, str):
        return False, [answers]
    return hand_case(answers[0])


EXERCISE = register(Exercise(
    "hand-schedule", _l("Hand schedule"), POLICY, judge,
    forbids="the library: write the lists yourself"))


def check_hand_schedule(fn) -> Verdict:
    """Lesson 03's exercise: ``fn()`` returns, per rank of 3, the ordered actions of a schedule for 2
    micro-batches (strings such as ``"1F0"`` and ``"1B0"``) that the validator accepts. Prints and
    returns the verdict."""
    return EXERCISE.check_object(fn)
