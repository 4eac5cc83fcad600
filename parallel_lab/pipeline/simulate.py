"""Cost model and simulator: a schedule plus per-action costs -> a timeline on p dedicated devices.

List scheduling, as in the papers' bubble analyses (GPipe, Huang et al. 2019; PipeDream-Flush and
Megatron interleaving, Narayanan et al. 2021; Zero Bubble, Qi et al. 2023): each rank runs its
actions in schedule order, and an action starts at max(rank free, every input arrived), where an
input from another rank arrives at its producer's end plus the link cost. No processes are started;
`parallel_lab.pipeline.schedules` gives the actions and their dependencies. The computation is vectorised
with numpy (a max-plus scan per rank, swept until it settles; see `_schedule_times`) so that the
course's caps, p = 64 ranks and m = 512 microbatches, answer at slider speed
(`parallel-lab bench simulator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import Mapping, NamedTuple, Sequence, Union

import numpy as np

from parallel_lab.pipeline.schedules import Action, Schedule, ScheduleError
from parallel_lab.pipeline.validate import validate

Cost = Union[float, Sequence[float]]  # one value for every stage, or one per model stage
MAX_GRID_CELLS = 1_000_000  # unit grids larger than this (huge integer costs) fall back to action order
SWEEPS_BEFORE_VALIDATE = 64  # the paper schedules settle in 2-11 sweeps; a deadlock never does
# What W keeps between I and W, as a share of a micro-batch's activations M_B. Qi et al. 2023 ("Zero
# Bubble Pipeline Parallelism"), Table 1, for a transformer layer: M_B = 34sbh + 5as^2b, M_W = 32sbh
# (W needs every Linear's input and output gradient). With the attention scores not stored (flash
# attention, or Korthikanti et al.'s selective recomputation) M_B = 34sbh, so M_W / M_B = 32/34.
M_W_SHARE = 32 / 34


@dataclass(frozen=True)
class Costs:
    """Durations of F, B, I, W (scalar, or a sequence indexed by model stage) and the link model.

    I and W default to B/2 each (used only by schedules that split the backward). Sending one
    activation or gradient between ranks costs latency + bytes_per_message / bandwidth; the default
    link is free, so bubbles come from the schedule alone.
    """

    F: Cost = 1.0
    B: Cost = 2.0
    I: Cost | None = None
    W: Cost | None = None
    latency: float = 0.0
    bytes_per_message: float = 0.0
    bandwidth: float = math.inf

    def __post_init__(self) -> None:
        for kind in "FBIW":
            values = getattr(self, kind)
            for value in [] if values is None else _as_list(values):
                if not value > 0:
                    raise ScheduleError(f"cost {kind} must be > 0, got {kind} {value}")
        if self.latency < 0 or self.bytes_per_message < 0 or not self.bandwidth > 0:
            raise ScheduleError(
                f"link needs latency >= 0, bytes_per_message >= 0, bandwidth > 0, got latency "
                f"{self.latency}, bytes_per_message {self.bytes_per_message}, bandwidth {self.bandwidth}"
            )

    @property
    def link(self) -> float:
        """Seconds (or time units) to move one message between two ranks."""
        return self.latency + self.bytes_per_message / self.bandwidth

    def per_stage(self, n_stages: int) -> dict[str, list[float]]:
        """{"F": [F of stage 0, ...], "B": ..., "I": ..., "W": ...}, each of length n_stages."""
        table = {kind: _broadcast(kind, getattr(self, kind), n_stages) for kind in "FB"}
        for kind in "IW":
            given = getattr(self, kind)
            table[kind] = [b / 2 for b in table["B"]] if given is None else _broadcast(kind, given, n_stages)
        return table


def _as_list(values: Cost) -> list[float]:
    return [float(values)] if isinstance(values, (int, float)) else [float(v) for v in values]


def _broadcast(kind: str, values: Cost, n_stages: int) -> list[float]:
    listed = _as_list(values)
    if isinstance(values, (int, float)):
        return listed * n_stages
    if len(listed) != n_stages:
        raise ScheduleError(f"cost {kind} has {len(listed)} per-stage values, schedule has {n_stages} stages")
    return listed


def parse_costs(text: str) -> Costs:
    """`--costs F,B,W` -> Costs: "1,2,1" gives F=1, B=2, W=1 and I = B - W = 1; "1,2" leaves I=W=B/2."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ScheduleError(f"--costs needs numbers 'F,B' or 'F,B,W', got {text!r}") from None
    if len(values) not in (2, 3):
        raise ScheduleError(f"--costs needs 2 or 3 numbers 'F,B[,W]', got {len(values)} in {text!r}")
    if len(values) == 2:
        return Costs(F=values[0], B=values[1])
    f, b, w = values
    if not 0 < w < b:
        raise ScheduleError(f"--costs F,B,W needs 0 < W < B (B = I + W), got B {b}, W {w}")
    return Costs(F=f, B=b, I=b - w, W=w)


