"""Lesson 07's exercise: write the ZB-H1 order yourself (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism"); it is checked as data, by the simulator, and on real ranks
(lessons/07_zero_bubble.ipynb). The sibling of lesson 05's ``one_f_one_b``.

    def my_zb_h1(p, m):                # per rank, the ordered F, I and W actions of ZB-H1
        return [["0F0", "0F1", ..., "0I0", "0W0", ...], ["1F0", ...], ...]

    check_zb_h1_order(my_zb_h1)
    # ZB-H1 p=2, m=4: PASSED: valid, every backward split into I and W; idle per rank [1, 1] ...

The answer runs on a rank of its own, which returns only plain lists of action strings, one per
case; the checking process turns them into a ``actions.Schedule`` (``as_schedule``) and judges
them against the library's ``schedules.zb_h1``, computed here:

1. it validates (``pipeline.validate``), and splits every backward: I and W, never B;
2. simulated with F = I = W = 1 and free links, no rank idles longer than in ZB-H1 (1F1B's order
   with each W right after its I idles (p−1)(F+B) = 3(p−1), ZB-H1 (p−1)(F+I−W) = p−1 once m >= p);
3. counted until W as ``simulate.Timeline`` does (an I frees M_B − M_W, its W the last M_W), no stage
   holds more activations than in ZB-H1 (so deferring every W to the end, or running extra warm-up
   forwards, fails: they hold more);
4. on p real ranks (``pipeline.run.run_pipeline`` with the library's executor) the loss and every
   gradient equal the single-process model's to 1e-10 in fp64, and the measured stash is the
   simulated one.

Any order that meets all four passes. The library's schedules are forbidden in the answer (from
the source). Every verdict line is deterministic (no timings), so nbval compares it.
"""

from __future__ import annotations

from parallel_lab.exercises.check import Exercise, Verdict, failure, register
from parallel_lab.exercises.one_f_one_b import judge_orders, on_real_ranks, validated_order
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.schedules import Action, Schedule, one_f_one_b, zb_h1
from parallel_lab.pipeline.simulate import Costs, simulate

# (p, m): a full pipeline on 2 and 4 ranks, and fewer micro-batches than stages (no steady state)
CASES = ((2, 4), (4, 8), (4, 3))
EXACT = 1e-10  # fp64 pipeline vs one process: the same operations in the same order per micro-batch
RUN_TIMEOUT = 60.0
SPLIT = Costs(F=1.0, B=2.0, I=1.0, W=1.0)  # F = I = W, the paper's comparison
FULL = Costs(F=1.0, B=2.0)  # 1F1B's backward B = I + W
POLICY = Policy("my_zb_h1", imports=("math", "itertools"), dist=())


# ----------------------------------------------------------------------------------------------
# In the checking process.


