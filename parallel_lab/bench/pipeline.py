"""Our pipeline executor side by side with PyTorch's ``torch.distributed.pipelining``, in one run.

    from parallel_lab.bench.pipeline import bench_pipeline
    bench_pipeline()  # [{"name": "mlp h256 b64 m8 p4 gpipe", "ours_s": ..., "peer_s": ..., "ratio": ...}, ...]

Both run the same stage (a copy of the same weights: two Linear+GELU blocks of the 8-block MLP per
rank), the same batch, 8 microbatches, float32, GPipe and 1F1B (PyTorch: ``PipelineStage`` with
``ScheduleGPipe`` / ``Schedule1F1B``, mean loss per microbatch, gradients scaled by 1/m as ours).
They are timed inside the same rank function, alternating step by step, so they share the
machine's state. A step is one forward and backward of the whole batch; gradients are reset
between steps (not timed); each step starts after a barrier, lasts as long as its slowest rank,
and a row reports the median over ``repeats``. Ours runs without recording (no timestamps sent),
each stage in ``pipeline.chain.ChainWorker`` as every run of the course MLP (its Linear and GELU by
hand: autograd's arithmetic bit for bit, without its graph) and, between ranks of one host, sends
through shared memory (``runtime.shared_memory.links``); the peer runs autograd and sends through
torch.distributed (gloo's loopback TCP). Quote the ratio, not the absolute times.

How close to the machine: after the timed steps, ``LIMIT_STEPS`` more steps of ours run recorded
(not timed) and the thread CPU time of every action (what the executor's virtual clock counts) is
summed over all ranks: ``compute_s``, the work of one step (the least over those steps: sharing
cores and caches only adds CPU time, and recording adds a little of its own). No schedule
can finish it faster than ``limit_s = compute_s / cores``, with ``cores = min(ranks, cores this
process may run on)``; ``limit_ratio = ours_s / limit_s`` says how far above that floor we are
(communication, waiting for a neighbour, the bubble, a rank descheduled by other load).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from parallel_lab.bench.measure import limit_columns
from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.stages import ModelSpec, cut
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import commlog, launcher

PEER = "torch.distributed.pipelining"
HIDDEN = (256, 1024)
BATCH, MICROBATCHES, LAYERS, RANKS = 64, 8, 8, 4
SCHEDULES = ("gpipe", "1f1b")
LIMIT_STEPS = 5  # recorded (untimed) steps per row whose per-action thread CPU times give the limit


def _peer(module, name: str, rank: int, p: int, loss_fn):
    stage = PipelineStage(module, rank, p, torch.device("cpu"))
    kind = ScheduleGPipe if name == "gpipe" else Schedule1F1B
    return kind(stage, MICROBATCHES, loss_fn=loss_fn)


def _timed(step, params) -> float:
    for q in params:
        q.grad = None
    dist.barrier()
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def compute_seconds(ex: Executor, x, target, steps: int = LIMIT_STEPS) -> float:
    """Collective: the thread CPU seconds of one step's actions summed over all ranks (the least of
    ``steps`` recorded steps; gradients are reset before each and left unset after). ``x``/``target``
    as for ``Executor.step``. The executor is left as it was (unrecorded)."""
    was, ex.record = ex.record, True
    totals = torch.zeros(max(1, steps), dtype=torch.float64)
    try:
        for i in range(len(totals)):
            ex.zero_grad()
            dist.barrier()
            ex.step(x, target)
            totals[i] = sum(r["cpu"] for r in ex.records)
    finally:
        ex.record = was
        ex.zero_grad()
    dist.all_reduce(totals)  # the work of all ranks
    return min(totals.tolist())


def schedules_for(names=SCHEDULES, ranks: int = RANKS) -> dict:
    """The benchmark's schedules, built and validated once, before any rank starts: ``{name: Schedule}``."""
    return {name: validate(build(name, ranks, MICROBATCHES)) for name in names}


def bench_rank(schedules: dict, repeats: int = 10, warmup: int = 3, hidden=HIDDEN) -> list[dict]:
    """Rank function: time ours and the peer on every (hidden, schedule), alternating; the rows
    (the same on every rank). ``schedules``: ``schedules_for``'s, which the ranks run as they are."""
    with commlog.unwrapped():
        return _bench(repeats, warmup, hidden, schedules)


def _bench(repeats, warmup, hidden, schedules) -> list[dict]:
    rank, p = dist.get_rank(), dist.get_world_size()
    rows = []
    for h in hidden:
        spec = ModelSpec("mlp", hidden=h, layers=LAYERS, batch=BATCH, dtype="float32")
        stage = cut(spec, p, keep={rank})[rank]
        pristine = copy.deepcopy(stage.module)  # before our workers may put hooks on it: the peer gets none
        x, target = spec.data()
        for name, schedule in schedules.items():
            module = copy.deepcopy(pristine)
            ours = Executor(schedule, {rank: stage}, spec, rank, check=False)  # schedules_for validated it
            peer = _peer(module, name, rank, p, spec.loss)
            steps = (lambda: ours.step(x if rank == 0 else None, target if rank == p - 1 else None),
                     _peer_step(peer, rank, p, x, target))
            params = (list(stage.module.parameters()), list(module.parameters()))
            times = torch.zeros(2, repeats, dtype=torch.float64)
            for i in range(warmup + repeats):
                for k in (0, 1):
                    t = _timed(steps[k], params[k])
                    if i >= warmup:
                        times[k, i - warmup] = t
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
            ours_s, peer_s = (statistics.median(times[k].tolist()) for k in (0, 1))
            compute_s = compute_seconds(ours, x if rank == 0 else None, target if rank == p - 1 else None)
            rows.append({"name": f"mlp h{h} b{BATCH} m{MICROBATCHES} p{p} {name}", "ours_s": ours_s,
                         "peer": PEER, "peer_s": peer_s, "ratio": ours_s / peer_s,
                         **limit_columns(ours_s, compute_s, p)})
    return rows


def _peer_step(peer, rank, p, x, target):
    if rank == 0:
        return lambda: peer.step(x, return_outputs=False)
    if rank == p - 1:
        return lambda: peer.step(target=target, return_outputs=False)
    return lambda: peer.step(return_outputs=False)


def bench_pipeline(repeats: int = 10, warmup: int = 3, timeout: float = 600.0) -> list[dict]:
    """``parallel-lab bench pipeline``: rows ``{name, ours_s, peer, peer_s, ratio, compute_s, cores,
    limit_s, limit_ratio}`` on 4 ranks."""
    return launcher.run(bench_rank, RANKS, kwargs=dict(schedules=schedules_for(), repeats=repeats, warmup=warmup),
                        timeout=timeout)[0]
