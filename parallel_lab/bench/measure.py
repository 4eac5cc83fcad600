"""What every benchmark row is: ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (ratio = ours /
peer, so below 1 is faster), the median wall time of a call, and the machine's limit of a row run
on several ranks (``limit_columns``: its CPU work over the cores the ranks get)."""

from __future__ import annotations

import statistics
import time

from parallel_lab.runtime import launcher


def row(name, ours_s, peer, peer_s, **extra) -> dict:
    return {"name": name, "ours_s": ours_s, "peer": peer, "peer_s": peer_s,
            "ratio": ours_s / peer_s if peer_s else None, **extra}


def median_time(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rotation(sides: int, iteration: int) -> list[int]:
    """The order in which ``sides`` implementations run in one ``iteration`` of an alternating
    benchmark: the sides rotated by one each iteration (012, 120, 201, ...). Each side runs in every
    position equally often, and for three or more sides none ever runs right after itself, so none
    runs more often than another on a cache its own previous iteration warmed. (Reversing the order
    every other iteration, ABC CBA, gives that to the first and last side and never to the middle
    one; for two sides the two orders are the same.)"""
    return [(k + iteration) % sides for k in range(sides)]


def cores(ranks: int) -> int:
    """Cores ``ranks`` rank processes really get: at most one each, at most those this process may
    run on (its CPU affinity, which a container or ``taskset`` narrows below ``os.cpu_count()``)."""
    return max(1, min(ranks, launcher.cores()))


def limit_columns(ours_s: float, compute_s: float, ranks: int) -> dict:
    """``compute_s`` (all ranks' CPU seconds of a step), ``cores``, ``limit_s`` = compute_s / cores
    (the shortest wall time this machine could do the step in) and ``limit_ratio`` = ours_s / limit_s."""
    n = cores(ranks)
    limit = compute_s / n
    return {"compute_s": compute_s, "cores": n, "limit_s": limit,
            "limit_ratio": ours_s / limit if limit > 0 else None}
