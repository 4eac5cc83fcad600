"""3D parallelism: train the tiny GPT with data x pipeline x tensor parallelism on a device mesh.

    from parallel_lab.parallel3d import train3d
    cfg = train3d.Config(dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, steps=4)
    result = train3d.train(cfg)                 # 4 ranks; checked before any process starts
    result["losses"], result["losses_equal"], result["weights_equal"]

Each rank sits at one coordinate ``(dp, pp, tp)`` of ``mesh.ParallelDims`` (the rank grid
``arange(world).view(dp, pp, tp)``) and composes the three pieces the course built one by one:

- **tensor parallelism inside a stage** (``apply.apply_tp``): every rank builds the same dense
  ``models.GPT`` from the seed and keeps its Megatron shard (``tensor.plan.parallelize`` over
  ``Groups.tp_group``); the loss is the vocabulary-parallel cross-entropy, so the logits are never
  gathered;
- **pipeline parallelism across stages** (``apply.apply_pp``): the sharded model is cut by
  ``pipeline.stages.cut_pieces`` (embedding on the first stage, head on the last, blocks balanced)
  and a schedule (1F1B by default; GPipe, ZB-H1, interleaved 1F1B, ZB-V) runs on
  ``pipeline.executor.Executor``, whose pipeline rank ``r`` is global rank ``Groups.pp_ranks[r]``
  (its ``peers``);
- **data parallelism** (``apply.apply_dp``): each replica trains on its rows of the batch and
  averages gradients over ``Groups.dp_group`` with the bucketed all-reduce of ``data_parallel`` (or
  ZeRO-1's reduce-scatter); then SGD or Adam steps.

What a run is and what is checked before it starts is ``parallel3d.config``.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM") is the recipe; lessons/11_3d_parallelism.ipynb the lesson. Every run is compared with
the same optimiser on one process (``reference``): in fp64 the losses of every step and the final
weights agree to ~1e-12 (``TOLERANCE`` 1e-9).

On this machine ``parallel-lab run 3d --dp 2 --pp 2 --tp 2`` trains on local CPU ranks; beyond one
machine the same rank function runs under torchrun (NCCL on GPUs)::

    torchrun --standalone --nproc-per-node 8 -m parallel_lab.cli run 3d --dp 2 --pp 2 --tp 2 --steps 3

which prints ``step k/n loss ...`` on stderr and one JSON object on stdout (``train_under_torchrun``).
NCCL ignores message tags: the pipeline messages between two ranks then match in the order they are
posted, which holds for GPipe and 1F1B (activations and gradients each travel in micro-batch order);
the other schedules are tested on gloo only.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab import models
from parallel_lab.i18n import _
from parallel_lab.parallel3d import data_parallel
from parallel_lab.parallel3d.apply import ReplicaSpec, apply_dp, apply_pp, apply_tp, tp_sharded
from parallel_lab.parallel3d.config import Config, check, make_optimizer
from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.schedules import Schedule
from parallel_lab.runtime import commlog, launcher, torchrun
from parallel_lab.runtime.mesh import ParallelDims, build_groups
from parallel_lab.tensor.layers import allreduce_sequence_parallel_grads

# Lesson 11 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("_train",)
TOLERANCE = 1e-9  # fp64: what "the same numbers" means for losses and weights
UPDATE = {False: "data-parallel gradient all-reduce and optimizer step",  # what a hang report names
          True: "ZeRO-1 step (reduce-scatter, Adam on a slice, all-gather)"}


# ----------------------------------------------------------------------------------------------
# One process: the reference.


def batch_for_step(cfg: Config, step: int):
    """The whole batch of step ``step``: ``(batch, seq)`` token ids and targets, the same everywhere."""
    return models.random_tokens(cfg.gpt, cfg.batch, seed=cfg.seed + 1 + step)


def reference(cfg: Config) -> dict:
    """Single-process training with the same data and optimiser: ``losses`` per step (the mean over
    the whole batch, before that step's update) and the final dense ``state`` (a state_dict)."""
    model = models.GPT(cfg.gpt, seed=cfg.seed).to(cfg.torch_dtype)
    opt = make_optimizer(cfg, model.parameters())
    losses = []
    for step in range(cfg.steps):
        idx, targets = batch_for_step(cfg, step)
        opt.zero_grad(set_to_none=True)
        loss = models.cross_entropy(model(idx), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


# ----------------------------------------------------------------------------------------------
# On a rank.


def train_rank(cfg: Config, reference_state: dict | None = None, timed: bool = False,
               verbose: bool = False, schedule: Schedule | None = None) -> dict:
    """Rank function: ``cfg.steps`` training steps of this rank's part of the 3D-parallel GPT.

    Returns ``rank``, ``coords`` (dp, pp, tp), ``losses`` (per step, the mean over the whole batch;
    on the last pipeline stage, else None), ``step_s`` (wall seconds of each step, from a common
    start with ``timed``), ``cpu_s`` (CPU seconds of this process in each step), ``checksum`` (this
    rank's share of the sum of every weight of the model: sharded weights on every TP rank,
    replicated ones on TP rank 0, replica 0 only) and, given the reference's final dense ``state``,
    ``max_weight_diff`` of this rank's weights against the same shard cut from it. ``verbose``: the
    first replica's last stage prints ``step k/n loss ...``.
    """
    schedule = check(cfg, dist.get_world_size()) if schedule is None else schedule
    groups = build_groups(ParallelDims(cfg.dp, cfg.pp, cfg.tp, cfg.nodes))
    try:
        return _train(cfg, schedule, groups, reference_state, timed, verbose)
    finally:
        commlog.set_activity(None)
        dist.barrier()
        groups.destroy()


def _device() -> torch.device:
    # NCCL needs the GPU torchrun's launcher picked (init_from_env set it); gloo runs on the CPU
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _dense(cfg: Config, state: dict | None = None) -> models.GPT:
    """The whole dense GPT in ``cfg.dtype``: the seed's weights, or ``state``'s."""
    dense = models.GPT(cfg.gpt, seed=cfg.seed).to(cfg.torch_dtype)
    if state is not None:
        dense.load_state_dict(state)
    return dense


def _train(cfg, schedule, groups, reference_state, timed, verbose) -> dict:
    device = _device()
    stages = apply_pp(apply_tp(_dense(cfg), cfg, groups), schedule, groups, device)
    ex = Executor(schedule, stages, ReplicaSpec(cfg, groups), groups.pp_rank, recompute=cfg.recompute,
                  peers=groups.pp_ranks, check=False)  # the schedule is check's, validated
    params = [p for st in stages.values() for p in st.module.parameters()]
    opt = apply_dp(params, cfg, groups)
    rows = data_parallel.batch_slice(cfg.batch, groups.dp_rank, cfg.dp)
    last = schedule.n_stages - 1 in stages
    losses, step_s, cpu_s = [], [], []
    for step in range(cfg.steps):
        idx, targets = (t[rows].to(device) for t in batch_for_step(cfg, step))
        if timed:
            dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        ex.zero_grad()
        loss = ex.step(idx, targets)  # the pipeline, with TP collectives inside every action
        if cfg.sequence_parallel and cfg.tp > 1:  # replicated parameters used on a sequence shard
            for st in stages.values():
                allreduce_sequence_parallel_grads(st.module, groups.tp_group)
        commlog.set_activity(f"{UPDATE[bool(cfg.zero)]}, step {step + 1}")
        opt.step()  # every replica's gradients averaged over dp (ZeRO-1: reduce-scattered), then updated
        step_s.append(time.perf_counter() - start)
        cpu_s.append(time.process_time() - cpu)  # all of this process's threads (gloo's too)
        if last:  # the replicas' mean losses -> the whole batch's mean loss (logging only)
            commlog.set_activity(f"loss all-reduce, step {step + 1}")
            value = torch.tensor([loss], dtype=torch.float64, device=device)
            if cfg.dp > 1:
                dist.all_reduce(value, group=groups.dp_group)
            losses.append(value.item() / cfg.dp)
            if verbose and groups.dp_rank == 0 and groups.tp_rank == 0:
                print(f"step {step + 1}/{cfg.steps} loss {losses[-1]:.6f}", file=sys.stderr, flush=True)
    sharded = tp_sharded(nn.ModuleList(st.module for st in stages.values()))
    checksum = 0.0
    if groups.dp_rank == 0:
        checksum = sum(p.detach().double().sum().item() for p in params
                       if id(p) in sharded or groups.tp_rank == 0)
    out = {"rank": groups.rank, "coords": (groups.dp_rank, groups.pp_rank, groups.tp_rank),
           "losses": losses if last else None, "step_s": step_s, "cpu_s": cpu_s, "checksum": checksum,
           "optimizer_bytes": opt.state_bytes()}
    if reference_state is not None:
        ref = apply_pp(apply_tp(_dense(cfg, reference_state), cfg, groups), schedule, groups, device)
        out["max_weight_diff"] = max(
            (p - q).abs().max().item()
            for s in stages for p, q in zip(stages[s].module.parameters(), ref[s].module.parameters()))
    return out


# ----------------------------------------------------------------------------------------------
# The parent side.


def train(cfg: Config | None = None, *, progress=print, memory_limit_gb: float | None = None,
          timed: bool = False, timeout: float = 90.0, **changes) -> dict:
    """Check ``cfg`` (plus ``changes``), train it on ``cfg.world_size`` local ranks, compare with
    ``reference``. ``progress`` (a callable taking a line, or None) hears what happens.

    Returns the config, ``losses`` and ``reference_losses`` per step, ``max_loss_diff``,
    ``max_weight_diff`` (the largest over every rank's weights), ``losses_equal`` and
    ``weights_equal`` (below ``TOLERANCE``), ``checksum`` and ``reference_checksum`` (the sum of all
    weights), and ``step_s`` (per step, the slowest rank's wall seconds).
    """
    cfg = (cfg or Config()).replace(**changes)
    launch = launcher.prepare(train_rank, cfg.world_size, timeout=timeout)  # 1..8 ranks, before the reference
    schedule = check(cfg, memory_limit_gb=memory_limit_gb)
    say = progress or (lambda line: None)
    ref = reference(cfg)
    say(_("training the tiny GPT ({layers} layers, hidden {hidden}) on {plan}, {steps} steps of {optimizer} ...")
        .format(layers=cfg.layers, hidden=cfg.hidden, plan=cfg.describe(), steps=cfg.steps, optimizer=cfg.optimizer))
    ranks = launcher.start(launch, kwargs=dict(cfg=cfg, reference_state=ref["state"], timed=timed,
                                               schedule=schedule))
    result = summarize(cfg, ranks, ref)
    for k, loss in enumerate(result["losses"]):
        say(_("step {step}/{steps} loss {loss:.6f} (one process: {reference:.6f})").format(
            step=k + 1, steps=cfg.steps, loss=loss, reference=result["reference_losses"][k]))
    return result


def summarize(cfg: Config, ranks: list[dict], ref: dict) -> dict:
    """The ``train`` dict from the ranks' answers and the reference."""
    losses = next(r["losses"] for r in ranks if r["losses"] is not None)
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref["losses"]))
    weight_diff = max(r.get("max_weight_diff", math.inf) for r in ranks)
    step_s = [max(r["step_s"][k] for r in ranks) for k in range(cfg.steps)]
    return {"config": dataclasses.asdict(cfg), "world_size": cfg.world_size, "losses": losses,
            "reference_losses": ref["losses"], "max_loss_diff": loss_diff, "max_weight_diff": weight_diff,
            "losses_equal": loss_diff < TOLERANCE, "weights_equal": weight_diff < TOLERANCE,
            "tolerance": TOLERANCE, "checksum": sum(r["checksum"] for r in ranks),
            "reference_checksum": sum(v.double().sum().item() for v in ref["state"].values()),
            "step_s": step_s, "optimizer_bytes_per_rank": [r.get("optimizer_bytes") for r in
                                                           sorted(ranks, key=lambda r: r["rank"])]}


# ----------------------------------------------------------------------------------------------
# Under torchrun (``parallel-lab run 3d`` started by torchrun): one rank per process.


def train_under_torchrun(cfg: Config, memory_limit_gb: float | None = None) -> None:
    """Every rank trains its part of ``cfg`` (NCCL on GPUs); rank 0 prints ``train``'s dict as one JSON
    object on stdout and ``step k/n loss ...`` on stderr. ``check`` runs first, on every rank, against
    torchrun's world size (a ValueError before any process group starts)."""
    schedule = check(cfg, torchrun.world_size_from_env(), memory_limit_gb)
    with torchrun.session():
        box = [reference(cfg) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)  # every rank compares its shard with the same answer
        mine = train_rank(cfg, box[0]["state"], timed=True, verbose=True, schedule=schedule)
        torchrun.report(mine, lambda gathered: summarize(cfg, gathered, box[0]))