@dataclass(frozen=True)
class Timeline:
    """A simulated run.

    ranks[r]:           [(action, start, end), ...] in execution order
    starts[r], ends[r]: the same times as numpy arrays (what `ranks` is built from, on first use)
    makespan:           end of the last action
    busy[r]:            total compute time of rank r
    bubble_fraction:    1 - sum(busy) / (n_ranks * makespan), the idle share of the device-time box
    memory[s]:          [(time, activations held), ...] for model stage s, a step function
    peak_activations:   per stage, the most activations held at once
    peak_rank_activations: per rank, the most held at once over all its stages
    w_share:            M_W / M_B, what a microbatch keeps from its I to its W

    Activations are counted in units of one microbatch's activations on its stage, M_B. A
    microbatch holds M_B from the start of its F. A full backward B frees all of it. A split one
    frees only M_B - M_W at the end of I: W still needs every Linear's input and its output gradient,
    M_W, which is most of M_B (Qi et al. 2023, Table 1: 32sbh of 34sbh, `M_W_SHARE`), and frees it
    at its own end. So schedules that defer W hold more than their I order suggests: ZB-H1 defers r
    W's on rank r and peaks at (p - r) M_B + r M_W there, not 1F1B's (p - r) M_B (m >= p).
    """

    schedule: Schedule = field(repr=False)
    costs: Costs
    starts: list[np.ndarray] = field(repr=False)
    ends: list[np.ndarray] = field(repr=False)
    makespan: float
    busy: list[float]
    peak_activations: list[float]
    peak_rank_activations: list[float]
    w_share: float
    _stash: tuple = field(repr=False, compare=False)  # (times, counts, stage bounds) for `memory`

    @property
    def bubble_fraction(self) -> float:
        if self.makespan == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.schedule.n_ranks * self.makespan)

    @cached_property
    def ranks(self) -> list[list[tuple[Action, float, float]]]:
        rows = ([a for a in actions if a is not None] for actions in self.schedule.ranks)
        return [list(zip(row, s.tolist(), e.tolist())) for row, s, e in zip(rows, self.starts, self.ends)]

    @cached_property
    def memory(self) -> list[list[tuple[float, int]]]:
        times, counts, bounds = self._stash
        return [[(0.0, 0)] + list(zip(times[lo:hi].tolist(), counts[lo:hi].tolist()))
                for lo, hi in zip(bounds[:-1], bounds[1:])]


# ------------------------------------------------------------------------------------------------
# The schedule as flat arrays: every rank's actions one after the other, idle slots dropped.

_KIND_CODE = np.full(128, -1, np.int64)  # ASCII letter -> 0 F, 1 B, 2 I, 3 W; -1 for anything else
_KIND_CODE[[ord(kind) for kind in "FBIW"]] = range(4)


class _Flat(NamedTuple):
    offsets: np.ndarray  # rank r's actions are flat[offsets[r]:offsets[r + 1]], in schedule order
    rank: np.ndarray
    stage: np.ndarray
    kind: np.ndarray  # 0 F, 1 B, 2 I, 3 W
    microbatch: np.ndarray


def _invalid(schedule: Schedule, what: str) -> ScheduleError:
    """A fast check below failed: `validate` raises the error that names the offending action."""
    validate(schedule)
    return ScheduleError(f"{schedule.name}: {what}, yet validate() accepts it")


