"""What a schedule search is given, and how one candidate is judged.

    problem = make_problem(ranks=4, microbatches=12, max_activations=4)   # unit costs, wave placement
    judged = evaluate(problem, schedule)      # makespan, spans, per-rank peak memory, within the cap?

**Placement.** "wave": p model stages, stage r on rank r (1F1B, ZB-H1). "v": 2p stages, rank r holds
stage r on the way down and stage 2p-1-r on the way back up (ZB-V, DualPipeV; Qi et al. 2023,
section 6), so each stage is half of a rank's layers.

**Memory** is counted as ``pipeline.simulate`` counts it (ARCHITECTURE.md, "Memory is counted..."):
a micro-batch holds its stage's activations M_B from the start of its F; a full backward B frees
them; a split one frees M_B - M_W at the end of I and M_W (``w_share`` of M_B) at the end of W.
On one rank actions do not overlap, so the amount held after each action depends on the rank's
order alone, and its peak is a prefix maximum of that order. The cap is per rank, in micro-batches
of *a rank's* layers, so that it means the same in both placements: 1F1B holds p of them on rank 0
whatever the placement, ZB-V p, a V-stage counts 1/2 (``stage_memory`` can say otherwise, e.g. for
stages of unequal size).

**Step** is the makespan of list scheduling (``pipeline.simulate``: every action starts when its rank
is free and its input has arrived, plus the link between ranks). The Zero Bubble authors' objective
is the longest *span* of a rank, first action to last (their automatic scheduler minimises it; a
rank that is busy for all of its span has no bubble of its own); candidates of equal makespan are
ranked by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from parallel_lab.checks import positive_int
from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError
from parallel_lab.pipeline.schedules import MAX_MICROBATCHES, MAX_STAGES
from parallel_lab.pipeline.simulate import M_W_SHARE, Costs, simulate
from parallel_lab.pipeline.validate import validate

PLACEMENTS = ("wave", "v")
UNIT = Costs(F=1.0, B=2.0, I=1.0, W=1.0)  # F = I = W = 1, B = I + W
EPS = 1e-9


def stage_to_rank(placement: str, ranks: int) -> tuple[int, ...]:
    """Model stage -> rank: ``(0, 1, ..., p-1)`` for "wave", ``(0, ..., p-1, p-1, ..., 0)`` for "v"."""
    if placement == "wave":
        return tuple(range(ranks))
    if placement == "v":
        return tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(2 * ranks))
    raise ScheduleError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")


@dataclass(frozen=True)
class Problem:
    """A search's input (build it with ``make_problem``, which checks every field).

    ranks, microbatches:  p and m
    placement:            "wave" or "v"
    max_activations:      per rank, the most activations it may hold, in micro-batches of a rank's layers
    costs:                per-stage F, B, I, W and the link (``simulate.Costs``)
    w_share:              M_W / M_B, what a micro-batch keeps from its I to its W
    split:                True: backward as I then W (zero-bubble schedules); False: full B only
    stage_memory:         per model stage, its M_B in micro-batches of a rank's layers (1/v each)
    """

    ranks: int
    microbatches: int
    placement: str
    max_activations: tuple[float, ...]
    costs: Costs
    w_share: float
    split: bool
    stage_memory: tuple[float, ...]
    owner: tuple[int, ...] = field(repr=False)
    table: dict = field(repr=False, compare=False)

    @property
    def n_stages(self) -> int:
        return len(self.owner)

    @property
    def virtual(self) -> int:
        return self.n_stages // self.ranks

    @property
    def link(self) -> float:
        return self.costs.link

    def hop(self, a: int, b: int) -> float:
        """Link cost between model stages ``a`` and ``b`` (0 on one rank)."""
        return 0.0 if self.owner[a] == self.owner[b] else self.costs.link

    def stages_of(self, rank: int) -> list[int]:
        """The model stages on ``rank``, in the order a micro-batch's forward visits them."""
        return [s for s, r in enumerate(self.owner) if r == rank]

    def describe(self) -> dict:
        """JSON-ready summary of the problem."""
        return {"ranks": self.ranks, "microbatches": self.microbatches, "placement": self.placement,
                "max_activations": list(self.max_activations), "w_share": round(self.w_share, 6),
                "split_backward": self.split, "link": self.link,
                "costs": {k: self.table[k] for k in ("F", "I", "W", "B")}}


