"""Measuring this machine: every timing of its ranks and every α–β fit, in one place.

A planner profiles its cluster before it searches; the course's "cluster" is this machine's CPU
ranks, and this module is that profiler. It returns the same descriptions the rest of the package
uses (``parallel_lab.hardware.Link`` and the constants of a ``Cluster``).

    launcher.run(time_all_reduce, 4, args=(sizes,))   # lesson 01: all-reduce seconds per size
    fit_alpha_beta(sizes, seconds, world_size=4)      # the α–β model's α and bandwidth
    calibrate(world_size=4, groups=True)              # the planner's constants (lessons 16 and 18)
    measure_machine()                                 # this machine as a link and a device (lesson 02)

Rank functions (run them with ``launcher.run``): ``time_all_reduce``, ``all_reduce_in_situ``,
``group_all_reduce``, ``measure_rank``, ``busy_loop``, ``workload_seconds``. Timings change from run
to run; tests check the machinery, never the numbers.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.hardware import Link
from parallel_lab.pipeline.profile import one_thread
from parallel_lab.planning import memory_model
from parallel_lab.runtime import launcher, shared_channel, shared_memory
from parallel_lab.runtime.collectives import ring_all_reduce
from parallel_lab.runtime.transport import all_reduce, one_shot_all_reduce

# ----------------------------------------------------------------------------------------------
# All-reduce: timed, and the α–β fit.


def time_all_reduce(sizes_bytes, repeats: int = 5, algorithm: str = "gloo") -> list[float]:
    """Rank function: median seconds of one all-reduce of each size (float32) on this rank's world,
    each after a barrier; ``algorithm`` is ``"gloo"`` (dist.all_reduce), ``"ring"`` (lesson 01's
    ``runtime.collectives.ring_all_reduce``), ``"one-shot"`` (``one_shot_all_reduce``) or
    ``"shared-memory"`` (``runtime.shared_channel``; a RuntimeError where these ranks cannot share)."""
    ops = {"gloo": dist.all_reduce, "ring": ring_all_reduce, "one-shot": one_shot_all_reduce,
           "shared-memory": _shared_memory_all_reduce}
    if algorithm not in ops:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {', '.join(ops)}")
    op = ops[algorithm]
    medians = []
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4))
        op(tensor)  # warm-up: first use of a size sets up buffers
        samples = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            op(tensor)
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians


def _shared_memory_all_reduce(tensor):
    channel = shared_channel.for_group()
    if channel is None:
        reason = shared_memory.why_not_here(dist.get_backend()) or "they are not all on one host"
        raise RuntimeError(f"these ranks cannot share memory: {reason}")
    return channel.all_reduce(tensor)


def all_reduce_in_situ(sizes_bytes, repeats: int = 5, calls: int = 10, group=None,
                       path: str = "gloo") -> list[float]:
    """Rank function: seconds of one all-reduce of each size over ``group`` (default: all ranks),
    measured as training issues them, between computations. ``path``: ``"gloo"`` times
    ``dist.all_reduce`` (what a data-parallel bucket larger than shared memory's slots takes),
    ``"transport"`` the call tensor-parallel layers make (``transport.all_reduce``: through
    shared memory for small tensors on one host). A loop of ``calls`` (a little compute,
    then an all-reduce) is timed against the same loop without the all-reduces; the difference per
    call, median of ``repeats``. (A lone all-reduce after a barrier also pays for the ranks leaving
    the barrier apart; back-to-back ones find every communication thread already awake.)"""
    small = torch.randn(64, 64)
    reduce = all_reduce if path == "transport" else (lambda t, g: dist.all_reduce(t, group=g))

    def loop(tensor) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            x = small
            for _ in range(4):  # about a millisecond of work
                x = torch.tanh(x @ small)
            if tensor is not None:
                reduce(tensor, group)
        return (time.perf_counter() - start) / calls

    seconds = []
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4))
        reduce(tensor, group)  # warm-up: the first use of a size sets up buffers (and a channel)
        seconds.append(statistics.median(max(loop(tensor) - loop(None), 1e-7) for _ in range(repeats)))
    return seconds


@contextmanager
def consecutive_groups(size: int):
    """On a rank: this rank's group of ``size`` consecutive ranks (every rank is in one, so all groups
    work at once, as a plan's tensor- or data-parallel groups do), destroyed on exit; ``None`` (the
    world, nothing made) at size 1. The rank pool persists, so groups must not outlive the call."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"world_size {world} is not divisible by group size {size}")
    groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)] if size > 1 else []
    try:
        yield groups[rank // size] if groups else None
    finally:
        for group in groups:
            dist.destroy_process_group(group)


def group_all_reduce(size: int, sizes_bytes, repeats: int = 5, path: str = "gloo") -> list[float]:
    """Rank function: ``all_reduce_in_situ`` in groups of ``size`` consecutive ranks, every group at
    once (as a plan's tensor- or data-parallel groups run)."""
    with consecutive_groups(size) as group:
        return all_reduce_in_situ(sizes_bytes, repeats, group=group, path=path)


def fit_alpha_beta(sizes_bytes, seconds, world_size: int) -> dict:
    """Fit ``t = 2(p−1)·α + 2(p−1)/p·n·β`` by least squares on relative error (so that tiny and huge
    messages weigh alike). Returns α (s), β (s/byte), bandwidth (bytes/s) and the fitted times."""
    p = world_size
    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if p < 2:
        raise ValueError(f"the all-reduce model needs at least 2 ranks, got world_size {p}")
    design = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    fitted = design @ np.array([alpha, beta]) * t
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta),
            "bandwidth_bytes_per_s": float(1 / beta) if beta > 0 else float("inf"),
            "fitted_s": fitted.tolist()}


