"""The lesson's ring all-reduce against gloo's own (``parallel-lab bench collectives``)."""

from __future__ import annotations

from parallel_lab.bench.measure import row
from parallel_lab.planning.calibration import time_all_reduce
from parallel_lab.runtime import launcher


def bench_collectives(world_size: int = 4, n_bytes: int = 4 * 2**20, repeats: int = 7) -> list[dict]:
    rows = []
    for size in (64 * 2**10, n_bytes):
        gloo = launcher.run(time_all_reduce, world_size, args=([size], repeats))[0][0]
        ring = launcher.run(time_all_reduce, world_size, args=([size], repeats),
                            kwargs={"algorithm": "ring"})[0][0]
        rows.append(row(f"ring all-reduce (lesson 01), {world_size} ranks, {size // 2**10} KB", ring,
                        "gloo all_reduce", gloo))
    return rows
