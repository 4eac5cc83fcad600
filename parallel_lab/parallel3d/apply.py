"""The three techniques of a 3D run, applied to the dense GPT from outside, one function each.

    model = apply_tp(models.GPT(cfg.gpt, seed=cfg.seed), cfg, groups)    # this rank's Megatron shard
    stages = apply_pp(model, schedule, groups)                          # its pipeline stages
    optimizer = apply_dp(params_of(stages), cfg, groups)                # replicas average, then step

As torchtitan parallelizes its models (``apply_tp``, the pipeline split, ``apply_fsdp``/DDP): the
model is plain single-device code (``models.GPT``) and each technique is applied to it by the
library that teaches it -- ``tensor.plan.parallelize`` (lesson 02), ``pipeline.stages.cut_pieces``
(lessons 03-09), ``parallel3d.data_parallel`` and ``zero.sharded_adam`` (lessons 11 and 12). The
groups come from ``runtime.mesh.build_groups``; ``ReplicaSpec`` tells the pipeline executor what it
needs of a replica (the loss, the boundary shape).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from parallel_lab import models
from parallel_lab.parallel3d import data_parallel
from parallel_lab.parallel3d.config import Config, make_optimizer
from parallel_lab.pipeline.schedules import Schedule
from parallel_lab.pipeline.stages import Stage, cut_pieces
from parallel_lab.tensor import layers
from parallel_lab.tensor.layers import vocab_parallel_cross_entropy
from parallel_lab.tensor.plan import parallelize
from parallel_lab.zero.sharded_adam import ShardedAdam

# Lesson 11 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("apply_dp",)


def apply_tp(model: models.GPT, cfg: Config, groups) -> nn.Module:
    """Tensor parallelism: ``model`` (dense, the same weights on every rank) swapped for its Megatron
    shard over ``groups.tp_group`` (with Megatron's sequence parallelism if ``cfg`` asks); as is
    when ``cfg.tp`` is 1."""
    if cfg.tp == 1:
        return model
    return parallelize(model, group=groups.tp_group, sequence_parallel=cfg.sequence_parallel)


def apply_pp(model: nn.Module, schedule: Schedule, groups, device=None) -> dict[int, Stage]:
    """Pipeline parallelism: ``{stage index: Stage}`` for the model stages of ``schedule`` that this
    rank's pipeline rank (``groups.pp_rank``) holds, cut from ``model.as_sequential()`` as
    ``pipeline.stages.cut_pieces`` cuts any model (embedding on the first stage, head on the last,
    blocks balanced; parameter names global, ``"{piece}.{name}"``), on ``device``."""
    mine = {s for s, r in enumerate(schedule.stage_to_rank) if r == groups.pp_rank}
    cut = cut_pieces(list(model.as_sequential()), schedule.n_stages, head=1, tail=1, keep=mine)
    return {st.index: st._replace(module=st.module.to(device)) for st in cut if st is not None}


def apply_dp(params: list, cfg: Config, groups):
    """Data parallelism over ``groups.dp_group``: the optimizer of this replica's ``params``, whose
    ``step()`` first makes every replica's gradients the whole batch's. ZeRO-1 with ``cfg.zero``
    (``zero.sharded_adam.ShardedAdam``: reduce-scatter, Adam on this replica's 1/dp slice,
    all-gather), else PyTorch DDP's bucketed all-reduce and then the optimizer on every replica."""
    if cfg.zero:
        return ShardedAdam(params, groups.dp_group, cfg.lr)
    return DataParallel(params, make_optimizer(cfg, params), groups.dp_group, cfg.dp, cfg.bucket_bytes)


class DataParallel:
    """``step()``: the gradients averaged over the ``replicas`` of ``group``
    (``data_parallel.allreduce_gradients``; nothing to average with one), then ``optimizer.step()``."""

    def __init__(self, params: list, optimizer: torch.optim.Optimizer, group, replicas: int, bucket_bytes: int):
        self.params, self.optimizer, self.group = params, optimizer, group
        self.replicas, self.bucket_bytes = replicas, bucket_bytes

    def step(self) -> None:
        if self.replicas > 1:
            data_parallel.allreduce_gradients(self.params, self.group, self.bucket_bytes)
        self.optimizer.step()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (Adam: both moments; SGD: none)."""
        return sum(t.numel() * t.element_size() for state in self.optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor) and t.dim() > 0)


class ReplicaSpec:
    """What ``pipeline.executor.Executor`` needs to know about the model, for one replica of a 3D
    run: the loss (the vocabulary-parallel cross-entropy under TP), the boundary tensor's shape and
    the dtype (``executor.StageSpec``)."""

    def __init__(self, cfg: Config, groups):
        self.batch, self.torch_dtype = cfg.batch // cfg.dp, cfg.torch_dtype
        self.seq, self.hidden, self.tp = cfg.seq, cfg.hidden, cfg.tp
        self.sequence_parallel = cfg.sequence_parallel and cfg.tp > 1
        self.loss = functools.partial(_parallel_loss, group=groups.tp_group) if cfg.tp > 1 else models.cross_entropy

    def boundary_shape(self, rows: int) -> tuple[int, ...]:
        """``(rows, seq, hidden)``, or this rank's sequence shard ``(rows, seq/tp, hidden)``."""
        return (rows, self.seq // self.tp if self.sequence_parallel else self.seq, self.hidden)


def _parallel_loss(logits, targets, group):
    return vocab_parallel_cross_entropy(logits, targets, group).mean()  # (B, T, V/tp) -> scalar


def tp_sharded(module: nn.Module) -> set[int]:
    """ids of the parameters split across the TP group (the others are replicated copies)."""
    out = set()
    for m in module.modules():
        if isinstance(m, layers.ColumnParallelLinear):
            out |= {id(p) for p in m.parameters(recurse=False)}
        elif isinstance(m, (layers.RowParallelLinear, layers.VocabParallelEmbedding)):
            out.add(id(m.weight))
    return out