def _flatten(schedule: Schedule) -> _Flat:
    rows = [[a for a in actions if a is not None] for actions in schedule.ranks]
    lengths = [len(row) for row in rows]
    every = list(chain.from_iterable(rows))
    n = len(every)
    try:
        kinds = "".join(map(itemgetter(1), every)).encode("ascii")
        if len(kinds) != n:
            raise ValueError("a kind longer than one letter")
        flat = _Flat(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
                     np.repeat(np.arange(len(rows)), lengths),
                     np.fromiter(map(itemgetter(0), every), np.int64, count=n),
                     _KIND_CODE[np.frombuffer(kinds, np.uint8)],
                     np.fromiter(map(itemgetter(2), every), np.int64, count=n))
    except (TypeError, ValueError, IndexError):
        raise _invalid(schedule, "an action is not (stage, kind F/B/I/W, microbatch)") from None
    in_range = not n or (
        (flat.kind >= 0).all()
        and 0 <= flat.stage.min() and flat.stage.max() < schedule.n_stages
        and 0 <= flat.microbatch.min() and flat.microbatch.max() < schedule.n_microbatches
        and np.array_equal(np.asarray(schedule.stage_to_rank)[flat.stage], flat.rank))
    if len(rows) != schedule.n_ranks or not in_range:
        raise _invalid(schedule, "an action is out of range or on a rank that does not hold its stage")
    return flat


def _inputs(schedule: Schedule, flat: _Flat, link: float) -> tuple[np.ndarray, np.ndarray]:
    """Per action, the position of the input it receives from a neighbouring stage (F(s-1) for F,
    the input-gradient pass B/I of stage s+1 for B and I; -1 for none) and that message's link cost
    (0 between stages on one rank).

    Checks validate's invariants on the way, vectorised: one F per (stage, microbatch) and either one
    B or one I and one W; no action before one of its inputs on its own rank.
    """
    n_stages, m = schedule.n_stages, schedule.n_microbatches
    key = flat.stage * m + flat.microbatch
    is_f, is_i, is_w = flat.kind == 0, flat.kind == 2, flat.kind == 3
    is_g = (flat.kind == 1) | is_i  # the pass that produces the gradient stage s-1 waits for
    count = [np.bincount(key[mask], minlength=n_stages * m) for mask in (is_f, is_g, is_i, is_w)]
    if not ((count[0] == 1).all() and (count[1] == 1).all() and np.array_equal(count[2], count[3])):
        raise _invalid(schedule, "an F, B, I or W is missing or repeated")
    position = np.arange(len(key))
    f_at, g_at = np.empty(n_stages * m, np.int64), np.empty(n_stages * m, np.int64)
    f_at[key[is_f]], g_at[key[is_g]] = position[is_f], position[is_g]
    from_prev = is_f & (flat.stage > 0)
    from_next = is_g & (flat.stage < n_stages - 1)
    edges = [(position[from_prev], f_at[key[from_prev] - m]),  # F(s, j) <- F(s-1, j)
             (position[from_next], g_at[key[from_next] + m]),  # B/I(s, j) <- B/I(s+1, j)
             (position[is_g], f_at[key[is_g]]),  # B/I(s, j) <- F(s, j), on its own rank
             (position[is_w], g_at[key[is_w]])]  # W(s, j) <- I(s, j), on its own rank
    for consumer, producer in edges:
        if ((flat.rank[producer] == flat.rank[consumer]) & (producer > consumer)).any():
            raise _invalid(schedule, "an action runs before its input on the same rank")
    source = np.full(len(key), -1, np.int64)
    for consumer, producer in edges[:2]:
        source[consumer] = producer
    hop = np.where((source >= 0) & (flat.rank[source] != flat.rank), link, 0.0)
    return source, hop


# ------------------------------------------------------------------------------------------------
# Timing: list scheduling as a max-plus scan per rank.


