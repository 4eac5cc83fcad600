"""Our tensor parallelism side by side with PyTorch's (DTensor ``parallelize_module``), in one run.

    from parallel_lab.bench.tensor import bench_tensor
    bench_tensor(repeats=20)  # [{"name": "mlp h256 b32 tp2", "ours_s": ..., "peer_s": ..., "ratio": ...}, ...]

Both implementations are cut from the same dense module and timed inside the same rank function,
alternating iteration by iteration in rotation (``measure.rotation``), so they share the machine's
state (cores, caches, other load) and none runs more often than another right after itself.
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

How close to the kernels (MLP rows): ``kernels_s`` times ``kernels``, this rank's shard of the
MLP's own arithmetic (the same matmuls, GELU and bias sums, in the layouts autograd uses) with no
communication and no autograd, on its own copy of our weights (so that it warms no cache for ours),
in the same alternation; ``kernels_ratio = kernels_s / peer_s`` is the lowest ratio any
implementation built on these kernels could reach on this run. Where it is
close to ``ratio`` (hidden 1024: matrix products are most of our step), what is left is the
cost of parallelism itself: the two all-reduces, waiting at them for the other rank, autograd.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel_lab import models
from parallel_lab.bench.measure import limit_columns, rotation
from parallel_lab.runtime import launcher, shared_memory
from parallel_lab.tensor.dtensor import dtensor_parallelize
from parallel_lab.tensor.plan import parallelize

PEER = "DTensor parallelize_module"
MLP_SHAPES = ((32, 256), (32, 1024))  # (batch, hidden) of a (batch, hidden) input
BLOCK_SHAPE = (8, 32, 256, 8)  # (batch, seq, hidden, heads)


def _timed(call):
    """``call()`` after a barrier: ``(wall seconds, this thread's CPU seconds)``, less the CPU seconds
    it spun waiting for the other ranks in shared-memory all-reduces (waiting, not work)."""
    dist.barrier()
    start, cpu, spun = time.perf_counter(), time.thread_time(), shared_memory.waited_seconds()
    call()
    return time.perf_counter() - start, time.thread_time() - cpu - (shared_memory.waited_seconds() - spun)


def _training_step(model, x, grad):
    """One forward + backward of ``model``, its gradients and the input's cleared first."""
    def call():
        for p in model.parameters():
            p.grad = None
        x.grad = None
        model(x).backward(grad)
    return call


def kernels(mlp):
    """``step(x, grad) -> (y, grad_x, [grad of fc1.weight, fc1.bias, fc2.weight, fc2.bias])``: the
    arithmetic of one forward and backward of this rank's shard of a ``ParallelMLP``, without its
    two all-reduces (``y`` and ``grad_x`` are this rank's partial sums) and without autograd, in
    the layouts autograd uses (a product's weight gradient is ``grad.t() @ input``)."""
    w1, b1, w2, b2 = (p.detach() for p in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias))

    def step(x, grad):
        x = x.detach()
        h = F.linear(x, w1, b1)  # column-parallel: this rank's (B, 4H/p)
        a = F.gelu(h)
        y = F.linear(a, w2) + b2  # row-parallel partial sum (g's all-reduce would come before the bias)
        grad_h = torch.ops.aten.gelu_backward(grad @ w2, h)
        grads = [grad_h.t() @ x, grad_h.sum(0), grad.t() @ a, grad.sum(0)]
        return y, grad_h @ w1, grads  # partial input gradient (f's backward all-reduce would follow)
    return step


def kernels_match(hidden: int = 16, batch: int = 4) -> float:
    """Rank function: the largest difference, in float64, between our layers' forward and backward
    and ``kernels`` with its partial sums all-reduced as the layers do: 0 up to rounding when the
    floor computes what ours computes."""
    ours = parallelize(models.MLP(hidden, seed=0).double())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, hidden, generator=gen, dtype=torch.float64).requires_grad_()
    grad = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
    y = ours(x)
    y.backward(grad)
    y_partial, grad_x, grads = kernels(ours)(x, grad)
    bias = ours.fc2.bias.detach()
    summed = y_partial - bias
    dist.all_reduce(summed)
    dist.all_reduce(grad_x)
    params = (ours.fc1.weight, ours.fc1.bias, ours.fc2.weight, ours.fc2.bias)
    pairs = [(y.detach(), summed + bias), (x.grad, grad_x), *((p.grad, g) for p, g in zip(params, grads))]
    return max((a - b).abs().max().item() for a, b in pairs)


def bench_rank(repeats: int = 20, warmup: int = 3, mlp_shapes=MLP_SHAPES, block_shape=BLOCK_SHAPE) -> list[dict]:
    """Rank function: time ours and the peer (and, on the MLP, ``kernels``) on every shape,
    alternating; rows (same on all ranks)."""
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
        sides = [_training_step(ours, x, grad), _training_step(peer, x, grad)]
        floor = isinstance(dense, models.MLP)  # the MLP's arithmetic alone (``kernels``), a third side
        if floor:
            step = kernels(parallelize(dense))  # its own copy of our weights: no side warms another's cache
            sides.append(lambda: step(x, grad))
        times = torch.zeros(len(sides), 2, repeats, dtype=torch.float64)  # (side, wall|cpu, repeat)
        for i in range(warmup + repeats):
            for k in rotation(len(sides), i):  # no side always first, or more often after itself
                wall_cpu = _timed(sides[k])
                if i >= warmup:
                    times[k, :, i - warmup] = torch.tensor(wall_cpu)
        work = times[0, 1].clone()
        dist.all_reduce(work)  # our iteration's CPU time on all ranks together
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # an iteration lasts as long as its slowest rank
        medians = times.median(dim=-1).values.tolist()
        (ours_s, ours_cpu), (peer_s, peer_cpu) = medians[:2]
        row = {"name": name, "ours_s": ours_s, "peer": PEER, "peer_s": peer_s, "ratio": ours_s / peer_s,
               "ours_cpu_s": ours_cpu, "peer_cpu_s": peer_cpu, "cpu_ratio": ours_cpu / peer_cpu,
               **limit_columns(ours_s, work.min().item(), tp)}
        if floor:
            row.update(kernels_s=medians[2][0], kernels_ratio=medians[2][0] / peer_s)
        rows.append(row)
    return rows


def bench_tensor(repeats: int = 20, tps=(2, 4), warmup: int = 3, timeout: float = 300.0) -> list[dict]:
    """``parallel-lab bench tensor``: rows ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (and the
    CPU and limit columns, see the module doc) for the MLP (hidden 256 and 1024, batch 32) and a
    transformer block, at each tensor-parallel size."""
    rows = []
    for tp in tps:
        rows += launcher.run(bench_rank, tp, kwargs={"repeats": repeats, "warmup": warmup}, timeout=timeout)[0]
    return rows
