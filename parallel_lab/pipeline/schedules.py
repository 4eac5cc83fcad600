"""The course's pipeline schedules: generators, pure functions of integers, and ``build`` by name.

A schedule is a pure function of integers (ranks p, microbatches m, virtual stages v) that returns,
for every rank, the order in which it runs forward and backward passes of its model stages, as the
data of ``pipeline.actions`` (``Schedule``, per rank a list of ``Action``s such as `1F3`). The same
object is validated (``pipeline.validate``), turned into send/recv lists (``pipeline.communication``),
simulated (``pipeline.simulate``), executed on real ranks (``pipeline.executor``) and drawn
(``parallel_lab.show.pipeline``). Nothing in this module starts a process. ``SCHEDULES`` (name ->
generator) is the one list of the schedules' names; ``V_SHAPED`` the ones with two stages per rank in
a V.

Papers: GPipe (Huang et al. 2019), PipeDream-Flush / 1F1B (Narayanan et al. 2021, "Memory-Efficient
Pipeline-Parallel DNN Training"), interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21), ZB-H1 and ZB-V (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism"), DualPipeV (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
section 3.2.1 DualPipe, in its "cut-in-half" V form, as PyTorch's `ScheduleDualPipeV`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import repeat
from typing import Iterable, Iterator, Sequence

from parallel_lab.checks import positive_int
from parallel_lab.i18n import _
from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError

MAX_STAGES = 64  # caps for `build`: keep validation and simulation interactive on a laptop
MAX_MICROBATCHES = 512
MAX_VIRTUAL = 16


# --------------------------------------------------------------------------------------------
# Parameter checks (raised before anything is generated or run)
# --------------------------------------------------------------------------------------------


def _check_positive(name: str, **values: int) -> None:
    for key, value in values.items():
        positive_int(key, value, error=ScheduleError, context=f"{name}: ")


def _check_caps(ranks: int, microbatches: int, virtual: int) -> None:
    for key, value, cap in (
        ("ranks", ranks, MAX_STAGES),
        ("microbatches", microbatches, MAX_MICROBATCHES),
        ("virtual", virtual, MAX_VIRTUAL),
    ):
        if value > cap:
            raise ScheduleError(f"{key} {value} > {cap}, the course's cap (keeps simulation interactive)")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a block (restoring its previous state after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _make(name: str, p: int, m: int, v: int, stage_to_rank: Sequence[int], ranks) -> Schedule:
    """Collect the per-rank action lists (`ranks` may be lazy) into a Schedule.

    The garbage collector is paused meanwhile: actions cannot form reference cycles, but CPython
    never untracks tuple subclasses such as Action, so each full collection that the ~10^5 new
    actions trigger rescans the whole heap (at p=64, m=512 with the simulator and figures imported
    that was most of the build time: zb-v 0.3 s instead of 0.1 s).
    """
    with _gc_paused():
        rows = [list(actions) for actions in ranks]
    return Schedule(name, p, m, v, tuple(stage_to_rank), rows)


# --------------------------------------------------------------------------------------------
# Generators: pure functions of integers
# --------------------------------------------------------------------------------------------
#
# Each generator writes a rank's order as runs of tokens, e.g. 1F1B is
# `[f] * warmup + [f, b] * steady + [b] * cooldown`, where a token is an iterator over one
# (stage, kind)'s actions in microbatch order; `_issue` then hands the k-th occurrence of a token its
# k-th action. The pattern reads like the papers' figures, and the per-action work runs in C, so
# even the largest schedules (p=64, m=512) build in about 0.1 s.


def _actions(stage: int, kind: str, microbatches: Iterable[int]) -> list[Action]:
    """`[Action(stage, kind, j) for j in microbatches]`, built without calling Action's Python-level
    `__new__` per element (about 2x faster; the elements are ordinary Action instances)."""
    return list(map(tuple.__new__, repeat(Action), zip(repeat(stage), repeat(kind), microbatches)))


def _issue(tokens: list[Iterator]) -> list:
    """One rank's order: replace each token (an iterator) by its next item, left to right."""
    ops = list(map(next, tokens))
    if len(ops) != len(tokens):  # an exhausted iterator ends `map` silently
        raise AssertionError(f"pattern has {len(tokens)} tokens but its iterators ran out after {len(ops)}")
    return ops