def _schedule_times(schedule: Schedule, costs: Costs, flat: _Flat,
                    durations: Mapping[Action, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every flat action by list scheduling; ScheduleError when it cannot finish.

    An action starts at max(end of the previous action on its rank, arrival of its input). Along
    one rank, with C the running sum of durations and R the arrival times, that recurrence is a
    max-plus scan: end = C + running_max(R - (C - duration)), one numpy expression. Arrivals depend
    on other ranks, so the scans repeat, ranks 0..p-1 (activations flow down) then p-1..0
    (gradients flow up), starting from "nobody waits" (a lower bound) until a sweep changes nothing:
    Gauss-Seidel on the dependency graph, exact, each sweep settling every path that turns around
    at most once (the paper schedules take 2-11 sweeps). A deadlock never settles: after
    SWEEPS_BEFORE_VALIDATE sweeps, `validate` looks for the cycle and names it.
    """
    table = costs.per_stage(schedule.n_stages)
    by_kind = np.array([table[kind] for kind in "FBIW"])  # [kind, stage]
    duration = by_kind[flat.kind, flat.stage]
    if durations:
        every = [a for actions in schedule.ranks for a in actions if a is not None]
        duration = np.array([durations.get(a, d) for a, d in zip(every, duration.tolist())])
        if not (duration > 0).all():
            raise ScheduleError(f"durations must be > 0, got {min(duration)}")
    source, hop = _inputs(schedule, flat, costs.link)
    has_input, source = source >= 0, np.maximum(source, 0)
    ready = np.zeros(len(duration))  # end of every rank's chain if nobody ever waited
    for lo, hi in zip(flat.offsets[:-1], flat.offsets[1:]):
        ready[lo:hi] = np.cumsum(duration[lo:hi])
    begun = ready - duration
    end = ready.copy()
    spans = [(lo, hi) for lo, hi in zip(flat.offsets[:-1].tolist(), flat.offsets[1:].tolist()) if hi > lo]
    order = spans + spans[::-1]
    sweeps = 0
    while True:
        changed = False
        for lo, hi in order:
            arrival = np.where(has_input[lo:hi], end[source[lo:hi]] + hop[lo:hi], 0.0)
            new = ready[lo:hi] + np.maximum.accumulate(arrival - begun[lo:hi])
            if not changed and not np.array_equal(new, end[lo:hi]):
                changed = True
            end[lo:hi] = new
        sweeps += 1
        if not changed:
            return end - duration, end
        if sweeps == SWEEPS_BEFORE_VALIDATE:
            validate(schedule)  # raises for a deadlock; a valid schedule settles in the sweeps to come


def _memory(schedule: Schedule, flat: _Flat, start: np.ndarray, end: np.ndarray, w_share: float):
    """Activation curves per stage (F start +1, B end -1, I end -(1 - w_share), W end -w_share) and
    peaks per stage and per rank, in units of M_B (see Timeline).

    Returns ((event times, held, per-stage bounds into them), peak per stage, peak per rank).
    """
    change = np.select([flat.kind == 0, flat.kind == 1, flat.kind == 2], [1.0, -1.0, w_share - 1.0], -w_share)
    held = np.cumsum(change)
    rank_peak = []
    for lo, hi in zip(flat.offsets[:-1].tolist(), flat.offsets[1:].tolist()):
        before = held[lo - 1] if lo else 0.0
        rank_peak.append(units(max(0.0, (held[lo:hi] - before).max())) if hi > lo else 0)
    # per stage: its events in time order (one rank runs a stage, so its order is the schedule's)
    events = np.flatnonzero(change)
    events = events[np.argsort(flat.stage[events], kind="stable")]
    stages = flat.stage[events]
    counts = np.cumsum(change[events])
    bounds = np.searchsorted(stages, np.arange(schedule.n_stages + 1))
    first = np.concatenate([[0.0], counts])[bounds[:-1]]  # running total before each stage's first event
    counts = np.round(counts - np.repeat(first, np.diff(bounds)), 9)
    times = np.where(flat.kind[events] == 0, start[events], end[events])
    peak = np.zeros(schedule.n_stages)
    np.maximum.at(peak, stages, counts)
    return (times, counts, bounds), [units(x) for x in peak.tolist()], rank_peak


def units(x: float) -> float | int:
    """A count of M_B units as printed: 4 for whole numbers (every schedule without a split backward),
    else rounded to 6 digits (3.823529)."""
    x = round(float(x), 6)
    return int(x) if x == int(x) else x


def simulate(schedule: Schedule, costs: Costs | None = None, w_share: float = M_W_SHARE,
             durations: Mapping[Action, float] | None = None) -> Timeline:
    """Simulate `schedule` with `costs` (default F=1, B=2, I=W=1, free links) into a Timeline.

    w_share is M_W / M_B, what a split backward keeps from I to W (default: the transformer layer of
    Qi et al. 2023, `M_W_SHARE`); a run on real ranks passes the share its tensors measured.
    durations, {action: time}, overrides the cost of those actions (a finer cost model than one
    value per kind and stage: `pipeline.run` predicts with what came before each action on its rank).

    Vectorised: a few numpy passes over all actions per sweep (see `_schedule_times`), so p = 64
    ranks and m = 512 microbatches simulate at slider speed. An invalid schedule raises the same
    ScheduleError as `validate`.
    """
    costs = costs or Costs()
    if not 0 <= w_share:
        raise ScheduleError(f"w_share is M_W / M_B and must be >= 0, got w_share {w_share}")
    flat = _flatten(schedule)
    start, end = _schedule_times(schedule, costs, flat, durations)
    spans = list(zip(flat.offsets[:-1].tolist(), flat.offsets[1:].tolist()))
    starts, ends = [start[lo:hi] for lo, hi in spans], [end[lo:hi] for lo, hi in spans]
    busy = [float((e - s).sum()) for s, e in zip(starts, ends)]
    makespan = float(end.max()) if len(end) else 0.0
    stash, peak, rank_peak = _memory(schedule, flat, start, end, float(w_share))
    return Timeline(schedule, costs, starts, ends, makespan, busy, peak, rank_peak, float(w_share), stash)


def unit_grid(timeline: Timeline) -> dict[int, list[str | None]]:
    """rank -> action strings on a unit time grid, None where idle.

    When every start and end is a whole number (the usual case, integer costs and link), slot t
    holds the action running during [t, t+1): an action of cost 2 fills two slots. Otherwise (or
    when that grid would exceed MAX_GRID_CELLS) each rank lists its actions in order with one None
    wherever it idles between two of them.
    """
    times = [x for timed in timeline.ranks for _, s, e in timed for x in (s, e)]
    integral = all(abs(x - round(x)) < 1e-9 for x in times)
    integral = integral and len(timeline.ranks) * timeline.makespan <= MAX_GRID_CELLS
    grid: dict[int, list[str | None]] = {}
    for rank, timed in enumerate(timeline.ranks):
        if integral:
            row: list[str | None] = [None] * round(timeline.makespan)
            for a, start, end in timed:
                row[round(start):round(end)] = [str(a)] * (round(end) - round(start))
        else:
            row, clock = [], 0.0
            for a, start, end in timed:
                if start > clock + 1e-9:
                    row.append(None)
                row.append(str(a))
                clock = end
        grid[rank] = row
    return grid


def summary(schedule: Schedule, costs: Costs | None = None) -> dict:
    """The `parallel-lab schedule NAME --json` object (see ARCHITECTURE.md, "The command line").

    {"schedule", "stages" (p ranks), "microbatches", "virtual", "model_stages" (p*v),
     "ranks" (rank -> unit grid, see `unit_grid`), "makespan", "bubble_fraction",
     "peak_activations" (per model stage, in M_B, counted until W), "w_share" (M_W / M_B)}
    """
    timeline = simulate(validate(schedule), costs)
    return {
        "schedule": schedule.name,
        "stages": schedule.n_ranks,
        "microbatches": schedule.n_microbatches,
        "virtual": schedule.virtual,
        "model_stages": schedule.n_stages,
        "ranks": unit_grid(timeline),
        "makespan": timeline.makespan,
        "bubble_fraction": timeline.bubble_fraction,
        "peak_activations": timeline.peak_activations,
        "w_share": round(timeline.w_share, 6),
    }
