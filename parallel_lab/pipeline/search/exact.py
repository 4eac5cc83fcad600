"""The optimum of small cases, with OR-Tools' CP-SAT solver: how far the heuristic is from it, measured.

    from parallel_lab.pipeline.search.exact import solve
    best = solve(problem, time_limit=60, hint=found.schedule)   # status "optimal" or "feasible"
    best.makespan, best.lower_bound, best.schedule

The model (a job-shop with a memory resource; the Zero Bubble authors solve the same question as
an integer program, Qi et al. 2023, section 3 and its appendix): every pass F, I, W (or B) of every
(stage, micro-batch) is an interval of its cost on its stage's rank; the intervals of one rank do
not overlap; F(s) waits for F(s-1) plus the link, I(s) for F(s) and for I(s+1) plus the link, W(s)
for I(s). Memory is a cumulative resource per rank with the cap as its capacity: a micro-batch
holds M_B - M_W from the start of its F to the end of its I, and M_W to the end of its W (B: M_B
to its end), which is the simulator's count (``problem``). The makespan is minimised.

Like the Zero Bubble scheduler's graph and the greedy, the passes of one kind on one stage run in
micro-batch order (``ordered=True``), which removes the m! relabellings of identical
micro-batches; ``ordered=False`` drops it (tests check on the smallest cases that the optimum is the
same). Costs and memory are scaled to integers exactly when they are fractions with small
denominators (unit costs, M_W / M_B = 32/34), else rounded (the result is re-timed by the simulator
and its memory re-counted either way).

CP-SAT is part of OR-Tools (``ortools`` on PyPI, Apache-2.0), imported only when ``solve`` runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError
from parallel_lab.pipeline.search.problem import Judged, Problem, as_schedule, costs_for_simulation, evaluate
from parallel_lab.pipeline.simulate import simulate

STATUS = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "INFEASIBLE": "infeasible", "UNKNOWN": "unknown",
          "MODEL_INVALID": "invalid"}


@dataclass(frozen=True)
class Solved:
    """CP-SAT's answer: ``status`` ("optimal": proved; "feasible": the best found in the time;
    "infeasible": no schedule fits the cap; "unknown"), its ``schedule`` re-judged by the simulator
    (``judged``; None when nothing was found), ``lower_bound`` (what no schedule of the class can
    beat, in the problem's time units), ``seconds`` spent."""

    status: str
    judged: Judged | None
    lower_bound: float
    seconds: float

    @property
    def schedule(self) -> Schedule | None:
        return None if self.judged is None else self.judged.schedule

    @property
    def makespan(self) -> float:
        return math.inf if self.judged is None else self.judged.makespan


def _integer_scale(values, limit: int = 10_000) -> int:
    """The least common denominator of ``values`` as fractions (denominators up to 1000), if <= limit,
    else ``limit`` (then the values are rounded)."""
    scale = 1
    for x in values:
        scale = math.lcm(scale, Fraction(x).limit_denominator(1000).denominator)
        if scale > limit:
            return limit
    return scale


def solve(problem: Problem, time_limit: float = 30.0, hint: Schedule | None = None, workers: int = 2,
          ordered: bool = True, horizon: float | None = None) -> Solved:
    """The shortest schedule of ``problem`` (see the module doc), within ``time_limit`` seconds on
    ``workers`` threads. ``hint``: a schedule to start from (the heuristic's; its makespan also bounds
    the horizon unless ``horizon`` is given)."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as err:  # pragma: no cover - ortools is a dependency; say what is missing if not
        raise ScheduleError("the exact solver needs OR-Tools: pip install ortools") from err
    started = time.perf_counter()
    p, m, n = problem.ranks, problem.microbatches, problem.n_stages
    t = problem.table
    back = "I" if problem.split else "B"
    kinds = ("F", back, "W") if problem.split else ("F", back)
    k = _integer_scale([x for kind in kinds for x in t[kind]] + [problem.link])
    dur = {kind: [max(1, round(x * k)) for x in t[kind]] for kind in kinds}
    link = round(problem.link * k)
    hints = _hint_times(problem, hint) if hint is not None else None
    if horizon is None:
        horizon = hints[1] if hints else sum(sum(d) for d in dur.values()) * m / k + 2 * n * problem.link
    top = math.ceil(horizon * k + 1e-9)

    model = cp_model.CpModel()
    start, end, interval = {}, {}, {}
    for s in range(n):
        for j in range(m):
            for kind in kinds:
                d = dur[kind][s]
                key = (s, kind, j)
                start[key] = model.NewIntVar(0, max(0, top - d), f"s{s}{kind}{j}")
                end[key] = start[key] + d
                interval[key] = model.NewFixedSizeIntervalVar(start[key], d, f"i{s}{kind}{j}")
    for r in range(p):
        model.AddNoOverlap([interval[(s, kind, j)] for s in problem.stages_of(r) for j in range(m) for kind in kinds])
    for s in range(n):
        hop_prev = 0 if s == 0 or problem.owner[s - 1] == problem.owner[s] else link
        hop_next = 0 if s == n - 1 or problem.owner[s + 1] == problem.owner[s] else link
        for j in range(m):
            if s > 0:
                model.Add(start[(s, "F", j)] >= end[(s - 1, "F", j)] + hop_prev)
            model.Add(start[(s, back, j)] >= end[(s, "F", j)])
            if s < n - 1:
                model.Add(start[(s, back, j)] >= end[(s + 1, back, j)] + hop_next)
            if problem.split:
                model.Add(start[(s, "W", j)] >= end[(s, back, j)])
            if ordered and j > 0:
                for kind in kinds:
                    model.Add(start[(s, kind, j)] >= end[(s, kind, j - 1)])
    _memory(model, problem, start, end, kinds, back, top)
    makespan = model.NewIntVar(0, top, "makespan")
    for key in end:
        model.Add(makespan >= end[key])
    model.Minimize(makespan)
    if hints:
        for key, value in hints[0].items():
            model.AddHint(start[key], round(value * k))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    code = solver.Solve(model)
    status = STATUS.get(solver.StatusName(code), solver.StatusName(code).lower())
    judged = None
    if status in ("optimal", "feasible"):
        orders = []
        for r in range(p):
            keys = [(s, kind, j) for s in problem.stages_of(r) for j in range(m) for kind in kinds]
            keys.sort(key=lambda key: solver.Value(start[key]))
            orders.append([Action(s, kind, j) for s, kind, j in keys])
        judged = evaluate(problem, as_schedule(problem, "exact", orders))
    bound = solver.BestObjectiveBound() / k if status != "infeasible" else math.inf
    return Solved(status, judged, bound, time.perf_counter() - started)


def _memory(model, problem: Problem, start, end, kinds, back: str, top: int) -> None:
    """One cumulative resource per rank: what each micro-batch holds on each stage, from F to I (or B)
    and from F to W, against the rank's cap, all scaled to integers."""
    shares = [problem.w_share, *problem.stage_memory, *problem.max_activations]
    q = _integer_scale(shares)
    for r in range(problem.ranks):
        intervals, demands = [], []
        for s in problem.stages_of(r):
            size = problem.stage_memory[s]
            parts = ([(back, (1 - problem.w_share) * size), ("W", problem.w_share * size)] if problem.split
                     else [(back, size)])
            for j in range(problem.microbatches):
                for kind, held in parts:
                    demand = round(held * q)
                    if demand <= 0:
                        continue
                    length = model.NewIntVar(0, top, f"held{s}{kind}{j}")
                    intervals.append(model.NewIntervalVar(start[(s, "F", j)], length, end[(s, kind, j)],
                                                          f"m{s}{kind}{j}"))
                    demands.append(demand)
        model.AddCumulative(intervals, demands, math.floor(problem.max_activations[r] * q + 1e-6))


def _hint_times(problem: Problem, schedule: Schedule) -> tuple[dict, float] | None:
    """The start time of every pass of ``schedule`` as the simulator times it, and its makespan; None
    when the schedule is not of the problem's class (another shape or backward, micro-batches out of
    order on a stage, over the cap): then it can neither seed the search nor bound its horizon."""
    try:
        judged = evaluate(problem, schedule)
    except ScheduleError:
        return None
    if not judged.fits or schedule.stage_to_rank != problem.owner or schedule.split_backward != problem.split:
        return None
    seen: dict[tuple[int, str], int] = {}
    for _, _, a in schedule.actions():
        if seen.get((a.stage, a.kind), -1) != a.microbatch - 1:
            return None
        seen[(a.stage, a.kind)] = a.microbatch
    timeline = simulate(schedule, costs_for_simulation(problem), w_share=problem.w_share)
    times = {(a.stage, a.kind, a.microbatch): s for row in timeline.ranks for a, s, _ in row}
    return times, judged.makespan
