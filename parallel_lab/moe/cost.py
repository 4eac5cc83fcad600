"""What an all-to-all costs in the α–β model, and what one MoE layer's all-to-alls cost.

In an all-to-all over N ranks each rank holds n bytes in N chunks, one for each rank; the chunk for
itself stays home, so each rank sends (N - 1)/N · n and receives as much. With the pairwise
exchange (step i: send to rank r + i, receive from rank r - i) that is N - 1 messages:

    T(n, N) = (N - 1) α + (N - 1)/N · n·β

with β the inverse bandwidth, seconds per byte, as in lesson 01 (the functions take the bandwidth,
1/β, as ``Link`` holds it).

Expert parallelism pays four per MoE layer and step: dispatch and combine forward, and their
conjugates (the reverse all-to-alls) backward, each carrying the token vectors routed, n = tokens
· top_k · hidden · bytes per element (fewer when the capacity drops some). Pure functions of
numbers, as the planner's other costs (``planning.cost``); ``parallel_lab.moe.run`` measures the
same volumes with commlog.
"""

from __future__ import annotations

from parallel_lab.checks import positive_int
from parallel_lab.hardware import Link

ALL_TO_ALLS_PER_LAYER = 4  # dispatch and combine, forward and backward


def all_to_all_sent_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in an all-to-all of ``n_bytes`` per rank: (N - 1)/N · n."""
    positive_int("world_size", world_size)
    return (world_size - 1) / world_size * n_bytes


def all_to_all_time(n_bytes: float, world_size: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds of an all-to-all of ``n_bytes`` per rank over ``world_size`` ranks (pairwise
    exchange): (N - 1) α + (N - 1)/N · n·β with β = 1 / ``bandwidth_bytes_per_s``; 0 on one rank."""
    if positive_int("world_size", world_size) == 1:
        return 0.0
    return (world_size - 1) * alpha_s + all_to_all_sent_bytes(n_bytes, world_size) / bandwidth_bytes_per_s


def dispatch_bytes(tokens: int, hidden: int, top_k: int, bytes_per_element: int = 2) -> int:
    """Bytes one rank hands a dispatch (or combine) all-to-all: its ``tokens`` token vectors, each to
    its ``top_k`` experts, when none is dropped."""
    for name, value in (("tokens", tokens), ("hidden", hidden), ("top_k", top_k),
                        ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    return tokens * top_k * hidden * bytes_per_element


def moe_layer_time(tokens: int, hidden: int, top_k: int, ep: int, link: Link, bytes_per_element: int = 2) -> float:
    """Seconds of one MoE layer's all-to-alls in a training step, per rank of an EP group of ``ep``
    on ``link``, each rank routing ``tokens`` tokens: 4 all-to-alls of ``dispatch_bytes``."""
    n = dispatch_bytes(tokens, hidden, top_k, bytes_per_element)
    return ALL_TO_ALLS_PER_LAYER * all_to_all_time(n, ep, link.latency, link.bandwidth)
