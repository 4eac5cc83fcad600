"""The schedule search: ``search`` (the shortest schedule found under a memory cap), ``front`` (the
best step at each cap: a bubble-memory front) and ``profile_stages`` (costs measured on real ranks).

    found = search(4, 12, max_activations=4)           # F = I = W = 1, one stage per rank
    found.schedule                                      # a validated Schedule, named "search"
    found.makespan, found.bubble_fraction, found.peak_rank_activations, found.origin
    search(4, 12, max_activations=2, placement="v")    # the V placement, half of 1F1B's memory
    front(4, 12, caps=(1, 2, 3, 4, 8))                 # [(cap, makespan, bubble), ...]

What it does (``problem`` says how memory and the step are counted):
1. candidates: every variant of the greedy (``greedy``), the controllable-memory building blocks
   for the V placement (``blocks``), the course's generators of the same placement (1F1B, ZB-H1;
   ZB-V, DualPipeV) and their orders kept under the cap (``greedy.follow``), each kept only if it
   fits the cap;
2. the best of each kind is improved by local search (``improve``), within a budget of timed moves;
3. the best by (makespan, longest span, idle inside spans) is validated, simulated and returned.
With ``exact=True`` (OR-Tools' CP-SAT, small cases) the solver starts from that schedule and
returns the optimum when it proves one in ``time_limit``, with its lower bound either way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.search import blocks, greedy, improve
from parallel_lab.pipeline.search.problem import UNIT, Judged, Problem, as_schedule, evaluate, make_problem
from parallel_lab.pipeline.simulate import M_W_SHARE, Costs, simulate

IMPROVE_FROM = 3  # the best candidates local search starts from
# Local search's budget, in actions timed (a move times the whole schedule): a count, so the result
# does not depend on the machine; about 1.5 us an action here, so ~2 s whatever the size.
WORK = 1_500_000


@dataclass(frozen=True)
class Found:
    """What ``search`` returns.

    schedule:   the best schedule found (validated; name "search")
    judged:     its simulation (``problem.Judged``): makespan, spans, busy time, per-rank peaks
    problem:    what was searched
    origin:     which candidate it came from ("greedy(...)", "v-min (...)", "zb-h1", ...), and
                "+ local search" when that improved it
    candidates: every candidate tried: origin, makespan, peak per rank, fits the cap
    lower_bound: what no schedule can beat (``lower_bound``, or the exact solver's when it ran)
    exact:      the solver's status ("optimal", "feasible", ...) or None when it did not run
    seconds:    the search's own time
    """

    schedule: Schedule
    judged: Judged
    problem: Problem
    origin: str
    candidates: list[dict] = field(repr=False)
    lower_bound: float
    exact: str | None
    seconds: float

    @property
    def makespan(self) -> float:
        return self.judged.makespan

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - sum(self.judged.busy) / (self.problem.ranks * self.judged.makespan)

    @property
    def peak_rank_activations(self) -> list[float]:
        return [round(x, 6) for x in self.judged.peaks]

    def report(self) -> dict:
        """JSON-ready numbers of the search (``parallel-lab schedule search --json`` adds the grid)."""
        j = self.judged
        return {"origin": self.origin, "makespan": j.makespan, "bubble_fraction": self.bubble_fraction,
                "lower_bound": self.lower_bound, "gap_to_bound": j.makespan / self.lower_bound - 1,
                "exact": self.exact, "longest_span": j.longest_span, "span_idle": j.span_idle,
                "spans": list(j.spans), "peak_rank_activations": self.peak_rank_activations,
                "problem": self.problem.describe(), "candidates": len(self.candidates),
                "actions": self.schedule.to_dict()["ranks"], "seconds": round(self.seconds, 3)}


def lower_bound(problem: Problem) -> float:
    """No schedule is shorter: each rank's work after the earliest its first input can arrive (the
    forwards of the stages before it), and one micro-batch's forward and input-gradient chain through
    every stage (with the links), plus the last W of stage 0 when the backward is split."""
    t, n = problem.table, problem.n_stages
    back = t["I"] if problem.split else t["B"]
    arrive = [0.0] * n  # earliest start of F(s, 0)
    for s in range(1, n):
        arrive[s] = arrive[s - 1] + t["F"][s - 1] + problem.hop(s - 1, s)
    bound = 0.0
    for r in range(problem.ranks):
        mine = problem.stages_of(r)
        work = problem.microbatches * sum(t["F"][s] + t["B"][s] for s in mine)
        bound = max(bound, min(arrive[s] for s in mine) + work)
    chain = arrive[-1] + t["F"][-1] + sum(back) + sum(problem.hop(s, s + 1) for s in range(n - 1))
    if problem.split:
        chain += t["W"][0]
    return max(bound, chain)


def _generators(problem: Problem) -> list[tuple[str, Schedule]]:
    """The course's own schedules of the problem's placement and backward, where they exist for it."""
    p, m = problem.ranks, problem.microbatches
    if problem.placement == "wave":
        names = ("zb-h1", "1f1b") if problem.split else ("1f1b", "gpipe")
    else:
        names = ("zb-v", "dualpipe-v") if problem.split else ()
    out = []
    for name in names:
        try:
            schedule = build(name, p, m, 2 if problem.placement == "v" else 1)
        except ScheduleError:  # dualpipe-v needs m >= 2p
            continue
        if name == "1f1b" and problem.split:  # 1F1B with each B as I then W at once
            schedule = _split_b(schedule)
        out.append((name, schedule))
    return out


def _split_b(schedule: Schedule) -> Schedule:
    rows = [[x for a in row if a is not None
             for x in ((Action(a.stage, "I", a.microbatch), Action(a.stage, "W", a.microbatch))
                       if a.kind == "B" else (a,))] for row in schedule.ranks]
    return Schedule(schedule.name, schedule.n_ranks, schedule.n_microbatches, schedule.virtual,
                    schedule.stage_to_rank, rows)


def _family(origin: str) -> str:
    """"greedy", "under the cap" (a generator's order kept under the cap), or the block or generator."""
    return "greedy" if origin.startswith("greedy") else "under the cap" if "under the cap" in origin else origin


def _starts(fitting: list) -> list:
    """Where local search starts: the best candidate of each family, the best families first, then
    the next best candidates, ``IMPROVE_FROM`` in all (different shapes find different improvements)."""
    firsts, seen = [], set()
    for pair in fitting:
        if _family(pair[0]) not in seen:
            seen.add(_family(pair[0]))
            firsts.append(pair)
    rest = [pair for pair in fitting if pair not in firsts]
    return (firsts + rest)[:IMPROVE_FROM]


def search(ranks: int, microbatches: int, max_activations: float | Sequence[float] | None = None,
           placement: str = "wave", costs: Costs | None = None, w_share: float = M_W_SHARE,
           split: bool = True, stage_memory: Sequence[float] | None = None, exact: bool = False,
           time_limit: float | None = None, work: int = WORK) -> Found:
    """The shortest schedule found for ``ranks`` x ``microbatches`` under ``max_activations`` (per rank,
    in micro-batches of a rank's layers; see ``problem``). ``costs``: per-stage F, I, W (B = I + W) and
    the link (default F = I = W = 1). ``work``: local search's budget in actions timed (0: none; it
    is skipped when the best already meets ``lower_bound``). ``exact``: refine with CP-SAT for
    ``time_limit`` seconds (default 30). ``time_limit`` without ``exact`` caps the local search
    (then the result may depend on the machine's speed). ScheduleError for bad input, or when
    nothing fits (the message names the cap and what the lightest candidate needed)."""
    started = time.perf_counter()
    problem = make_problem(ranks, microbatches, max_activations, placement, costs, w_share, split, stage_memory)
    judged: list[tuple[str, Judged]] = []
    generators = _generators(problem)
    for rules in greedy.variants(problem) + greedy.follow(problem, [g for _, g in generators]):
        result = greedy.run(problem, rules)
        if result is not None:
            judged.append((rules.name, evaluate(problem, as_schedule(problem, "search", result.orders), check=False)))
    for name, schedule in blocks.block_schedules(problem) + generators:
        judged.append((name, evaluate(problem, schedule)))
    candidates = [{"origin": name, "makespan": j.makespan, "peak_rank_activations": [round(x, 6) for x in j.peaks],
                   "fits": j.fits} for name, j in judged]
    fitting = sorted((pair for pair in judged if pair[1].fits), key=lambda pair: pair[1].key)
    if not fitting:
        lightest = min((max(j.peaks) for _, j in judged), default=math.nan)
        raise ScheduleError(f"search: no candidate fits max_activations {list(problem.max_activations)}; "
                            f"the lightest needs {lightest:g} on some rank")
    origin, best = fitting[0]
    bound = lower_bound(problem)
    # half the budget over the starts, the other half on from the best of them
    budget = None if (time_limit is None or exact) else time_limit / (2 * IMPROVE_FROM)
    actions = problem.n_stages * problem.microbatches * (3 if problem.split else 2)
    evaluations = work // (2 * IMPROVE_FROM * actions)
    starts = _starts(fitting) if best.makespan > bound + 1e-9 and evaluations else []
    for name, start in starts + [(None, None)] * bool(starts):
        if name is None:  # the second half
            name, start = origin.removesuffix(" + local search"), best
            evaluations, budget = evaluations * IMPROVE_FROM, budget and budget * IMPROVE_FROM
        rows = [[a for a in row if a is not None] for row in start.schedule.ranks]
        orders, _ = improve.improve(problem, rows, max_evaluations=evaluations, time_limit=budget)
        better = evaluate(problem, as_schedule(problem, "search", orders))
        if better.fits and better.key < best.key:
            origin, best = f"{name} + local search", better
    schedule = as_schedule(problem, "search", [[a for a in row if a is not None] for row in best.schedule.ranks])
    best = evaluate(problem, schedule)  # validated, named "search"
    status = None
    if exact:
        from parallel_lab.pipeline.search.exact import solve

        solved = solve(problem, 30.0 if time_limit is None else time_limit, hint=schedule)
        status = solved.status
        if solved.judged is not None and solved.judged.fits and solved.judged.key < best.key:
            origin, best = "exact (CP-SAT)", evaluate(problem, as_schedule(problem, "search", solved.schedule.ranks))
        if status != "infeasible":
            bound = max(bound, solved.lower_bound)
    return Found(best.schedule, best, problem, origin, candidates, bound, status, time.perf_counter() - started)


def front(ranks: int, microbatches: int, caps: Sequence[float], placement: str = "wave", **options) -> list[dict]:
    """The best step found at each memory cap: ``[{"cap", "makespan", "bubble_fraction",
    "longest_span", "steady_bubble", "peak_rank_activations", "origin"}, ...]`` (a cap nothing fits
    gives None for each number). ``bubble_fraction`` is one step's, what every step costs when the
    optimizer step synchronises the ranks; ``steady_bubble`` that of back-to-back steps without the
    synchronisation (``problem.Judged.step``: the longest span). Options as ``search``. A lower cap
    never gets a longer step than a higher one here: a schedule found for a lower cap also fits every
    higher one, so each point keeps the best of its own and the lower caps'."""
    points, best = [], None
    for cap in sorted(caps):
        try:
            found = search(ranks, microbatches, cap, placement, **options)
        except ScheduleError:
            points.append({"cap": cap, "makespan": None, "bubble_fraction": None, "longest_span": None,
                           "steady_bubble": None, "peak_rank_activations": None, "origin": None})
            continue
        if best is None or found.judged.key < best.judged.key:
            best = found
        points.append({"cap": cap, "makespan": best.makespan, "bubble_fraction": best.bubble_fraction,
                       "longest_span": best.judged.longest_span,
                       "steady_bubble": best.judged.steady_bubble(synchronised=False),
                       "peak_rank_activations": best.peak_rank_activations, "origin": best.origin})
    return points


# The course's generators, (name, virtual stages per rank), as the lessons compare them with a search
FIXED = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2), ("dualpipe-v", 2))


