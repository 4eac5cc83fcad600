"""Pipeline schedules as data: per rank, an ordered list of actions.

A schedule is a pure function of integers (ranks p, microbatches m, virtual stages v) that returns,
for every rank, the order in which it runs forward and backward passes of its model stages. The same
object is validated here, turned into send/recv lists here (`communication`), simulated in
`parallel_lab.pipeline.simulate`, executed on real ranks, and drawn. Nothing in this module starts a process.

Action kinds (PyTorch `torch.distributed.pipelining` notation, `{stage}{kind}{microbatch}`, e.g. `1F3`):
    F  forward of one microbatch through one stage
    B  full backward (input gradient and weight gradient together)
    I  backward for the input gradient only (the part the previous stage waits for)
    W  backward for the weight gradient only (nobody waits for it, so it can fill bubbles)

Papers: GPipe (Huang et al. 2019), PipeDream-Flush / 1F1B (Narayanan et al. 2021, "Memory-Efficient
Pipeline-Parallel DNN Training"), interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21), ZB-H1 and ZB-V (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism").
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

KINDS = ("F", "B", "I", "W")
MAX_STAGES = 64  # caps for `build`: keep validation and simulation interactive on a laptop
MAX_MICROBATCHES = 512
MAX_VIRTUAL = 16

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


class ScheduleError(ValueError):
    """A schedule (or its parameters) breaks an invariant; the message names it with actual values."""


class Action(NamedTuple):
    """One compute step: run `kind` (F, B, I or W) of `microbatch` through model stage `stage`."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """`Action.parse("1F3") == Action(stage=1, kind="F", microbatch=3)`."""
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected '{{stage}}{{F|B|I|W}}{{microbatch}}', e.g. '1F3'"
            )
        return cls(int(match[1]), match[2], int(match[3]))


def parse_actions(text: str) -> list[Action | None]:
    """`"0F0 . 0B0"` -> `[Action(0,'F',0), None, Action(0,'B',0)]` ('.' is an idle slot)."""
    return [None if token == "." else Action.parse(token) for token in text.split()]


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions of a pipeline schedule.

    name:            schedule name, e.g. "1f1b"
    n_ranks:         p, the number of pipeline ranks (devices)
    n_microbatches:  m
    virtual:         v, model stages per rank (1 except for interleaved and V schedules)
    stage_to_rank:   stage_to_rank[s] is the rank that holds model stage s; len = n_stages = p * v
    ranks:           ranks[r] = ordered list of Action, or None for an explicit idle slot (display only:
                     None carries no time in the simulator and no work for the executor)
    """

    name: str
    n_ranks: int
    n_microbatches: int
    virtual: int
    stage_to_rank: tuple[int, ...]
    ranks: list[list[Action | None]] = field(repr=False)  # print(schedule) shows the grid

    @property
    def n_stages(self) -> int:
        """Total model stages, p * v."""
        return len(self.stage_to_rank)

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into I and W (zero-bubble schedules)."""
        return any(a is not None and a.kind in "IW" for actions in self.ranks for a in actions)

    def actions(self) -> Iterable[tuple[int, int, Action]]:
        """Yield (rank, step, action) for every non-idle slot."""
        for rank, actions in enumerate(self.ranks):
            for step, action in enumerate(actions):
                if action is not None:
                    yield rank, step, action

    def to_dict(self) -> dict:
        """JSON-ready form; `Schedule.from_dict(s.to_dict()) == s`."""
        return {
            "name": self.name,
            "n_ranks": self.n_ranks,
            "n_microbatches": self.n_microbatches,
            "virtual": self.virtual,
            "stage_to_rank": list(self.stage_to_rank),
            "ranks": {r: [None if a is None else str(a) for a in acts] for r, acts in enumerate(self.ranks)},
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Schedule":
        ranks = data["ranks"]
        rows = [ranks[key] for key in sorted(ranks, key=int)] if isinstance(ranks, Mapping) else ranks
        return cls(
            name=data["name"],
            n_ranks=data["n_ranks"],
            n_microbatches=data["n_microbatches"],
            virtual=data["virtual"],
            stage_to_rank=tuple(data["stage_to_rank"]),
            ranks=[[None if t is None else Action.parse(t) for t in row] for row in rows],
        )

    def to_text(self) -> str:
        """One line per rank: `rank 0: 0F0 0F1 . 0B0` (parse a line back with `parse_actions`)."""
        return "\n".join(
            f"rank {r}: " + " ".join("." if a is None else str(a) for a in acts)
            for r, acts in enumerate(self.ranks)
        )

    def __str__(self) -> str:
        return format_grid(self)


# --------------------------------------------------------------------------------------------
# Parameter checks (raised before anything is generated or run)
# --------------------------------------------------------------------------------------------


def _check_positive(name: str, **values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"{name} needs an integer {key}, got {key} {value!r}")
        if value < 1:
            raise ScheduleError(f"{name} needs {key} >= 1, got {key} {value}")


def _check_caps(stages: int, microbatches: int, virtual: int) -> None:
    for key, value, cap in (
        ("stages", stages, MAX_STAGES),
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
    _check_positive("naive", stages=p)
    return _make("naive", p, 1, 1, range(p), ([Action(r, "F", 0), Action(r, "B", 0)] for r in range(p)))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): every rank runs all m forwards, then all m backwards.

    Backwards run in microbatch order B0..B(m-1), as in PyTorch's `ScheduleGPipe`: the last stage
    starts B0 right after its last forward, and each rank then drains in the order gradients arrive
    (with equal costs the reverse order gives the same makespan). Peak stash: m microbatches on
    every stage. Bubble fraction (p-1)/(m+p-1).
    """
    _check_positive("gpipe", stages=p, microbatches=m)
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
    _check_positive("1f1b", stages=p, microbatches=m)
    return _make("1f1b", p, m, 1, range(p), (_one_f_one_b_rank(r, p, m) for r in range(p)))


