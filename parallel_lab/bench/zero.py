"""Our ZeRO-3 side by side with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``), in one run.

    from parallel_lab.bench.zero import bench_zero
    bench_zero(repeats=10)  # [{"name": "gpt h256 L4 b8 dp2 step", "ours_s": ..., "peer_s": ..., "ratio": ...},
                            #  {"name": "... peak memory", "ours_s": MB, "unit": "MB", ...}, ...]

Both sides build the same GPT from the seed (fp32), shard it the same way (one unit per block, the
embeddings and the head each a unit: ``fully_shard`` on each and on the root; ``zero.engine.Zero``
with ``gpt_units``, stage 3) and train with Adam on the same rows (batch / dp per rank). FSDP2 runs
on the CPU with gloo here (``init_device_mesh("cpu", (dp,))``). A step is forward, backward and the
optimizer step. The two sides alternate step by step (ABBA..., ``measure.rotation``), each rank
waits at a barrier first, a step lasts as long as its slowest rank, and a row reports the median over
``repeats``; ``commlog`` is unwrapped for both, so neither pays our bookkeeping. ``*_cpu_s`` is the
thread CPU time of the busiest rank (unaffected by ranks waiting for a core).

Peak memory: one more step of each under PyTorch's own ``MemTracker``
(``torch.distributed._tools.mem_tracker``, a dispatch mode that follows every tensor storage,
resizes included), started after the optimizer state exists: the peak bytes of live tensors on
this rank, activations and temporaries included -- the same instrument for both, the highest rank's
peak reported. The row's unit is MB (``ours_bytes``, ``peer_bytes`` exact), ``ratio`` ours / peer.
The step row also carries ``max_param_diff``, between the two sides' parameters after the same
steps: 0 on 2 ranks; on 4 the reduce-scatters round differently (FSDP2 asks for ReduceOp.AVG), and
Adam magnifies that where a gradient is near zero (measured ~2e-4 after 13 steps at lr 1e-3).
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from parallel_lab import models
from parallel_lab.bench.measure import rotation
from parallel_lab.runtime import commlog, launcher
from parallel_lab.zero.engine import Zero, gpt_units

PEER = "FSDP2 fully_shard"
CONFIG = models.GPTConfig(vocab=256, seq=64, hidden=256, heads=8, layers=4)
BATCH = 8
LR = 1e-3


def _fsdp2(model, dp: int):
    mesh = init_device_mesh("cpu", (dp,))
    for _, unit in gpt_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _peak_bytes(step, *external) -> int:
    """Peak bytes of live tensors on the CPU during one ``step()``, by MemTracker."""
    tracker = MemTracker()
    tracker.track_external(*external)
    with tracker, warnings.catch_warnings():
        # MemTracker's own gradient hook runs after ours, which has already set a unit's last .grad
        # to None (the gradient is a view of the unit's flat buffer, tracked through the others).
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass")
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def bench_rank(config: models.GPTConfig = CONFIG, batch: int = BATCH, repeats: int = 10, warmup: int = 2) -> list[dict]:
    """Rank function: time our ZeRO-3 and FSDP2 step by step, then one tracked step of each."""
    dp, rank = dist.get_world_size(), dist.get_rank()
    ours_model = models.GPT(config, seed=0)
    ours = Zero(ours_model, dist.group.WORLD, stage=3, lr=LR)
    peer_model = _fsdp2(models.GPT(config, seed=0), dp)
    peer_opt = torch.optim.Adam(peer_model.parameters(), lr=LR)
    idx, targets = models.random_tokens(config, batch, seed=1)
    rows = slice(rank * batch // dp, (rank + 1) * batch // dp)

    def ours_step():
        models.cross_entropy(ours_model(idx[rows]), targets[rows]).backward()
        ours.step()

    def peer_step():
        models.cross_entropy(peer_model(idx[rows]), targets[rows]).backward()
        peer_opt.step()
        peer_opt.zero_grad(set_to_none=True)

    def timed(step):
        dist.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        step()
        return time.perf_counter() - start, time.thread_time() - cpu

    times = torch.zeros(2, 2, repeats, dtype=torch.float64)  # (ours|peer, wall|cpu, repeat)
    with commlog.unwrapped():
        for i in range(warmup + repeats):
            for k in rotation(2, i):  # ABBA
                sample = timed((ours_step, peer_step)[k])
                if i >= warmup:
                    times[k, :, i - warmup] = torch.tensor(sample)
        state = [t for u in ours.units for t in (u.shard, u.adam.exp_avg, u.adam.exp_avg_sq)]
        memory = torch.tensor([_peak_bytes(ours_step, ours_model, *state),
                               _peak_bytes(peer_step, peer_model, peer_opt)], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    (ours_s, ours_cpu), (peer_s, peer_cpu) = times.median(dim=-1).values.tolist()
    ours_state = ours.full_state()
    diff = max((ours_state[n] - p.full_tensor()).abs().max().item() for n, p in peer_model.named_parameters())
    name = f"gpt h{config.hidden} L{config.layers} b{batch} dp{dp}"
    params = sum(t.numel() for t in ours_state.values())
    return [
        {"name": f"{name} step", "ours_s": ours_s, "peer": PEER, "peer_s": peer_s, "ratio": ours_s / peer_s,
         "ours_cpu_s": ours_cpu, "peer_cpu_s": peer_cpu, "cpu_ratio": ours_cpu / peer_cpu, "params": params,
         "max_param_diff": diff},
        {"name": f"{name} peak memory", "ours_s": memory[0].item() / 1e6, "unit": "MB", "peer": PEER,
         "peer_s": memory[1].item() / 1e6, "ratio": (memory[0] / memory[1]).item(),
         "ours_bytes": int(memory[0]), "peer_bytes": int(memory[1])},
    ]


def bench_zero(repeats: int = 10, dps=(2, 4), warmup: int = 2, timeout: float = 600.0) -> list[dict]:
    """``parallel-lab bench zero``: per dp a step-time row and a peak-memory row (see module doc)."""
    rows = []
    for dp in dps:
        rows += launcher.run(bench_rank, dp, kwargs={"repeats": repeats, "warmup": warmup}, timeout=timeout)[0]
    return rows