def naive(p: int) -> Schedule:
    """Naive model parallelism: the whole batch is one microbatch (m = 1) through p stages.

    Rank r runs `rF0` then `rB0`; only one rank works at a time, so the bubble is (p-1)/p.
    """
    _check_positive("naive", ranks=p)
    return _make("naive", p, 1, 1, range(p), ([Action(r, "F", 0), Action(r, "B", 0)] for r in range(p)))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): every rank runs all m forwards, then all m backwards.

    Backwards run in microbatch order B0..B(m-1), as in PyTorch's `ScheduleGPipe`: the last stage
    starts B0 right after its last forward, and each rank then drains in the order gradients arrive
    (with equal costs the reverse order gives the same makespan). Peak stash: m microbatches on
    every stage. Bubble fraction (p-1)/(m+p-1).
    """
    _check_positive("gpipe", ranks=p, microbatches=m)
    rows = (_actions(r, "F", range(m)) + _actions(r, "B", range(m)) for r in range(p))
    return _make("gpipe", p, m, 1, range(p), rows)


def _one_f_one_b_rank(r: int, p: int, m: int) -> list[Action]:
    warmup = min(p - r - 1, m)
    f, b = iter(_actions(r, "F", range(m))), iter(_actions(r, "B", range(m)))
    # warm-up forwards; steady state: one forward, one backward; cool-down: the remaining backwards
    return _issue([f] * warmup + [f, b] * (m - warmup) + [b] * warmup)


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021).

    Rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one backward, then
    drains the remaining backwards. Same bubble as GPipe, (p-1)/(m+p-1), but stage r never stashes
    more than min(m, p-r) microbatches instead of m. Works for any m >= 1 (m < p just means shorter
    steady state).
    """
    _check_positive("1f1b", ranks=p, microbatches=m)
    return _make("1f1b", p, m, 1, range(p), (_one_f_one_b_rank(r, p, m) for r in range(p)))


def _interleaved_order(r: int, p: int, m: int, v: int, kind: str) -> list[Action]:
    """Rank r's forwards (kind F) or backwards (kind B) in Megatron's order; chunk c is stage c*p + r.

    Microbatches go in groups of p: p microbatches through chunk 0, the same p through chunk 1, ...
    Backwards visit chunks in reverse (the last chunk is the one whose gradient arrives first).
    """
    chunks = range(v) if kind == "F" else range(v - 1, -1, -1)
    ops: list[Action] = []
    for first in range(0, m, p):  # m % p == 0: whole groups (Megatron-LM's default group size, p)
        for chunk in chunks:
            ops += _actions(chunk * p + r, kind, range(first, first + p))
    return ops


