"""The schedule simulator at the course's caps (p = 64, m = 512): it sits behind sliders, so it must
answer at once. No peer simulates schedules; tests/test_simulate.py keeps an independent reference
for correctness."""

from __future__ import annotations

from parallel_lab.bench.measure import median_time, row
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import simulate


def bench_simulator(ranks: int = 64, microbatches: int = 512, repeats: int = 5) -> list[dict]:

    rows = []
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"):
        schedule = build(name, ranks, microbatches)
        actions = sum(map(len, schedule.ranks))
        rows.append(row(f"simulate {name}, p={ranks}, m={microbatches} ({actions:,} actions)",
                        median_time(lambda: simulate(schedule), repeats), "-", None))
        rows.append(row(f"build {name}, p={ranks}, m={microbatches}",
                        median_time(lambda: build(name, ranks, microbatches), repeats), "-", None))
    return rows