def make_problem(ranks: int, microbatches: int, max_activations: float | Sequence[float] | None = None,
                 placement: str = "wave", costs: Costs | None = None, w_share: float = M_W_SHARE,
                 split: bool = True, stage_memory: Sequence[float] | None = None) -> Problem:
    """Check the inputs (ScheduleError naming the broken invariant with its values) and build a Problem.

    max_activations: one cap for every rank or one per rank; None means no cap (GPipe's m).
    costs:           per-stage costs (``UNIT``: F = I = W = 1 by default); with ``split`` the I and W
                     costs are used, else B.
    """
    p = positive_int("ranks", ranks, error=ScheduleError, context="search: ")
    m = positive_int("microbatches", microbatches, error=ScheduleError, context="search: ")
    if p > MAX_STAGES or m > MAX_MICROBATCHES:
        raise ScheduleError(f"search: ranks {p} <= {MAX_STAGES} and microbatches {m} <= {MAX_MICROBATCHES} "
                            f"(the course's caps)")
    owner = stage_to_rank(placement, p)
    n_stages = len(owner)
    costs = costs or UNIT
    table = costs.per_stage(n_stages)
    table["B"] = [i + w for i, w in zip(table["I"], table["W"])] if split else table["B"]
    if not 0 <= w_share <= 1:
        raise ScheduleError(f"search: w_share is M_W / M_B, in [0, 1], got w_share {w_share}")
    v = n_stages // p
    sizes = tuple(1.0 / v for _ in range(n_stages)) if stage_memory is None else tuple(map(float, stage_memory))
    if len(sizes) != n_stages or not all(x > 0 for x in sizes):
        raise ScheduleError(f"search: stage_memory needs {n_stages} sizes > 0, got {list(sizes)}")
    caps = _caps(max_activations, p, m, sizes, owner)
    for r, cap in enumerate(caps):
        need = sum(sizes[s] for s in range(n_stages) if owner[s] == r)
        if cap < need - EPS:
            raise ScheduleError(
                f"search: max_activations {cap:g} on rank {r} < {need:g}, what one micro-batch holds there "
                f"(every stage of the rank at once: no schedule fits)")
    return Problem(p, m, placement, caps, costs, float(w_share), bool(split), sizes, owner, table)


def _caps(max_activations, p: int, m: int, sizes, owner) -> tuple[float, ...]:
    if max_activations is None:  # no cap: what every micro-batch on every stage of the rank holds
        return tuple(m * sum(sizes[s] for s in range(len(owner)) if owner[s] == r) for r in range(p))
    listed = [max_activations] * p if isinstance(max_activations, (int, float)) else list(max_activations)
    if len(listed) != p:
        raise ScheduleError(f"search: max_activations has {len(listed)} values for {p} ranks")
    for value in listed:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ScheduleError(f"search: max_activations must be > 0 (micro-batches of a rank's layers), "
                                f"got {value!r}")
    return tuple(float(x) for x in listed)


# ------------------------------------------------------------------------------------------------
# Judging one candidate.


def memory_deltas(problem: Problem, action: Action) -> float:
    """Change of held activations (rank units) an action makes: F +M_B, B -M_B, I -(M_B - M_W), W -M_W."""
    size = problem.stage_memory[action.stage]
    if action.kind == "F":
        return size
    if action.kind == "B":
        return -size
    if action.kind == "I":
        return -(1.0 - problem.w_share) * size
    return -problem.w_share * size


def peaks(problem: Problem, ranks: Sequence[Sequence[Action | None]]) -> list[float]:
    """Per rank, the most activations held after any action of its order (rank units)."""
    out = []
    for actions in ranks:
        held = peak = 0.0
        for a in actions:
            if a is not None:
                held += memory_deltas(problem, a)
                peak = max(peak, held)
        out.append(peak)
    return out