def _interleaved_rank(r: int, p: int, m: int, v: int) -> list[Action]:
    total = m * v
    # Megatron's warm-up: (v-1)*p forwards to fill the later chunks, plus 2 per hop to the last rank.
    # With free links 1 per hop already reaches the closed-form bubble; the second one is slack that
    # hides send/recv latency (simulated with link = F/2: ~10-15% shorter makespan), paid in memory.
    hops = (p - 1 - r) * (2 if v > 1 else 1)  # v = 1: plain 1F1B
    warmup = min(total, (v - 1) * p + hops)
    f, b = iter(_interleaved_order(r, p, m, v, "F")), iter(_interleaved_order(r, p, m, v, "B"))
    return _issue([f] * warmup + [f, b] * (total - warmup) + [b] * warmup)


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021 SC): v model chunks per rank.

    The model has p*v stages; stage s lives on rank s % p, so every rank holds v thin chunks and a
    microbatch loops through the ranks v times. Each forward/backward is 1/v of a rank's work, so
    the bubble shrinks by v: it is (p-1)/(v*m) of the ideal time m*v*(F+B) (per-chunk costs), at the
    price of v times more point-to-point messages. With v = 1 this is exactly 1F1B.

    Needs m % p == 0: the order is Megatron-LM's default, in which microbatches move through the
    chunks in groups of p. That is the default's constraint, not interleaving's: since late 2024
    Megatron-LM takes the group size N as ``--microbatch-group-size-per-virtual-pipeline-stage``
    (``microbatch_group_size_per_vp_stage``, default p; its ``schedules.py`` asks p <= N <= m and
    m % N either 0 or at least p), and PyTorch's ``ScheduleInterleaved1F1B`` asks only that m be a
    multiple of its rounds, max(1, m // p). The course implements the default grouping only.
    """
    _check_positive("interleaved-1f1b", ranks=p, microbatches=m, virtual=v)
    if m % p != 0:
        raise ScheduleError(_(
            "interleaved-1f1b needs microbatches % ranks == 0, got microbatches {m}, ranks {p}: the course "
            "implements Megatron-LM's default order, micro-batches through each chunk in groups of p (Megatron-LM "
            "takes other m with --microbatch-group-size-per-virtual-pipeline-stage)").format(m=m, p=p))
    stage_to_rank = [s % p for s in range(p * v)]
    rows = (_interleaved_rank(r, p, m, v) for r in range(p))
    return _make("interleaved-1f1b", p, m, v, stage_to_rank, rows)


def _zb_h1_rank(r: int, p: int, m: int) -> list[Action]:
    warmup = min(p - r - 1, m)
    f, i, w = (iter(_actions(r, kind, range(m))) for kind in "FIW")
    tokens = [f] * warmup
    for k in range(m):  # k-th input-gradient pass; W(k - r) follows it once r of them are pending
        tokens += [f, i] if warmup + k < m else [i]
        if k >= r:
            tokens.append(w)
    return _issue(tokens + [w] * min(r, m))  # the r deferred W's fill the cool-down


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"), the 1F1B-shaped zero-bubble schedule.

    The backward is split into I (gradient w.r.t. the stage input, which the previous stage waits
    for) and W (gradient w.r.t. the weights, which nobody waits for). Rank r runs 1F1B's warm-up
    (p-r-1 forwards), then F, I pairs in 1F1B order, but holds back its first r W passes; the
    deferred W's fill the cool-down bubble that 1F1B leaves while gradients trickle back. With
    F = I = W the idle time per rank drops from 1F1B's (p-1)(F+B) to (p-1)(F+I-W), i.e. a bubble of
    (p-1)/(3m) of the ideal time 3mF.

    Memory is what it costs: I frees a microbatch's activations except M_W, what W still needs (every
    Linear's input and output gradient; M_W = 32sbh of M_B = 34sbh + 5as^2b in the paper's Table 1),
    and rank r holds r microbatches waiting for their W. Its peak is (p-r) M_B + r M_W for m >= p:
    p M_B on rank 0 as in 1F1B (the paper's "same peak memory as 1F1B" is this maximum over ranks),
    but later ranks hold nearly p M_B where 1F1B holds (p-r) M_B (see `simulate.Timeline`).
    """
    _check_positive("zb-h1", ranks=p, microbatches=m)
    return _make("zb-h1", p, m, 1, range(p), (_zb_h1_rank(r, p, m) for r in range(p)))


def v_placement(p: int) -> list[int]:
    """``stage_to_rank`` of a V over p ranks (ZB-V, DualPipeV): 2p stages, rank r holds stage r on the
    way down and stage 2p-1-r on the way back up, so rank 0 holds the first and the last stage."""
    return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]


def _zb_v_rank(r: int, p: int, m: int) -> list[Action]:
    n = max(2 * p - 1, m)  # generate for at least 2p-1 microbatches (fills the V), drop the rest below
    down, up = r, 2 * p - 1 - r  # this rank's stage on the way down and on the way back up the V

    def numbered(stage: int, kind: str) -> Iterator[Action | None]:  # microbatches >= m become None
        return iter(_actions(stage, kind, range(m)) + [None] * (n - m))

    dF, dI, dW = (numbered(down, kind) for kind in "FIW")
    uF, uI, uW = (numbered(up, kind) for kind in "FIW")
    tokens = (
        [dF] * (2 * (p - r) - 1)  # warm-up
        + [uF, dF] * r
        + [uF, uI, uW] * (p - r)
        + [dF, dI, dW, uF, uI, uW] * (n - (2 * p - r - 1))  # steady state, until all n down F's ran
        + [dI, dW, uF, uI, uW] * (p - r - 1)  # ... and until the up stage has caught up
        + [dI, uI] * r  # cool-down: input gradients first, weight gradients fill the gaps
        + [dI, dW] * (p - r)
        + [uW] * r  # the last r weight gradients of each stage, up stage first
        + [dW] * r
    )
    ops = _issue(tokens)
    return ops if n == m else [a for a in ops if a is not None]


