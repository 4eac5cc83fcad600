"""Our tensor parallelism side by side with PyTorch's (DTensor ``parallelize_module``), in one run.

    from parallel_lab.bench.tensor import bench_tensor
    bench_tensor(repeats=20)  # [{"name": "mlp h256 b32 tp2", "ours_s": ..., "peer_s": ..., "ratio": ...}, ...]

Both implementations are cut from the same dense module and timed inside the same rank function,
alternating iteration by iteration, so they share the machine's state (cores, caches, other load).
One iteration is a forward and a backward (the input requires grad, as it would inside a model,
so both sides pay the backward all-reduce of the input gradient). Each rank first waits at a
barrier; an iteration's time is the slowest rank's; a row reports the median over ``repeats``.
Quote the ratio, not the absolute times. With more ranks than cores, wall
time is mostly waiting for a descheduled rank; ``*_cpu_s`` (thread CPU time of the busiest rank)
and ``cpu_ratio`` compare the work each side does, unaffected by that.

How close to the machine: ``compute_s`` is our iteration's thread CPU time summed over the ranks
(the least over the repeats: sharing cores and caches only adds CPU time; measured around the same
timed iterations, which two clock reads do not slow; time spun waiting in shared-memory all-reduces
is not work and is left out). No implementation of that work can take less wall time than
``limit_s = compute_s / cores``, ``cores = min(tp, cores this process may run on)``;
``limit_ratio = ours_s / limit_s``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.bench.measure import limit_columns
from parallel_lab.runtime import launcher, shared_memory
from parallel_lab.tensor.dtensor import dtensor_parallelize
from parallel_lab.tensor.plan import parallelize

PEER = "DTensor parallelize_module"
MLP_SHAPES = ((32, 256), (32, 1024))  # (batch, hidden) of a (batch, hidden) input
BLOCK_SHAPE = (8, 32, 256, 8)  # (batch, seq, hidden, heads)


def _step(model, x, grad):
    """One forward + backward: ``(wall seconds, this thread's CPU seconds)``, less the CPU seconds
    it spun waiting for the other ranks in shared-memory all-reduces (waiting, not work)."""
    for p in model.parameters():
        p.grad = None
    x.grad = None
    dist.barrier()
    start, cpu, spun = time.perf_counter(), time.thread_time(), shared_memory.waited_seconds()
    model(x).backward(grad)
    return time.perf_counter() - start, time.thread_time() - cpu - (shared_memory.waited_seconds() - spun)


def bench_rank(repeats: int = 20, warmup: int = 3, mlp_shapes=MLP_SHAPES, block_shape=BLOCK_SHAPE) -> list[dict]:
    """Rank function: time ours and the peer on every shape, alternating; rows (same on all ranks)."""
    tp = dist.get_world_size()
    cases = [(f"mlp h{h} b{b} tp{tp}", models.MLP(h, seed=0), (b, h)) for b, h in mlp_shapes]
    b, t, h, heads = block_shape
    cfg = models.GPTConfig(vocab=8, seq=t, hidden=h, heads=heads, layers=1)
    cases.append((f"block h{h} b{b} s{t} tp{tp}", models.Block(cfg, seed=0), (b, t, h)))
    rows = []
    for name, dense, shape in cases:
        ours, peer = parallelize(dense), dtensor_parallelize(dense, tp)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=gen).requires_grad_()
        grad = torch.randn(shape, generator=gen)
        times = torch.zeros(2, 2, repeats, dtype=torch.float64)  # (ours|peer, wall|cpu, repeat)
        for i in range(warmup + repeats):
            # Alternate which side goes first (ABBA...): neither always runs on a warmer cache.
            if i % 2:
                b_, a = _step(peer, x, grad), _step(ours, x, grad)
            else:
                a, b_ = _step(ours, x, grad), _step(peer, x, grad)
            if i >= warmup:
                times[0, :, i - warmup], times[1, :, i - warmup] = torch.tensor(a), torch.tensor(b_)
        work = times[0, 1].clone()
        dist.all_reduce(work)  # our iteration's CPU time on all ranks together
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # an iteration lasts as long as its slowest rank
        (ours_s, ours_cpu), (peer_s, peer_cpu) = times.median(dim=-1).values.tolist()
        rows.append({"name": name, "ours_s": ours_s, "peer": PEER, "peer_s": peer_s, "ratio": ours_s / peer_s,
                     "ours_cpu_s": ours_cpu, "peer_cpu_s": peer_cpu, "cpu_ratio": ours_cpu / peer_cpu,
                     **limit_columns(ours_s, work.min().item(), tp)})
    return rows


def bench_tensor(repeats: int = 20, tps=(2, 4), warmup: int = 3, timeout: float = 300.0) -> list[dict]:
    """``parallel-lab bench tensor``: rows ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (and the
    CPU and limit columns, see the module doc) for the MLP (hidden 256 and 1024, batch 32) and a
    transformer block, at each tensor-parallel size."""
    rows = []
    for tp in tps:
        rows += launcher.run(bench_rank, tp, kwargs={"repeats": repeats, "warmup": warmup}, timeout=timeout)[0]
    return rows
