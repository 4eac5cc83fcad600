"""The schedule search (``pipeline.search``): how long it takes, and how far its schedules are from the
optimum that OR-Tools' CP-SAT proves on small cases.

    from parallel_lab.bench.search import bench_search, gap_table
    bench_search()   # rows: search time for p = 8, m = 32 and p = 16, m = 64 (targets 5 s and 60 s)
    gap_table()      # rows: p = 4, m <= 8, three cost mixes, both placements: heuristic vs optimum

No peer searches schedules under a memory cap that could run here (the Zero Bubble authors'
scheduler is a script inside their Megatron fork, and needs a MILP solver binary); the gap rows
use CP-SAT as the reference: ``ours_s`` is the search's time, ``peer_s`` the solver's (started from
the search's schedule), and ``makespan``, ``optimum``, ``gap`` say what the time bought. Search
times are wall-clock on this machine, one process, single-threaded Python (``cpu_s``: its CPU time,
what it needs when it has a core to itself); the solver runs on two threads.
"""

from __future__ import annotations

import time

from parallel_lab.bench.measure import row
from parallel_lab.pipeline.search.api import search
from parallel_lab.pipeline.search.exact import solve
from parallel_lab.pipeline.simulate import Costs

TIMED = ((8, 32), (16, 64))  # (p, m) with their targets below
TARGET_S = {(8, 32): 5.0, (16, 64): 60.0}
MIXES = {"1,1,1": Costs(F=1, B=2, I=1, W=1), "5,6,4": Costs(F=5, B=10, I=6, W=4),
         "2,2,1 link 1": Costs(F=2, B=3, I=2, W=1, latency=1)}
# (placement, cap in micro-batches of a rank's layers): 1F1B's p on rank 0 and below it
CAPS = (("wave", 2), ("wave", 3), ("wave", 4), ("v", 1.5), ("v", 2), ("v", 3))


def bench_search(timed=TIMED) -> list[dict]:
    """One row per (p, m, placement) of ``timed``: the search's wall time at 1F1B's memory (p) and at
    half of it, one stage per rank and in the V."""
    rows = []
    for p, m in timed:
        for placement, cap in (("wave", p), ("wave", p / 2), ("v", p / 2)):
            started, cpu = time.perf_counter(), time.process_time()
            found = search(p, m, cap, placement)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            rows.append(row(f"search p={p} m={m} {placement} cap {cap:g}", seconds, "-", None) | {
                "cpu_s": cpu, "target_s": TARGET_S.get((p, m)), "makespan": found.makespan,
                "lower_bound": found.lower_bound, "gap_to_bound": round(found.makespan / found.lower_bound - 1, 4),
                "origin": found.origin})
    return rows


def gap_table(p: int = 4, microbatches=(4, 6, 8), mixes=MIXES, caps=CAPS, time_limit: float = 60.0) -> list[dict]:
    """One row per case: the heuristic's makespan against CP-SAT's: ``optimum`` (when not proved in
    ``time_limit``, ``status`` "feasible" and ``optimum`` is the solver's lower bound), ``gap`` =
    heuristic / optimum - 1, and ``solver_best``, the shortest schedule the solver found, with
    ``gap_to_solver_best``."""
    rows = []
    for mix, costs in mixes.items():
        for placement, cap in caps:
            for m in microbatches:
                started = time.perf_counter()
                found = search(p, m, cap, placement, costs=costs)
                ours = time.perf_counter() - started
                best = solve(found.problem, time_limit=time_limit, hint=found.schedule)
                optimum = best.makespan if best.status == "optimal" else best.lower_bound
                rows.append(row(f"gap p={p} m={m} {placement} cap {cap:g} F,I,W={mix}", ours,
                                "CP-SAT (OR-Tools)", best.seconds) | {
                    "makespan": found.makespan, "optimum": optimum, "status": best.status,
                    "solver_best": best.makespan, "gap": round(found.makespan / optimum - 1, 4),
                    "gap_to_solver_best": round(found.makespan / best.makespan - 1, 4), "origin": found.origin})
    return rows