def zb_v(p: int, m: int) -> Schedule:
    """ZB-V (Qi et al. 2023, section 6): two stages per rank in V order, backward split into I and W.

    The model has 2p stages; rank r holds stage r (on the way down) and stage 2p-1-r (on the way
    back up), so rank 0 holds both the first and the last stage and the loss gradient turns around
    on rank p-1 without a hop. Each rank's order is the ZB-V pattern (as in PyTorch's
    `ScheduleZBVZeroBubble`): 2(p-r)-1 warm-up forwards of the down stage, r interleaved forward
    pairs, then steady F-I-W triples alternating between the two stages, with W's deferred to fill
    the cool-down. It is generated for max(m, 2p-1) microbatches and the actions of microbatches
    >= m are dropped (removing whole microbatches keeps every remaining dependency in order).
    Counted until W (see `simulate.Timeline`), each rank peaks at about 2p half-size stashes, i.e.
    p full ones, on every rank (Qi et al. 2023, section 6: ZB-V's peak equals 1F1B's p M_B, reached
    on every rank instead of rank 0 only).
    """
    _check_positive("zb-v", ranks=p, microbatches=m)
    return _make("zb-v", p, m, 2, v_placement(p), (_zb_v_rank(r, p, m) for r in range(p)))


def _dualpipe_v_rank(r: int, p: int, m: int) -> list[Action]:
    # PyTorch's ScheduleDualPipeV._calculate_single_rank_operations, step by step (stage "0" is this
    # rank's down stage, "1" its up stage); each full backward B is written as I then W at once.
    down, up = r, 2 * p - 1 - r
    f0, i0, w0 = (iter(_actions(down, kind, range(m))) for kind in "FIW")
    f1, i1, w1 = (iter(_actions(up, kind, range(m))) for kind in "FIW")
    b0, b1 = [i0, w0], [i1, w1]
    tokens = (
        [f0] * (2 * (p - r - 1))  # 1. warm-up forwards of the down stage
        + [f0, f1] * (r + 1)  # 2. forward pairs: down, then up
        + [i1, w1, f1] * (p - r - 1)  # 3. zero-bubble I-W-F of the up stage
        + [f0, *b1, f1, *b0] * (m - 2 * p + r + 1)  # 4. steady state: pairs (F0 & B1), (F1 & B0)
        + [*b1, f1, *b0] * (p - r - 1)  # 5. B1, then the pair (F1 & B0)
    )
    deferred: list[Iterator] = []  # 6.-8.: W's held back, first in first out (PyTorch's weight_queue)
    split = False
    for k in range(r + 1):  # 6. B1 B0: from the middle on, I now and W later
        for stage, (i, w) in ((1, b1), (0, b0)):
            split = split or (k == (r + 1) // 2 and r % 2 == stage)  # odd ranks split B1 first
            tokens += [i] if split else [i, w]
            deferred += [w] if split else []
    for _step in range(p - r - 1):  # 7. a deferred W, then I of the down stage (its W deferred)
        tokens += [deferred.pop(0), i0]
        deferred.append(w0)
    return _issue(tokens + deferred)  # 8. the remaining r + 1 W's


def dualpipe_v(p: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek-V3 technical report 2024, section 3.2.1; the "cut-in-half" V form of
    DualPipe in PyTorch's `ScheduleDualPipeV`, after github.com/deepseek-ai/DualPipe).

    Placement as ZB-V: 2p stages, rank r holds stage r (down) and 2p-1-r (up). The order is
    PyTorch's, step for step: 2(p-r-1) forwards of the down stage, r+1 forward pairs, p-r-1
    zero-bubble I-W-F triples of the up stage, then DualPipe's steady state, where each forward is
    paired with the backward of *another* micro-batch on the rank's other stage, (F0 & B1) then
    (F1 & B0), and a cool-down whose second half splits the backward and defers W to fill the drain.
    In DeepSeek's system the two halves of a pair run at once, so that the forward's expert-parallel
    all-to-all hides behind the backward's compute and vice versa; here a pair is adjacent actions,
    `F` then `I W` (PyTorch's OVERLAP_F_B lists the same two sub-actions, F first, and its runtime
    also runs them one after the other unless a custom overlap function is registered), and the
    course's executor runs them one after the other. Every full backward is split into I followed at
    once by W: the same work, but the gradient leaves at I, so at equal costs (I + W = B) the
    makespan is never longer than PyTorch's and shorter with link latency (tests/test_dualpipe.py).

    Needs m >= 2p, PyTorch's check (at least as many micro-batches as stages): rank r's steady state
    has m - 2p + r + 1 pairs of pairs, none on rank 0 at m = 2p - 1 and a negative count below.
    With free links and I = W = B/2 the makespan is 2m(F + B) + max((p-1) max(2F - B, F),
    (p-1) B/2 - F) in per-stage costs, ZB-V's 6m + p - 1 at F = I = W = 1 (fitted to the simulator
    and held against it, not derived from the paper). Counted until W, every rank peaks at 2p + 1
    half-size stashes, p + 1/2 of a rank's layers: one more than ZB-V, because a pair's forward starts before its
    partner's backward frees anything (cf. the activation memory of PP + 1 the report gives DualPipe).
    """
    _check_positive("dualpipe-v", ranks=p, microbatches=m)
    if m < 2 * p:
        raise ScheduleError(_(
            "dualpipe-v needs microbatches >= 2 * ranks (at least one micro-batch per model stage, as PyTorch's "
            "ScheduleDualPipeV), got microbatches {m}, ranks {p} (2 * ranks = {two_p})").format(m=m, p=p, two_p=2 * p))
    return _make("dualpipe-v", p, m, 2, v_placement(p), (_dualpipe_v_rank(r, p, m) for r in range(p)))


SCHEDULES = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-v": zb_v,
    "dualpipe-v": dualpipe_v,
}
V_SHAPED = ("zb-v", "dualpipe-v")  # two stages per rank, placed in a V (``v_placement``)


def stages_per_rank(name: str, virtual: int = 1) -> int:
    """Model stages each rank holds under schedule ``name``: 2 for a V, else ``virtual`` (1 except
    for interleaved-1f1b)."""
    return 2 if name in V_SHAPED else virtual


def build(name: str, ranks: int, microbatches: int, virtual: int = 1) -> Schedule:
    """Build a schedule by CLI name, checking parameters first (`parallel-lab schedule NAME ...`).

    ranks:         p, the number of pipeline ranks (the CLI's `--ranks P`, alias `--stages`). Model stages are
                   p for most schedules, p * virtual for interleaved-1f1b, and 2p for zb-v and
                   dualpipe-v.
    microbatches:  m; naive needs m == 1; interleaved-1f1b needs m % p == 0; dualpipe-v m >= 2p.
    virtual:       stages per rank; only interleaved-1f1b takes it (zb-v and dualpipe-v always have
                   2, and accept virtual 1 or 2); every other schedule needs 1.
    """
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    _check_positive(name, ranks=ranks, microbatches=microbatches, virtual=virtual)
    _check_caps(ranks, microbatches, virtual)
    if name == "naive":
        if microbatches != 1:
            raise ScheduleError(
                f"naive runs the whole batch as one microbatch, got microbatches {microbatches} "
                "(use gpipe to split the batch)"
            )
        return naive(ranks)
    if name == "interleaved-1f1b":
        return interleaved_1f1b(ranks, microbatches, virtual)
    allowed = (1, 2) if name in V_SHAPED else (1,)
    if virtual not in allowed:
        raise ScheduleError(f"{name} has a fixed {allowed[-1]} stage(s) per rank, got virtual {virtual}")
    return SCHEDULES[name](ranks, microbatches)
