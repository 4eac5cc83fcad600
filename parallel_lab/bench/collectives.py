"""The lesson's ring all-reduce against gloo's own, and the all-reduces tensor parallelism sends its
small sums with (``runtime.transport.all_reduce``: one shot, and through shared memory on one x86
host) against gloo's (``parallel-lab bench collectives``)."""

from __future__ import annotations

from parallel_lab.bench.measure import row
from parallel_lab.planning.calibration import time_all_reduce
from parallel_lab.runtime import launcher, shared_memory

ONE_SHOT_SIZES = (32 * 2**10, 128 * 2**10)  # a TP all-reduce of the bench's MLP: 32 x 1024 fp32 = 128 KB


def bench_collectives(world_size: int = 4, n_bytes: int = 4 * 2**20, repeats: int = 7) -> list[dict]:
    rows = []
    for size in (64 * 2**10, n_bytes):
        gloo = launcher.run(time_all_reduce, world_size, args=([size], repeats))[0][0]
        ring = launcher.run(time_all_reduce, world_size, args=([size], repeats),
                            kwargs={"algorithm": "ring"})[0][0]
        rows.append(row(f"ring all-reduce (lesson 01), {world_size} ranks, {size // 2**10} KB", ring,
                        "gloo all_reduce", gloo))
    for ranks in (2, world_size):
        gloo = launcher.run(time_all_reduce, ranks, args=(ONE_SHOT_SIZES, repeats))[0]
        one_shot = launcher.run(time_all_reduce, ranks, args=(ONE_SHOT_SIZES, repeats),
                                kwargs={"algorithm": "one-shot"})[0]
        for size, ours, peer in zip(ONE_SHOT_SIZES, one_shot, gloo):
            rows.append(row(f"one-shot all-reduce (tensor parallelism), {ranks} ranks, {size // 2**10} KB",
                            ours, "gloo all_reduce", peer))
        if shared_memory.why_not_here() is None:
            shared = launcher.run(time_all_reduce, ranks, args=(ONE_SHOT_SIZES, repeats),
                                  kwargs={"algorithm": "shared-memory"})[0]
            for size, ours, peer in zip(ONE_SHOT_SIZES, shared, gloo):
                rows.append(row(f"shared-memory all-reduce (tensor parallelism), {ranks} ranks, "
                                f"{size // 2**10} KB", ours, "gloo all_reduce", peer))
    return rows