def _interleaved_order(r: int, p: int, m: int, v: int, kind: str) -> list[Action]:
    """Rank r's forwards (kind F) or backwards (kind B) in Megatron's order; chunk c is stage c*p + r.

    Microbatches go in groups of p: p microbatches through chunk 0, the same p through chunk 1, ...
    Backwards visit chunks in reverse (the last chunk is the one whose gradient arrives first).
    """
    chunks = range(v) if kind == "F" else range(v - 1, -1, -1)
    ops: list[Action] = []
    for first in range(0, m, p):  # m % p == 0: whole groups
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
    price of v times more point-to-point messages. Needs m % p == 0 (Megatron's constraint:
    microbatches move through the chunks in groups of p). With v = 1 this is exactly 1F1B.
    """
    _check_positive("interleaved-1f1b", stages=p, microbatches=m, virtual=v)
    if m % p != 0:
        raise ScheduleError(
            f"interleaved-1f1b needs microbatches % stages == 0, got microbatches {m}, stages {p}"
        )
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
    (p-1)/(3m) of the ideal time 3mF. Activations are freed by I (the paper's accounting: W keeps only
    the small M_W), so stage r stashes at most min(m, p-r) microbatches, exactly as 1F1B.
    """
    _check_positive("zb-h1", stages=p, microbatches=m)
    return _make("zb-h1", p, m, 1, range(p), (_zb_h1_rank(r, p, m) for r in range(p)))


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
    Peak activation memory per rank is that of 1F1B (2p half-size stashes = p full ones).
    """
    _check_positive("zb-v", stages=p, microbatches=m)
    stage_to_rank = [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return _make("zb-v", p, m, 2, stage_to_rank, (_zb_v_rank(r, p, m) for r in range(p)))


SCHEDULES = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-v": zb_v,
}


def build(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """Build a schedule by CLI name, checking parameters first (`parallel-lab schedule NAME ...`).

    stages:        p, the number of pipeline RANKS (the CLI's `--stages P`). Total model stages are
                   p for most schedules, p * virtual for interleaved-1f1b, and 2p for zb-v.
    microbatches:  m; naive needs m == 1; interleaved-1f1b needs m % p == 0.
    virtual:       stages per rank; only interleaved-1f1b takes it (zb-v always has 2, and accepts
                   virtual 1 or 2); every other schedule needs 1.
    """
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    _check_positive(name, stages=stages, microbatches=microbatches, virtual=virtual)
    _check_caps(stages, microbatches, virtual)
    if name == "naive":
        if microbatches != 1:
            raise ScheduleError(
                f"naive runs the whole batch as one microbatch, got microbatches {microbatches} "
                "(use gpipe to split the batch)"
            )
        return naive(stages)
    if name == "interleaved-1f1b":
        return interleaved_1f1b(stages, microbatches, virtual)
    allowed = (1, 2) if name == "zb-v" else (1,)
    if virtual not in allowed:
        raise ScheduleError(f"{name} has a fixed {allowed[-1]} stage(s) per rank, got virtual {virtual}")
    return SCHEDULES[name](stages, microbatches)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _inputs(s: int, kind: str, j: int, n_stages: int) -> tuple[tuple[int, str, int], ...]:
    """Keys of what action (s, kind, j) consumes. Key kind "G" is the input-gradient pass of a
    (stage, microbatch): its B, or its I when the backward is split.

    F(s,j) needs F(s-1,j); B or I (s,j) needs F(s,j) and G(s+1,j); W(s,j) needs G(s,j) = I(s,j).
    """
    if kind == "F":
        return ((s - 1, "F", j),) if s > 0 else ()
    if kind == "W":
        return ((s, "G", j),)
    return ((s, "F", j), (s + 1, "G", j)) if s + 1 < n_stages else ((s, "F", j),)


def _describe(key: tuple[int, str, int], where: Mapping) -> str:
    s, kind, j = key
    if kind == "G":
        kind = "B" if (s, "B", j) in where else "I"
    return f"{Action(s, kind, j)} (stage {s}, microbatch {j})"


def _error(schedule: Schedule, message: str, mark: tuple[int, int] | None = None) -> ScheduleError:
    """A ScheduleError whose message ends with the grid, the offending cell marked `>1B3<`."""
    rows = None if mark is None else (mark[1] - 8, mark[1] + 8)
    return ScheduleError(f"{schedule.name}: {message}\n{format_grid(schedule, mark=mark, rows=rows)}")


def _check_structure(schedule: Schedule) -> None:
    p, m, n_stages = schedule.n_ranks, schedule.n_microbatches, schedule.n_stages
    owner = schedule.stage_to_rank
    if len(schedule.ranks) != p:
        raise _error(schedule, f"has {len(schedule.ranks)} rank lists, expected n_ranks {p}")
    bad = [s for s, r in enumerate(owner) if not 0 <= r < p]
    if bad:
        raise _error(schedule, f"stage {bad[0]} maps to rank {owner[bad[0]]}, not in 0..{p - 1}")
    for rank, step, a in schedule.actions():
        if not isinstance(a, Action) or a.kind not in KINDS:
            problem = f"is not an Action with kind in {KINDS}"
        elif not (0 <= a.stage < n_stages and 0 <= a.microbatch < m):
            problem = f"is out of range (stages 0..{n_stages - 1}, microbatches 0..{m - 1})"
        elif owner[a.stage] != rank:
            problem = f"is on rank {rank} but stage {a.stage} lives on rank {owner[a.stage]}"
        else:
            continue
        raise _error(schedule, f"rank {rank}, step {step}: {a} {problem}", (rank, step))


def _index(schedule: Schedule) -> dict[tuple[int, str, int], tuple[int, int]]:
    """(stage, kind, microbatch) -> (rank, step), plus "G" keys for B/I; rejects duplicates and a
    full backward B mixed with split I/W for the same (stage, microbatch)."""
    where: dict[tuple[int, str, int], tuple[int, int]] = {}
    backward: dict[tuple[int, int], tuple[bool, int, int]] = {}  # (stage, mb) -> (is B, rank, step)
    for rank, step, a in schedule.actions():
        s, kind, j = a
        if a in where:
            r0, s0 = where[a]
            message = f"rank {rank}, step {step}: {a} appears twice (first at rank {r0}, step {s0})"
            raise _error(schedule, message, (rank, step))
        if kind != "F":
            full, r0, s0 = backward.setdefault((s, j), (kind == "B", rank, step))
            if full != (kind == "B"):
                raise _error(
                    schedule,
                    f"rank {rank}, step {step}: {a} mixes full backward B with split I/W for stage {s}, "
                    f"microbatch {j} ({schedule.ranks[r0][s0]} is at rank {r0}, step {s0})",
                    (rank, step),
                )
        where[a] = (rank, step)
        if kind == "B" or kind == "I":
            where[s, "G", j] = (rank, step)
    return where


def _check_complete(schedule: Schedule, where: Mapping) -> None:
    for s in range(schedule.n_stages):
        for j in range(schedule.n_microbatches):
            if (s, "F", j) not in where:
                missing = "F"
            elif (s, "B", j) in where:
                continue
            elif (s, "I", j) in where or (s, "W", j) in where:
                missing = "I" if (s, "I", j) not in where else "W" if (s, "W", j) not in where else None
            else:
                missing = "B"
            if missing:
                raise _error(
                    schedule,
                    f"{_describe((s, missing, j), where)} is missing (expected on rank "
                    f"{schedule.stage_to_rank[s]}); every (stage, microbatch) needs one F and either one B "
                    "or one I and one W",
                )


def _run_dataflow(schedule: Schedule, where: Mapping) -> dict[int, tuple[int, Action, tuple]]:
    """Execute the schedule symbolically; return {rank: (step, action, awaited key)} of stuck ranks.

    Each rank runs its actions in order and blocks on an action until every input exists (a
    blocking recv); results are sent asynchronously (isend, as in torch.distributed.pipelining), so
    sends never block. A blocked rank parks on the input it misses (key stage*m + microbatch for an
    activation, ~key for a gradient) and resumes when it is produced: O(actions). An input missing
    from the rank's own past is an order error, raised at once. Empty result = no deadlock.
    """
    n_stages, m, ranks = schedule.n_stages, schedule.n_microbatches, schedule.ranks
    owner = schedule.stage_to_rank
    fwd_done, grad_done = [False] * (n_stages * m), [False] * (n_stages * m)
    pos = [0] * len(ranks)
    parked: dict[int, list[int]] = {}
    ready = list(range(len(ranks)))
    while ready:
        rank = ready.pop()
        actions, i = ranks[rank], pos[rank]
        while i < len(actions):
            a = actions[i]
            if a is not None:
                s, kind, j = a
                key = s * m + j
                if kind == "F":
                    wait = key - m if s > 0 and not fwd_done[key - m] else None
                elif kind == "W":
                    wait = ~key if not grad_done[key] else None
                elif not fwd_done[key]:
                    wait = key
                else:
                    wait = ~(key + m) if s + 1 < n_stages and not grad_done[key + m] else None
                if wait is not None:
                    if owner[(wait if wait >= 0 else ~wait) // m] == rank:
                        _raise_order_error(schedule, where, rank, i, a)
                    parked.setdefault(wait, []).append(rank)
                    break
                if kind == "F":
                    fwd_done[key] = True
                    ready.extend(parked.pop(key, ()))
                elif kind != "W":
                    grad_done[key] = True
                    ready.extend(parked.pop(~key, ()))
            i += 1
        pos[rank] = i
    return {
        rank: (pos[rank], a, _first_missing(a, n_stages, fwd_done, grad_done, m))
        for rank, actions in enumerate(ranks)
        if pos[rank] < len(actions)
        for a in [actions[pos[rank]]]
    }


def _first_missing(a: Action, n_stages: int, fwd_done, grad_done, m: int) -> tuple[int, str, int]:
    for s, kind, j in _inputs(*a, n_stages):
        if not (fwd_done if kind == "F" else grad_done)[s * m + j]:
            return (s, kind, j)
    raise AssertionError(f"{a} is not waiting for anything")


def _raise_order_error(schedule: Schedule, where: Mapping, rank: int, step: int, a: Action) -> None:
    for need in _inputs(*a, schedule.n_stages):
        r0, s0 = where[need]
        if r0 == rank and s0 > step:
            raise _error(
                schedule,
                f"rank {rank}, step {step}: {a} runs before its input {_describe(need, where)}, "
                f"which comes later on the same rank (step {s0})",
                (rank, step),
            )
    raise AssertionError(f"rank {rank}, step {step}: {a} blocked on its own rank without an order error")


def _deadlock_message(stuck: Mapping[int, tuple], where: Mapping) -> tuple[str, tuple[int, int]]:
    """Follow the chain of waits from the earliest stuck action until it closes into a cycle."""
    first = min(stuck, key=lambda r: (stuck[r][0], r))
    parts, seen, rank = [], set(), first
    while rank in stuck and rank not in seen:
        seen.add(rank)
        step, a, missing = stuck[rank]
        source = where[missing][0]
        need = _describe(missing, where)
        parts.append(f"rank {rank}, step {step}: {a} waits for its input {need} from rank {source}")
        rank = source
    cycle = f"; back to rank {rank}, a cycle" if rank in seen else ""
    return "no rank can progress (deadlock): " + "; ".join(parts) + cycle, (first, stuck[first][0])


def validate(schedule: Schedule) -> Schedule:
    """Check every invariant of a schedule; return it unchanged or raise ScheduleError.

    1. shape: one list per rank, actions in range, each action on the rank that owns its stage;
    2. completeness: per (stage, microbatch) exactly one F and either one B or one I and one W;
    3. order on one rank: an action never precedes one of its inputs on the same rank
       (F(s-1) before F(s), F before B/I, B/I of stage s+1 before B/I of s, I before W);
    4. deadlock freedom: executing with blocking receives (sends are asynchronous) finishes.
    The message names the first offending action (rank, step, action) and shows the grid around it
    with that cell marked `>1B3<`.
    """
    _check_structure(schedule)
    where = _index(schedule)
    _check_complete(schedule, where)
    stuck = _run_dataflow(schedule, where)
    if stuck:
        message, mark = _deadlock_message(stuck, where)
        raise _error(schedule, message, mark)
    return schedule


# --------------------------------------------------------------------------------------------
# Communication: the send/recv ops a real executor performs around each action
# --------------------------------------------------------------------------------------------


class Comm(NamedTuple):
    """A point-to-point op: `op` "send"/"recv" of `tensor` "act" (activation) or "grad" (its gradient).

    stage is the local stage that sends or receives, peer_stage the other end, peer its rank.
    str() follows PyTorch's `_add_send_recv`: `0SEND_F3`, `1RECV_F3`, `1SEND_B3`, `0RECV_B3`.
    """

    op: str
    tensor: str
    stage: int
    peer: int
    peer_stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.upper()}_{'F' if self.tensor == 'act' else 'B'}{self.microbatch}"


def _recvs(a: Action, stage_to_rank: Sequence[int]) -> list[Comm]:
    rank, last = stage_to_rank[a.stage], len(stage_to_rank) - 1
    if a.kind == "F" and a.stage > 0 and stage_to_rank[a.stage - 1] != rank:
        return [Comm("recv", "act", a.stage, stage_to_rank[a.stage - 1], a.stage - 1, a.microbatch)]
    if a.kind in "BI" and a.stage < last and stage_to_rank[a.stage + 1] != rank:
        return [Comm("recv", "grad", a.stage, stage_to_rank[a.stage + 1], a.stage + 1, a.microbatch)]
    return []


def _sends(a: Action, stage_to_rank: Sequence[int]) -> list[Comm]:
    rank, last = stage_to_rank[a.stage], len(stage_to_rank) - 1
    if a.kind == "F" and a.stage < last and stage_to_rank[a.stage + 1] != rank:
        return [Comm("send", "act", a.stage, stage_to_rank[a.stage + 1], a.stage + 1, a.microbatch)]
    if a.kind in "BI" and a.stage > 0 and stage_to_rank[a.stage - 1] != rank:
        return [Comm("send", "grad", a.stage, stage_to_rank[a.stage - 1], a.stage - 1, a.microbatch)]
    return []


def communication(schedule: Schedule, check: bool = True) -> dict[int, list[Action | Comm]]:
    """Per rank, the ordered ops an executor runs: the recvs an action needs, the action, its sends.

    A stage hands its output to the next stage on the same rank in memory (no message). The
    schedule is validated first, so the result cannot deadlock with blocking recvs and async sends;
    ``check=False`` skips that, to run a broken schedule and show how it hangs.
    """
    if check:
        validate(schedule)
    stage_to_rank = schedule.stage_to_rank
    ops: dict[int, list[Action | Comm]] = {}
    for rank, actions in enumerate(schedule.ranks):
        ops[rank] = []
        for a in actions:
            if a is not None:
                ops[rank] += [*_recvs(a, stage_to_rank), a, *_sends(a, stage_to_rank)]
    return ops


# --------------------------------------------------------------------------------------------
# Text grid
# --------------------------------------------------------------------------------------------


def format_grid(
    source: Schedule | Mapping[int, Sequence] | Sequence[Sequence],
    mark: tuple[int, int] | None = None,
    rows: tuple[int, int] | None = None,
) -> str:
    """Step x rank text grid: one row per step, one column per rank, idle slots as '.'.

    source: a Schedule (steps are list positions) or rank -> list of actions/strings/None (e.g. the
    unit-time grid of `simulate.summary`). mark=(rank, step) draws that cell as `>1B3<`.
    rows=(first, last) keeps only those steps (inclusive), with '...' where rows were cut.
    """
    columns = source.ranks if isinstance(source, Schedule) else (
        [source[k] for k in sorted(source)] if isinstance(source, Mapping) else list(source)
    )
    n_steps = max((len(c) for c in columns), default=0)
    cells = [["." if a is None else str(a) for a in c] + [""] * (n_steps - len(c)) for c in columns]
    if mark is not None and mark[0] < len(cells) and mark[1] < n_steps:
        cells[mark[0]][mark[1]] = f">{cells[mark[0]][mark[1]]}<"
    width = max([len(f"rank {len(cells) - 1}")] + [len(t) for c in cells for t in c]) + 2
    first, last = (0, n_steps - 1) if rows is None else (max(0, rows[0]), min(n_steps - 1, rows[1]))
    lines = ["step " + "".join(f"rank {r}".center(width) for r in range(len(cells)))]
    if first > 0:
        lines.append("  ...")
    for step in range(first, last + 1):
        lines.append(f"{step:>4} " + "".join(c[step].center(width) for c in cells))
    if last < n_steps - 1:
        lines.append("  ...")
    return "\n".join(lines)
