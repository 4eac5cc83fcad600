"""A 3D training run as plain data, and everything checked about it before any process starts.

    from parallel_lab.parallel3d.config import Config, check
    cfg = Config(dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, steps=4)
    schedule = check(cfg, world_size=4)        # ValueError / ScheduleError naming the broken invariant
    predicted_memory(cfg)["total"]             # bytes on the busiest device (planning.memory_model)

``parallel3d.train3d`` trains a ``Config`` (``parallel-lab run 3d``); ``parallel3d.apply`` holds the
three techniques it applies to the dense GPT.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from parallel_lab import models
from parallel_lab.checks import positive_int
from parallel_lab.i18n import _
from parallel_lab.parallel3d import data_parallel
from parallel_lab.pipeline.schedules import Schedule, build, stages_per_rank
from parallel_lab.pipeline.stages import DTYPES, check_blocks
from parallel_lab.pipeline.validate import validate
from parallel_lab.planning import memory, memory_model
from parallel_lab.runtime.mesh import ParallelDims
from parallel_lab.tensor.plan import check_tensor_parallel

OPTIMIZERS = ("sgd", "adam")
_OPT_STATES = {"sgd": 0, "adam": 2}  # optimizer tensors per parameter (Adam: two moments)


@dataclass(frozen=True)
class Config:
    """One 3D training run, as plain data (it is what the parent sends to the ranks).

    dp, pp, tp:    the mesh; ``dp * pp * tp`` ranks, ``nodes`` machines (TP stays inside one)
    schedule:      a pipeline schedule of ``parallel_lab.pipeline.schedules`` (``virtual`` stages per rank
                   for interleaved-1f1b)
    microbatches:  per replica and step; ``batch / dp`` rows split into this many equal chunks
    batch:         sequences per step, all replicas together
    layers, hidden, heads, vocab, seq: the tiny GPT (``models.GPTConfig``)
    optimizer, lr: "sgd" or "adam" on every rank's shard (element-wise, so shards = dense)
    zero:          0: every replica keeps Adam's moments of its whole shard and all-reduces the
                   gradients; 1: ZeRO-1 over the dp group (``zero.sharded_adam.ShardedAdam``: each
                   replica keeps 1/dp of the moments, reduce-scatter then all-gather)
    recompute:     GPipe's re-materialisation: keep only stage inputs, redo the forward in backward
    sequence_parallel: Megatron's sequence parallelism inside TP (activations between stages are
                   then sequence shards too)
    """

    dp: int = 1
    pp: int = 2
    tp: int = 2
    schedule: str = "1f1b"
    microbatches: int = 2
    virtual: int = 1
    steps: int = 3
    batch: int = 8
    layers: int = 4
    hidden: int = 16
    heads: int = 4
    vocab: int = 32
    seq: int = 8
    optimizer: str = "adam"
    lr: float = 0.01
    dtype: str = "float64"
    seed: int = 0
    recompute: bool = False
    sequence_parallel: bool = False
    bucket_bytes: int = data_parallel.DEFAULT_BUCKET_BYTES
    nodes: int = 1
    zero: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def gpt(self) -> models.GPTConfig:
        return models.GPTConfig(vocab=self.vocab, seq=self.seq, hidden=self.hidden, heads=self.heads,
                                layers=self.layers)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        return _("dp {dp} x pp {pp} x tp {tp} = {world} ranks, {schedule}{virtual}, {m} micro-batches of "
                 "{rows} x {seq} tokens per replica").format(
            dp=self.dp, pp=self.pp, tp=self.tp, world=self.world_size, schedule=self.schedule,
            virtual=f" (v={self.virtual})" if self.virtual > 1 else "", m=self.microbatches,
            rows=self.batch // self.dp // self.microbatches, seq=self.seq)


# ----------------------------------------------------------------------------------------------
# Checks made before any process starts: each names the broken invariant with its values.


def check(cfg: Config, world_size: int | None = None, memory_limit_gb: float | None = None) -> Schedule:
    """Raise ValueError (a ``ScheduleError`` for schedules) if ``cfg`` cannot run; return its
    validated pipeline schedule. ``world_size``: the ranks available (torchrun's); the mesh must
    fill them exactly. ``memory_limit_gb``: per device, checked with ``memory_model`` (weights,
    gradients and optimizer state in ``cfg.dtype``, activations of the schedule's peak)."""
    dims = ParallelDims(cfg.dp, cfg.pp, cfg.tp, cfg.nodes)  # positive ints, TP inside a node
    if world_size is not None:
        dims.check_world_size(world_size)
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(_("optimizer must be one of {choices}, got {optimizer}").format(
            choices=OPTIMIZERS, optimizer=repr(cfg.optimizer)))
    if cfg.dtype not in DTYPES:
        raise ValueError(_("dtype must be one of {choices}, got {dtype}").format(choices=tuple(DTYPES),
                                                                                 dtype=repr(cfg.dtype)))
    if cfg.zero not in (0, 1):
        raise ValueError(_("3D training shards at most the optimizer state: zero must be 0 or 1 (ZeRO-1), got zero "
                           "{zero} (stages 2-3 run on their own: parallel-lab run zero)").format(zero=repr(cfg.zero)))
    if cfg.zero and cfg.optimizer != "adam":
        raise ValueError(_("zero 1 shards Adam's moments; optimizer {optimizer} keeps no state to shard").format(
            optimizer=repr(cfg.optimizer)))
    for name in ("steps", "batch", "microbatches"):
        positive_int(name, getattr(cfg, name))
    schedule = validate(build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual))
    gpt = cfg.gpt  # positive sizes, hidden % heads
    check_blocks("gpt", cfg.layers, schedule.n_stages)
    if cfg.batch % cfg.dp:
        raise ValueError(_("batch {batch} is not divisible by dp {dp} (replicas need equal rows)").format(
            batch=cfg.batch, dp=cfg.dp))
    if (cfg.batch // cfg.dp) % cfg.microbatches:
        raise ValueError(_("batch / dp = {rows} rows per replica are not divisible by microbatches {m} (micro-batches "
                           "must be equal for the loss to be the whole-batch mean)").format(
            rows=cfg.batch // cfg.dp, m=cfg.microbatches))

    check_tensor_parallel(gpt, cfg.tp, cfg.sequence_parallel and cfg.tp > 1)
    if memory_limit_gb is not None:
        need = predicted_memory(cfg)
        if need["total"] > memory_limit_gb * memory.GB:
            gb = {k: need[k] / memory.GB for k in ("total", "weights", "gradients", "optimizer", "activations")}
            raise ValueError(_("plan does not fit: stage {stage} needs {total:.3g} GB (weights {weights:.3g}, "
                               "gradients {gradients:.3g}, optimizer {optimizer:.3g}, activations {activations:.3g}) "
                               "> memory limit {limit:g} GB per device").format(stage=need["stage"],
                                                                              limit=memory_limit_gb, **gb))
    return schedule


def precision(cfg: Config) -> memory.Precision:
    """Bytes per parameter and per activation value of this run (no mixed precision here)."""
    v = torch.tensor([], dtype=cfg.torch_dtype).element_size()
    return memory.Precision(f"{cfg.dtype} {cfg.optimizer}", v, v, _OPT_STATES[cfg.optimizer] * v, v)


def predicted_memory(cfg: Config) -> dict:
    """``memory_model.max_device_memory`` for this run (bytes on the most loaded device)."""
    model = memory.ModelConfig("tiny GPT", cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, cfg.seq)
    stages = cfg.pp * stages_per_rank(cfg.schedule, cfg.virtual)
    if cfg.layers % stages:
        raise ValueError(_("the memory model needs equal stages: layers {layers} % {stages} stages != 0").format(
            layers=cfg.layers, stages=stages))
    return memory_model.max_device_memory(
        model, micro_batch=cfg.batch // cfg.dp // cfg.microbatches, dp=cfg.dp, pp=cfg.pp, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, schedule=cfg.schedule, microbatches=cfg.microbatches,
        virtual=stages // cfg.pp, recompute="full" if cfg.recompute else "none", precision=precision(cfg),
        dropout=False, zero1=cfg.zero == 1)


def make_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    """The run's optimizer (``cfg.optimizer`` with ``cfg.lr``) over ``params``."""
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr)
