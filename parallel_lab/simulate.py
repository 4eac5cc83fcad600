"""Cost model and simulator: a schedule plus per-action costs -> a timeline on p dedicated devices.

List scheduling, as in the papers' bubble analyses (GPipe, Huang et al. 2019; PipeDream-Flush and
Megatron interleaving, Narayanan et al. 2021; Zero Bubble, Qi et al. 2023): each rank runs its
actions in schedule order, and an action starts at max(rank free, every input arrived), where an
input from another rank arrives at its producer's end plus the link cost. No processes are started;
`parallel_lab.schedules` gives the actions and their dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, Union

from .schedules import Action, Schedule, ScheduleError, validate

Cost = Union[float, Sequence[float]]  # one value for every stage, or one per model stage
MAX_GRID_CELLS = 1_000_000  # unit grids larger than this (huge integer costs) fall back to action order


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
    makespan:           end of the last action
    busy[r]:            total compute time of rank r
    bubble_fraction:    1 - sum(busy) / (n_ranks * makespan), the idle share of the device-time box
    memory[s]:          [(time, stashed microbatches), ...] for model stage s, a step function
    peak_activations:   per stage, the most microbatches stashed at once
    peak_rank_activations: per rank, the most stashed at once over all its stages

    A microbatch's activations are stashed on a stage from the start of its F until the end of the
    backward that frees them: B, or I when the backward is split. That is the Zero Bubble paper's
    accounting (Qi et al. 2023, Table 1): I releases the activations and W keeps only its small
    M_W (the stage input and output gradient), so ZB-H1 peaks at 1F1B's min(m, p-r) on stage r.
    """

    schedule: Schedule = field(repr=False)
    costs: Costs
    ranks: list[list[tuple[Action, float, float]]] = field(repr=False)
    makespan: float
    busy: list[float]
    memory: list[list[tuple[float, int]]] = field(repr=False)
    peak_activations: list[int]
    peak_rank_activations: list[int]

    @property
    def bubble_fraction(self) -> float:
        if self.makespan == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.schedule.n_ranks * self.makespan)


def _hop_costs(schedule: Schedule, link: float) -> tuple[list[float], list[float]]:
    """Per stage s, the link cost of its input from stage s-1 and of its gradient from stage s+1."""
    rank_of, n = schedule.stage_to_rank, schedule.n_stages
    from_prev = [link if s > 0 and rank_of[s - 1] != rank_of[s] else 0.0 for s in range(n)]
    from_next = [link if s + 1 < n and rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n)]
    return from_prev, from_next


def _schedule_times(schedule: Schedule, costs: Costs) -> list[list[tuple[Action, float, float]]]:
    """Start/end of every action by list scheduling; raises ScheduleError when the schedule is stuck.

    Each rank runs its actions in order until one misses an input from another rank; it then parks
    on that input (slot stage*m + microbatch) and is resumed when the producer runs. Every action
    is visited once: O(actions).
    """
    n_stages, m, last = schedule.n_stages, schedule.n_microbatches, schedule.n_stages - 1
    table = costs.per_stage(n_stages)
    from_prev, from_next = _hop_costs(schedule, costs.link)
    dur_f, dur_w = table["F"], table["W"]
    fwd_end: list[float | None] = [None] * (n_stages * m)  # end of F, by stage*m + microbatch
    grad_end: list[float | None] = [None] * (n_stages * m)  # end of B, or of I when split
    lists = [[a for a in actions if a is not None] for actions in schedule.ranks]
    starts: list[list[float]] = [[] for _ in lists]
    ends: list[list[float]] = [[] for _ in lists]
    pos, free = [0] * len(lists), [0.0] * len(lists)
    # a valid schedule has one consumer per result on another rank: F(s+1) of an activation, B/I(s-1)
    # of a gradient; a rank blocked on it parks in that slot (an invalid one ends stuck -> validate)
    parked_on_fwd, parked_on_grad = [-1] * (n_stages * m), [-1] * (n_stages * m)
    ready = list(range(len(lists)))
    while ready:
        rank = ready.pop()
        actions, i, clock = lists[rank], pos[rank], free[rank]
        n, rank_starts, rank_ends = len(actions), starts[rank], ends[rank]
        while i < n:
            s, kind, j = actions[i]
            key = s * m + j
            if kind == "F":
                if s > 0:
                    t = fwd_end[key - m]
                    if t is None:
                        parked_on_fwd[key - m] = rank
                        break
                    t += from_prev[s]
                    if t > clock:
                        clock = t
                rank_starts.append(clock)
                clock = fwd_end[key] = clock + dur_f[s]
                woken = parked_on_fwd[key]
            elif kind == "W":
                if grad_end[key] is None:
                    break  # its I comes later on this rank: stuck, reported by validate below
                rank_starts.append(clock)
                clock += dur_w[s]
                woken = -1
            else:
                if fwd_end[key] is None:
                    break  # its F comes later on this rank
                if s < last:
                    t = grad_end[key + m]
                    if t is None:
                        parked_on_grad[key + m] = rank
                        break
                    t += from_next[s]
                    if t > clock:
                        clock = t
                rank_starts.append(clock)
                clock = grad_end[key] = clock + table[kind][s]
                woken = parked_on_grad[key]
            rank_ends.append(clock)
            if woken >= 0:
                ready.append(woken)
            i += 1
        pos[rank], free[rank] = i, clock
    if any(i < len(actions) for i, actions in zip(pos, lists)):
        validate(schedule)  # raises, naming the offending action
        raise ScheduleError(f"{schedule.name}: simulation stuck although the schedule validates")
    return [list(zip(*columns)) for columns in zip(lists, starts, ends)]


def _memory(schedule: Schedule, ranks_times) -> tuple[list[list[tuple[float, int]]], list[int], list[int]]:
    """Stash curves per stage (F start +1, B/I end -1) and peaks per stage and per rank."""
    memory: list[list[tuple[float, int]]] = [[(0.0, 0)] for _ in range(schedule.n_stages)]
    count, peak, rank_peak = [0] * schedule.n_stages, [0] * schedule.n_stages, []
    for timed in ranks_times:
        held = rank_max = 0
        for (s, kind, _), start, end in timed:  # one rank runs its stages' actions sequentially
            if kind == "F":
                count[s] += 1
                held += 1
                memory[s].append((start, count[s]))
                peak[s] = max(peak[s], count[s])
                rank_max = max(rank_max, held)
            elif kind != "W":
                count[s] -= 1
                held -= 1
                memory[s].append((end, count[s]))
        rank_peak.append(rank_max)
    return memory, peak, rank_peak


def simulate(schedule: Schedule, costs: Costs | None = None) -> Timeline:
    """Simulate `schedule` with `costs` (default F=1, B=2, I=W=1, free links) into a Timeline.

    O(actions): every action is visited once, blocked ranks wait on the one input they miss.
    An invalid schedule raises the same ScheduleError as `validate`.
    """
    costs = costs or Costs()
    times = _schedule_times(schedule, costs)
    busy = [sum(end - start for _, start, end in timed) for timed in times]
    makespan = max((timed[-1][2] for timed in times if timed), default=0.0)
    memory, peak, rank_peak = _memory(schedule, times)
    return Timeline(schedule, costs, times, makespan, busy, memory, peak, rank_peak)


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
    """The `parallel-lab schedule NAME --json` object (see DESIGN.md, Contracts).

    {"schedule", "stages" (p ranks), "microbatches", "virtual", "model_stages" (p*v),
     "ranks" (rank -> unit grid, see `unit_grid`), "makespan", "bubble_fraction",
     "peak_activations" (per model stage)}
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
    }