def _numbers(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def one_f_one_b_split(p: int, m: int) -> Schedule:
    """1F1B's order with every backward B split into I then, right after it, W: the split alone,
    with no W deferred (what ZB-H1 improves on)."""
    rows = [[a2 for a in actions for a2 in ((Action(a.stage, "I", a.microbatch), Action(a.stage, "W", a.microbatch))
                                            if a.kind == "B" else (a,))] for actions in one_f_one_b(p, m).ranks]
    return Schedule("1f1b split", p, m, 1, tuple(range(p)), rows)


def _idle(timeline) -> list[float]:
    return [round(timeline.makespan - busy, 9) for busy in timeline.busy]


def _order_counts(schedule: Schedule) -> list[dict]:
    """Per rank, read from its order alone: ``ahead`` the most forwards whose I has not run yet,
    ``waiting`` the most micro-batches whose I ran and W has not, ``after`` the W's after its last I."""
    out = []
    for actions in schedule.ranks:
        done = [a for a in actions if a is not None]
        ahead = waiting = most_ahead = most_waiting = 0
        for a in done:
            if a.kind == "F":
                ahead += 1
            elif a.kind == "I":
                ahead, waiting = ahead - 1, waiting + 1
            elif a.kind == "W":
                waiting -= 1
            most_ahead, most_waiting = max(most_ahead, ahead), max(most_waiting, waiting)
        last_i = max((k for k, a in enumerate(done) if a.kind == "I"), default=-1)
        out.append({"ahead": most_ahead, "waiting": most_waiting,
                    "after": sum(1 for a in done[last_i + 1:] if a.kind == "W")})
    return out


def _bubble_hint(mine: Schedule, ref: Schedule) -> str:
    """What in the answer's order makes its step longer than ZB-H1's."""
    got, want = _order_counts(mine), _order_counts(ref)
    for r, (g, w) in enumerate(zip(got, want)):
        if g["after"] < w["after"]:
            return _("W passes not deferred to fill the cool-down: rank {rank} runs {got} W after its last I, "
                     "ZB-H1 {want} (rank r holds back its first r W's)").format(rank=r, got=g["after"], want=w["after"])
    for r, (g, w) in enumerate(zip(got, want)):
        if g["after"] > w["after"]:
            return _("W passes deferred too long: rank {rank} runs {got} W after its last I, ZB-H1 {want}; its W's "
                     "then run after the last gradient arrives instead of in the gaps (rank r holds back only its "
                     "first r W's)").format(rank=r, got=g["after"], want=w["after"])
    for r, (g, w) in enumerate(zip(got, want)):
        if g["ahead"] < w["ahead"]:
            return _("rank {rank} runs at most {got} forwards ahead of their I, ZB-H1 (as 1F1B) min(m, p−r) = "
                     "{want}: run the p−r−1 warm-up forwards first").format(rank=r, got=g["ahead"], want=w["ahead"])
    return _("keep 1F1B's order of F and I, and let rank r run the W of micro-batch k after its I of k + r")


def _memory_hint(mine: Schedule, ref: Schedule) -> str:
    """What in the answer's order holds more activations than ZB-H1."""
    got, want = _order_counts(mine), _order_counts(ref)
    for r, (g, w) in enumerate(zip(got, want)):
        if g["waiting"] > w["waiting"]:
            return _("rank {rank} keeps up to {got} micro-batches waiting for their W, ZB-H1 at most {want}: rank r "
                     "holds back only its first r W's").format(rank=r, got=g["waiting"], want=w["waiting"])
    for r, (g, w) in enumerate(zip(got, want)):
        if g["ahead"] > w["ahead"]:
            return _("rank {rank} runs up to {got} forwards ahead of their I, ZB-H1 (as 1F1B) at most min(m, p−r) = "
                     "{want}: p−r−1 warm-up forwards, not more").format(rank=r, got=g["ahead"], want=w["ahead"])
    return _("run each I as soon as its gradient can arrive, and each W r I's after its own on rank r")


def zb_h1_case(answer: dict, p: int, m: int, name: str, show_grid: bool = True) -> tuple[bool, list[str]]:
    """Judge the answer's schedule for one case against ``schedules.zb_h1(p, m)``; ``(passed, lines)``
    (see the module doc for the four conditions, checked in that order)."""
    label = _("ZB-H1 p={p}, m={m}").format(p=p, m=m)
    sched, failed = validated_order(answer, p, m, name, label, show_grid)
    if failed:
        return False, failed
    full = next(((r, a) for r, _step, a in sched.actions() if a.kind == "B"), None)
    if full is not None:
        r, a = full
        return False, [failure(_("{label}: FAILED: rank {rank} runs the full backward {action}: ZB-H1 splits every "
                                 "backward into I (input gradient, '{i}') and W (weight gradient, '{w}'), so that the "
                                 "W's can fill the bubble").format(
            label=label, rank=r, action=a, i=f"{a.stage}I{a.microbatch}", w=f"{a.stage}W{a.microbatch}"))]

    ref_sched = zb_h1(p, m)
    mine, ref = simulate(sched, SPLIT), simulate(ref_sched, SPLIT)
    plain = simulate(one_f_one_b(p, m), FULL)
    idle, ref_idle = _idle(mine), _idle(ref)
    if mine.makespan > ref.makespan + 1e-9:
        if abs(mine.makespan - simulate(one_f_one_b_split(p, m), SPLIT).makespan) < 1e-9:
            what = _(", 1F1B's bubble (1F1B's order with each W right after its I idles as long)")
        elif abs(mine.makespan - plain.makespan) < 1e-9:
            what = _(", 1F1B's bubble (1F1B with full backwards B = I + W idles as long)")
        else:
            what = ""
        return False, [failure(_("{label}: FAILED: with F = I = W = 1 each rank idles {idle} time units{what}; ZB-H1 "
                                 "idles {ref_idle}; {hint}").format(label=label, idle=_numbers(idle), what=what,
                                                     ref_idle=_numbers(ref_idle), hint=_bubble_hint(sched, ref_sched)))]
    over = [s for s in range(p) if mine.peak_activations[s] > ref.peak_activations[s] + 1e-9]
    if over:
        s = over[0]
        return False, [failure(_("{label}: FAILED: stage {stage} holds up to {held} micro-batches of activations at "
                                 "once (counted until W: I frees M_B − M_W, W the rest), ZB-H1 {ref}; {hint}").format(
            label=label, stage=s, held=mine.peak_activations[s], ref=ref.peak_activations[s],
            hint=_memory_hint(sched, ref_sched)))]
    shape = _("valid, every backward split into I and W; idle per rank {idle} with F = I = W = 1 as ZB-H1 (1F1B "
              "idles {plain}); peak stash {peaks} M_B, within ZB-H1's").format(
        idle=_numbers(idle), plain=_numbers(_idle(plain)), peaks=mine.peak_activations)

    result, failed = on_real_ranks(sched, label, p, timeout=RUN_TIMEOUT)
    if failed:
        return False, failed
    return True, [_("{label}: PASSED: {shape}; on {p} real ranks: loss and gradients equal the single-process model, "
                    "measured stash {measured} as simulated").format(label=label, shape=shape, p=p,
                                                                     measured=result["peak_activations"])]


def judge(source: str):
    return judge_orders(source, POLICY.name, "ZB-H1", CASES, zb_h1_case)


EXERCISE = register(Exercise(
    "zb-h1-order", _l("ZB-H1"), POLICY, judge,
    forbids="the library's schedules (zb_h1, build): write the order yourself",
    copies=("parallel_lab.pipeline.schedules:_zb_h1_rank",)))


def check_zb_h1_order(fn) -> Verdict:
    """Lesson 07's exercise: ``fn(p, m)`` returns, per rank, ZB-H1's ordered actions (strings such
    as ``"1F3"``, ``"1I3"``, ``"1W3"``). One line per ``(p, m)`` case; the grid of the first invalid
    case is shown with its offending action marked ``>1I3<``. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
