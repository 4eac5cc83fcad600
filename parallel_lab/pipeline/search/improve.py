"""Local search on a found order: move one action on its rank's list, keep the move when the step
shortens (or, at the same makespan, the longest span) and the memory still fits.

The greedy decides each action from what it knows at that moment; a move here sees the whole
schedule. The neighbourhood is every action moved up to ``reach`` places earlier or later on its own
rank, where it keeps its own rank's dependencies (F before its I, I before its W, the V's two stages
in order) and its micro-batch order among the passes of its kind and stage (the class ``exact``
solves). A move is timed by list scheduling (``times``: the simulator's rule, in Python over the
orders, which also finds a deadlock a move can make across ranks), so a kept move never lengthens
the step. First improvement, sweeps until none helps or the budget of evaluations is spent (a count,
not a time, so the result does not depend on the machine's load unless ``time_limit`` stops it).
"""

from __future__ import annotations

import math
import time

from parallel_lab.pipeline.actions import Action
from parallel_lab.pipeline.search.problem import EPS, Problem, memory_deltas


def times(problem: Problem, orders: list[list[Action]]) -> tuple[float, tuple, tuple, float] | None:
    """(makespan, spans, busy, sum of the end times of every F and I or B) of per-rank orders by list
    scheduling, or None when they deadlock (blocking receives, as ``validate``). Ranks run their
    lists; an action waits for its input."""
    n, m = problem.n_stages, problem.microbatches
    owner, t = problem.owner, problem.table
    back = "I" if problem.split else "B"
    cost = {"F": t["F"], "I": t["I"], "B": t["B"], "W": t["W"]}
    link = problem.link
    f_end = [[-1.0] * m for _ in range(n)]
    g_end = [[-1.0] * m for _ in range(n)]
    p = len(orders)
    pos, clock, first, busy = [0] * p, [0.0] * p, [None] * p, [0.0] * p
    parked: dict[tuple, list[int]] = {}
    todo = list(range(p))
    while todo:
        r = todo.pop()
        row, i = orders[r], pos[r]
        while i < len(row):
            s, kind, j = row[i]
            if kind == "F":
                if s == 0:
                    ready = 0.0
                else:
                    e = f_end[s - 1][j]
                    if e < 0:
                        parked.setdefault(("F", s - 1, j), []).append(r)
                        break
                    ready = e + (link if owner[s - 1] != r else 0.0)
            elif kind == "W":
                ready = g_end[s][j]
                if ready < 0:
                    return None  # its I comes later on this rank
            else:
                ready = f_end[s][j]
                if ready < 0:
                    return None  # its F comes later on this rank
                if s + 1 < n:
                    e = g_end[s + 1][j]
                    if e < 0:
                        parked.setdefault(("G", s + 1, j), []).append(r)
                        break
                    ready = max(ready, e + (link if owner[s + 1] != r else 0.0))
            start = clock[r] if clock[r] > ready else ready
            end = start + cost[kind][s]
            clock[r] = end
            busy[r] += end - start
            if first[r] is None:
                first[r] = start
            if kind == "F":
                f_end[s][j] = end
                todo.extend(parked.pop(("F", s, j), ()))
            elif kind == back:
                g_end[s][j] = end
                todo.extend(parked.pop(("G", s, j), ()))
            i += 1
        pos[r] = i
    if any(pos[r] < len(orders[r]) for r in range(p)):
        return None
    spans = tuple(c - (f or 0.0) for c, f in zip(clock, first))
    total = sum(map(sum, f_end)) + sum(map(sum, g_end))
    return max(clock), spans, tuple(busy), total


def _key(result) -> tuple[float, float]:
    """Shorter step first, then the sum of the end times of every F and I (or B): a move that
    lets passes finish earlier without yet shortening the step is kept, which walks the search
    off the step's plateaus (most single moves cannot shorten the step alone)."""
    makespan, _, _, total = result
    return (round(makespan, 9), round(total, 9))


def _fits(problem: Problem, row: list[Action], cap: float) -> bool:
    held = 0.0
    for a in row:
        held += memory_deltas(problem, a)
        if held > cap + EPS:
            return False
    return True


def _blocked(a: Action, b: Action, owner) -> bool:
    """True when ``a`` must stay before ``b`` on one rank: the same kind and stage (micro-batch order),
    or ``b`` consumes ``a`` (the same micro-batch's F before its I/B, I before W, a stage before the
    next on the way down, after it on the way back)."""
    if a.stage == b.stage and a.kind == b.kind:
        return True
    if a.microbatch != b.microbatch:
        return False
    if a.stage == b.stage:
        return a.kind == "F" or (a.kind == "I" and b.kind == "W")
    if a.kind == "F":  # before the micro-batch's later forwards and every one of its backward passes
        return b.kind != "F" or a.stage < b.stage
    if a.kind in "IB" and b.kind in "IBW":  # the backward runs down the stages
        return a.stage > b.stage
    return False


def improve(problem: Problem, orders: list[list[Action]], reach: int = 3, max_evaluations: int = 20_000,
            time_limit: float | None = None) -> tuple[list[list[Action]], int]:
    """Local search from ``orders`` (see the module doc); returns the improved orders and how many
    candidate moves were timed."""
    orders = [list(row) for row in orders]
    best = times(problem, orders)
    if best is None:
        raise ValueError("improve: the starting orders deadlock")
    best_key = _key(best)
    deadline = math.inf if time_limit is None else time.perf_counter() + time_limit
    evaluations = 0
    improved = True
    while improved and evaluations < max_evaluations and time.perf_counter() < deadline:
        improved = False
        for r in range(problem.ranks):
            row = orders[r]
            i = 0
            while i < len(row):
                moved = False
                for shift in _shifts(reach):
                    k = i + shift
                    if not 0 <= k < len(row) or _crosses(row, i, k, problem.owner):
                        continue
                    candidate = row[:i] + row[i + 1:]
                    candidate.insert(k, row[i])
                    if not _fits(problem, candidate, problem.max_activations[r]):
                        continue
                    orders[r] = candidate
                    result = times(problem, orders)
                    evaluations += 1
                    if result is not None and _key(result) < best_key:
                        best_key, row, moved, improved = _key(result), candidate, True, True
                        break
                    orders[r] = row
                    if evaluations >= max_evaluations or time.perf_counter() >= deadline:
                        return orders, evaluations
                if not moved:
                    i += 1
    return orders, evaluations


def _shifts(reach: int) -> list[int]:
    return [d for k in range(1, reach + 1) for d in (-k, k)]


def _crosses(row: list[Action], i: int, k: int, owner) -> bool:
    """True when moving row[i] to position k would pass an action it must stay behind or before."""
    a = row[i]
    if k < i:
        return any(_blocked(b, a, owner) for b in row[k:i])
    return any(_blocked(a, b, owner) for b in row[i + 1:k + 1])
