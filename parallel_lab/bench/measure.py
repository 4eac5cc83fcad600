"""What every benchmark row is: ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (ratio = ours /
peer, so below 1 is faster), and the median wall time of a call."""

from __future__ import annotations

import statistics
import time


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