def fixed(ranks: int, microbatches: int, schedules: Sequence[tuple[str, int]] = FIXED,
          costs: Costs | None = None, w_share: float = M_W_SHARE) -> list[dict]:
    """The course's generators on ``front``'s axes: per schedule ``{"schedule", "virtual", "peak"
    (the most activations any rank holds, in micro-batches of a rank's layers, counted until W),
    "makespan", "bubble_fraction" (one step: with the optimizer's synchronisation), "longest_span",
    "steady_bubble" (back-to-back steps without it)}``, simulated with ``costs`` per model stage
    (default F = I = W = 1, B = 2: the bubble is the same whatever the stage's share of a rank's
    layers, with free links). A schedule that does not take ``microbatches`` is left out (DualPipeV
    needs m >= 2p, interleaving m a multiple of p)."""
    rows = []
    for name, v in schedules:
        try:
            schedule = build(name, ranks, microbatches, v)
        except ScheduleError:
            continue
        timeline = simulate(schedule, costs or UNIT, w_share=w_share)
        spans = [float(e.max() - s.min()) if len(s) else 0.0 for s, e in zip(timeline.starts, timeline.ends)]
        rows.append({"schedule": name, "virtual": v, "peak": max(timeline.peak_rank_activations) / v,
                     "makespan": timeline.makespan, "bubble_fraction": timeline.bubble_fraction,
                     "longest_span": max(spans),
                     "steady_bubble": 1.0 - sum(timeline.busy) / (ranks * max(spans))})
    return rows


def profile_stages(ranks: int = 4, placement: str = "wave", model: str = "mlp", microbatches: int = 8,
                   **run_options) -> Costs:
    """Per-stage costs of F, I and W measured on real ranks: one run of the zero-bubble schedule of
    the placement (ZB-H1 for "wave", ZB-V for "v"), which splits every backward, on ``ranks`` ranks
    (``pipeline.run.run_pipeline``: the medians of thread CPU time per kind and stage, the link of the
    run). Starts processes; imports torch."""
    from parallel_lab.pipeline.run import run_pipeline

    name, virtual = ("zb-h1", 1) if placement == "wave" else ("zb-v", 2)
    result = run_pipeline(name, ranks, microbatches, model, virtual, **run_options)
    c, link = result["costs"], result["link"]
    return Costs(F=c["F"], B=c["B"], I=c["I"], W=c["W"], latency=link["latency_s"],
                 bandwidth=link["bandwidth_Bps"], bytes_per_message=float(link["message_bytes"]))
