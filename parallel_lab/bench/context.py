"""Our context parallelism beside the single-process attention and, where it runs, PyTorch's own.

    from parallel_lab.bench.context import bench_context
    bench_context(repeats=5)  # [{"name": "ring causal b1 h8 s512 cp2", "ours_s": ..., "peer": ..., ...}, ...]

PyTorch's ring attention (``torch.distributed.tensor.experimental.context_parallel``) does not run
on CPU ranks here (``parallel_lab.context.peer`` says exactly why), so every case is compared with
the single-process attention (SDPA, its fused CPU kernel, forward and backward on the whole
sequence) divided by cp: the time a rank would take if the work split perfectly and communication
cost nothing (ratio 1). Without a causal mask, a second row compares with ``context_parallel`` under
SDPA's MATH kernel, the one configuration where it runs (DTensor all-gathers K and V).

All sides run in the same rank function, alternating iteration by iteration in rotation
(``measure.rotation``), each after a barrier; the single process runs on rank 0 while the others
wait. An iteration's time is the slowest rank's, a row the median over ``repeats``. With more
ranks than cores, wall time is mostly waiting for a descheduled rank; ``*_cpu_s`` (thread CPU time
of the busiest rank) and ``cpu_ratio`` compare the work, and ``limit_s`` / ``limit_ratio``
(``bench.measure.limit_columns``) how far our wall time is from the machine's limit for our CPU
work. fp32, q, k and v given (the projections are not timed).
Ours materialises its score blocks with plain matmuls (the course's readable code, and what the
score meter measures), the single process uses SDPA's fused CPU kernel: that difference, not the
communication, is most of the first ratio. Quote ratios, not times.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from parallel_lab.bench.measure import limit_columns, rotation
from parallel_lab.context import peer
from parallel_lab.context.blockwise import zigzag_shard
from parallel_lab.context.cost import VARIANTS
from parallel_lab.context.run import CORES
from parallel_lab.runtime import commlog, launcher

SINGLE = "one process / cp (SDPA)"
TORCH = "torch context_parallel (MATH SDPA, DTensor all-gather)"
SHAPES = ((1, 8, 512, 32),)  # (batch, heads, seq, head_dim)


def _timed(fn):
    """``(wall seconds, this thread's CPU seconds)`` of ``fn()``, after a barrier."""
    dist.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - start, time.thread_time() - cpu


def _leaves(*tensors):
    return [t.detach().requires_grad_() for t in tensors]


def bench_rank(shapes=SHAPES, repeats: int = 5, warmup: int = 2) -> list[dict]:
    """Rank function: every variant, causal and not, on every shape; rows (the same on all ranks)."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,))
    rows = []
    for B, n, S, d in shapes:
        gen = torch.Generator().manual_seed(0)
        q, k, v, grad = (torch.randn(B, n, S, d, generator=gen) for _ in range(4))
        for variant in VARIANTS:
            for causal in (True, False):
                def cut(t):
                    return zigzag_shard(t, cp, rank, dim=2) if variant == "ring" else t.chunk(cp, dim=2)[rank]

                lq, lk, lv, lg = (cut(t) for t in (q, k, v, grad))

                def ours():
                    with commlog.unwrapped():  # no bookkeeping on our side either
                        CORES[variant](*_leaves(lq, lk, lv), causal).backward(lg)

                def single():
                    if rank == 0:
                        F.scaled_dot_product_attention(*_leaves(q, k, v), is_causal=causal).backward(grad)

                sides = [lambda: _timed(ours), lambda: _timed(single)]
                if not causal:
                    def torch_cp():
                        with peer.torch_context_parallel(mesh, (q, k, v, grad)) as shards:
                            return _timed(lambda: peer.peer_step(*shards, causal=False))

                    sides.append(torch_cp)
                times = torch.zeros(len(sides), 2, repeats, dtype=torch.float64)  # (side, wall|cpu, repeat)
                for i in range(warmup + repeats):
                    for s in rotation(len(sides), i):
                        sample = sides[s]()
                        if i >= warmup:
                            times[s, :, i - warmup] = torch.tensor(sample)
                work = times[0, 1].clone()
                dist.all_reduce(work)  # our iteration's CPU time on all ranks together
                dist.all_reduce(times, op=dist.ReduceOp.MAX)  # an iteration lasts as long as its slowest rank
                (ours_s, ours_cpu), (single_s, single_cpu), *rest = times.median(dim=-1).values.tolist()
                name = f"{variant} {'causal' if causal else 'not-causal'} b{B} h{n} s{S} cp{cp}"
                base = {"name": name, "ours_s": ours_s, "ours_cpu_s": ours_cpu, "single_s": single_s,
                        **limit_columns(ours_s, work.median().item(), cp)}
                rows.append({**base, "peer": SINGLE, "peer_s": single_s / cp, "ratio": ours_s * cp / single_s,
                             "peer_cpu_s": single_cpu / cp, "cpu_ratio": ours_cpu * cp / single_cpu,
                             "torch_context_parallel": "runs, see the next row" if rest else str(peer.WHY_NOT)})
                for peer_s, peer_cpu in rest:
                    rows.append({**base, "peer": TORCH, "peer_s": peer_s, "ratio": ours_s / peer_s,
                                 "peer_cpu_s": peer_cpu, "cpu_ratio": ours_cpu / peer_cpu})
    return rows


def bench_context(repeats: int = 5, cps=(2, 4), warmup: int = 2, timeout: float = 600.0) -> list[dict]:
    """``parallel-lab bench context``: rows ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (and the
    CPU columns) for ring and Ulysses, causal and not, at each context-parallel size."""
    rows = []
    for cp in cps:
        rows += launcher.run(bench_rank, cp, kwargs={"repeats": repeats, "warmup": warmup}, timeout=timeout)[0]
    return rows