def all_reduce_constants(sizes_bytes, seconds, group_size: int) -> dict:
    """``latency_us`` and ``intra_gbps`` of the α–β fit to all-reduce ``seconds`` on groups of
    ``group_size``, with the measurements (``all_reduce_s``) and the fitted times. Where the fit
    finds no positive β (a noisy machine), the bandwidth is the one the largest message achieved,
    so that the constants always make a valid ``Cluster``."""
    fit = fit_alpha_beta(sizes_bytes, seconds, group_size)
    gbps = fit["bandwidth_bytes_per_s"] / 1e9
    if not 0 < gbps < math.inf:
        gbps = 2 * (group_size - 1) / group_size * sizes_bytes[-1] / seconds[-1] / 1e9
    return {"latency_us": max(fit["alpha_s"], 0.0) * 1e6, "intra_gbps": gbps, "all_reduce_s": list(seconds),
            "fitted_s": fit["fitted_s"]}


# ----------------------------------------------------------------------------------------------
# Compute.


def matmul_seconds(n: int = 192, repeats: int = 5) -> float:
    """Thread-CPU seconds of an ``n x n`` fp32 matmul on this thread, median of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.thread_time()
        a @ b
        samples.append(time.thread_time() - start)
    return statistics.median(samples)


def measure_rank(sizes_bytes=(2**10, 2**14, 2**17, 2**20), matmul: int = 192, repeats: int = 5,
                 path: str = "gloo") -> dict:
    """Rank function: ``matmul_seconds`` and all-reduce seconds for each size (``all_reduce_in_situ``)."""
    return {"matmul_s": matmul_seconds(matmul, repeats), "flops": 2 * matmul**3,
            "all_reduce_s": all_reduce_in_situ(sizes_bytes, repeats, path=path)}


def busy_loop(matmul: int = 128, repeats: int = 400) -> tuple[float, float]:
    """Rank function: (thread CPU seconds, wall seconds) of ``repeats`` matmuls started together."""
    a = torch.randn(matmul, matmul)
    dist.barrier()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(repeats):
        a = torch.tanh(a @ a)
    return time.thread_time() - cpu, time.perf_counter() - wall


def workload_seconds(gpt: models.GPTConfig, rows: int, dtype=torch.float32, seed: int = 0,
                     repeats: int = 3) -> float:
    """Thread CPU seconds of one forward and backward of ``rows`` sequences through the whole GPT on
    one thread, median of ``repeats`` after a warm-up run. Also a rank function: on ranks it starts
    together with the others (a barrier)."""
    model = models.GPT(gpt, seed=seed).to(dtype)
    idx, targets = models.random_tokens(gpt, rows, seed=seed + 1)
    if dist.is_initialized():
        dist.barrier()
    samples = []
    with one_thread():
        for _ in range(repeats + 1):  # the first run warms up
            start = time.thread_time()
            models.cross_entropy(model(idx), targets).backward()
            samples.append(time.thread_time() - start)
    return statistics.median(samples[1:])


def workload_tflops(gpt: models.GPTConfig, rows: int, dtype=torch.float32, seed: int = 0, repeats: int = 3,
                    world_size: int | None = None) -> float:
    """Achieved TFLOP/s of this model: the planner's ``6 · params · tokens`` FLOPs of ``rows``
    sequences over ``workload_seconds``. With ``world_size``, measured on that many ranks computing
    at once and taken from the slowest: simulated devices share the machine's caches, memory
    bandwidth and, in a virtual machine, the host's cores, so each computes slower than it does
    alone, and a synchronous step waits for the slowest."""
    flops = 6 * memory_model.param_count(gpt.layers, gpt.hidden, gpt.vocab, gpt.seq) * rows * gpt.seq
    args = (gpt, rows, dtype, seed, repeats)
    if world_size is None:
        seconds = workload_seconds(*args)
    else:
        seconds = max(launcher.run(workload_seconds, world_size, args=args, timeout=120))
    return flops / seconds / 1e12


# ----------------------------------------------------------------------------------------------
# The whole calibration.


def calibrate(world_size: int = 2, sizes_bytes=(2**10, 2**14, 2**17, 2**20), matmul: int = 192,
              repeats: int = 5, groups: bool = False, timeout: float = 60.0, path: str = "gloo") -> dict:
    """Fit the planner's constants on ``world_size`` CPU ranks of this machine: achieved FLOP/s per
    rank (median over ranks of a timed matmul) and the α–β of all-reduce. Returns ``tflops``,
    ``latency_us``, ``intra_gbps`` (the ranks share one machine: that is the "node"), the raw
    measurements, ``world_size`` and ``sizes_bytes``, ready for
    ``Cluster(nodes=1, gpus_per_node=world_size, ...)``.

    With ``groups`` also ``groups`` (the all-reduce constants per group size: each divisor >= 2 of
    ``world_size``, measured with all groups of that size at once, as a plan's TP or DP groups
    run) and ``effective_cores`` (how many of the ranks really compute at once here: the sum of
    their CPU seconds over the wall seconds of a busy loop). ``path``: which all-reduce is timed
    (``all_reduce_in_situ``)."""
    if world_size < 2:
        raise ValueError(f"calibration fits an all-reduce and needs world_size >= 2, got world_size {world_size}")
    sizes_bytes = tuple(sizes_bytes)
    per_rank = launcher.run(measure_rank, world_size, kwargs=dict(sizes_bytes=sizes_bytes, matmul=matmul,
                                                                   repeats=repeats, path=path), timeout=timeout)
    flops = statistics.median(r["flops"] / max(r["matmul_s"], 1e-9) for r in per_rank)
    seconds = [max(r["all_reduce_s"][i] for r in per_rank) for i in range(len(sizes_bytes))]
    cal = {"tflops": flops / 1e12, **all_reduce_constants(sizes_bytes, seconds, world_size),
           "world_size": world_size, "sizes_bytes": list(sizes_bytes)}
    if not groups:
        return cal
    cal["groups"] = {world_size: {k: cal[k] for k in ("latency_us", "intra_gbps", "all_reduce_s")}}
    for size in range(2, world_size):
        if world_size % size == 0:
            per_rank = launcher.run(group_all_reduce, world_size, args=(size, sizes_bytes),
                                    kwargs={"path": path}, timeout=timeout)
            seconds = [max(r[i] for r in per_rank) for i in range(len(sizes_bytes))]
            cal["groups"][size] = all_reduce_constants(sizes_bytes, seconds, size)
    busy = launcher.run(busy_loop, world_size, timeout=timeout)
    cal["effective_cores"] = min(world_size, sum(cpu for cpu, _ in busy) / max(wall for _, wall in busy))
    return cal


def measure_machine(world_size: int = 4) -> dict:
    """This machine as a ``link`` and a device's ``flops``, for lesson 02's comparison with GPU
    links: the α–β fit of gloo's all-reduce on ``world_size`` ranks (as in lesson 01, fewer sizes)
    and the FLOP/s of a float32 matmul on one core here."""
    sizes = [2**k for k in range(10, 23, 3)]  # 1 KB .. 4 MB
    measured = launcher.run(time_all_reduce, world_size, args=(sizes,), kwargs={"repeats": 3})[0]
    fit = all_reduce_constants(sizes, measured, world_size)
    n = 512
    flops = 2 * n**3 / matmul_seconds(n, repeats=5)
    link = Link("this machine (gloo)", fit["intra_gbps"] * 1e9, max(fit["latency_us"] * 1e-6, 1e-7))
    return {"link": link, "flops": flops}