@dataclass(frozen=True)
class Judged:
    """One candidate, simulated: its makespan, per-rank spans (first action's start to last action's
    end) and busy time, per-rank peak memory (rank units) and whether it fits the cap."""

    schedule: Schedule
    makespan: float
    spans: tuple[float, ...]
    busy: tuple[float, ...]
    peaks: tuple[float, ...]
    fits: bool

    @property
    def longest_span(self) -> float:
        return max(self.spans)

    @property
    def span_idle(self) -> float:
        """Idle time inside the ranks' own spans, summed (0: every rank busy from its first action to
        its last, the Zero Bubble paper's objective met)."""
        return sum(s - b for s, b in zip(self.spans, self.busy))

    @property
    def key(self) -> tuple[float, float, float]:
        """Sort key: shortest makespan, then shortest longest span, then least idle inside spans."""
        return (round(self.makespan, 9), round(self.longest_span, 9), round(self.span_idle, 9))

    def step(self, synchronised: bool = True, sync: float = 0.0) -> float:
        """How long each of many back-to-back training steps of this schedule lasts, in steady state.

        ``synchronised``: the optimizer step waits for a global all-reduce over every rank (the
        gradient norm for clipping, a NaN/inf check), so every step ends at the last rank's last
        action, plus ``sync`` (the all-reduce), and the next starts from an empty pipeline: the
        makespan + ``sync``. Without it (Qi et al. 2023, section 4: the optimizer steps at once and
        is validated afterwards), each rank starts its next step as soon as its own last action
        is done; every rank's next step shifted by the same period keeps every dependency of the
        step, so the period is the longest span, first action to last, of any rank."""
        return self.makespan + sync if synchronised else self.longest_span

    def steady_bubble(self, synchronised: bool = True, sync: float = 0.0) -> float:
        """The idle share of the device time in steady state: ``1 - busy / (p * step)``."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.step(synchronised, sync))


def costs_for_simulation(problem: Problem) -> Costs:
    """The problem's costs as ``simulate`` takes them (per stage; I and W only with a split backward)."""
    t, c = problem.table, problem.costs
    return Costs(F=t["F"], B=t["B"], I=t["I"] if problem.split else None, W=t["W"] if problem.split else None,
                 latency=c.latency, bytes_per_message=c.bytes_per_message, bandwidth=c.bandwidth)


def evaluate(problem: Problem, schedule: Schedule, check: bool = True) -> Judged:
    """Validate ``schedule`` (``check``), simulate it with the problem's costs, count its memory."""
    if check:
        validate(schedule)
    timeline = simulate(schedule, costs_for_simulation(problem), w_share=problem.w_share)
    spans, busy = [], []
    for starts, ends in zip(timeline.starts, timeline.ends):
        if len(starts):
            spans.append(float(ends.max() - starts.min()))
            busy.append(float((ends - starts).sum()))
        else:
            spans.append(0.0)
            busy.append(0.0)
    held = peaks(problem, schedule.ranks)
    fits = all(h <= cap + EPS for h, cap in zip(held, problem.max_activations))
    return Judged(schedule, timeline.makespan, tuple(spans), tuple(busy), tuple(held), fits)


def back_to_back(schedule: Schedule, steps: int) -> Schedule:
    """``steps`` training steps of ``schedule`` as one schedule with no synchronisation between them:
    each rank runs its order again, micro-batch j of step k renamed j + k·m, right after its own last
    action (the optimizer step taking no time). ``simulate`` on it shows what ``Judged.step`` says
    without the synchronisation: the steps overlap, one longest span apart."""
    m = schedule.n_microbatches
    rows = [[Action(a.stage, a.kind, a.microbatch + k * m) for k in range(steps) for a in row if a is not None]
            for row in schedule.ranks]
    return Schedule(schedule.name, schedule.n_ranks, m * steps, schedule.virtual, schedule.stage_to_rank, rows)


def as_schedule(problem: Problem, name: str, orders: Sequence[Sequence[Action]]) -> Schedule:
    """Per-rank orders as a Schedule of the problem's shape."""
    return Schedule(name, problem.ranks, problem.microbatches, problem.virtual, problem.owner,
                    [list(row) for row in orders])
