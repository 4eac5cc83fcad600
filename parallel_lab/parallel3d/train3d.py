"""3D parallelism: train the tiny GPT with data x pipeline x tensor parallelism on a device mesh.

    from parallel_lab.parallel3d import train3d
    cfg = train3d.Config(dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, steps=4)
    result = train3d.train(cfg)                 # 4 ranks; checked before any process starts
    result["losses"], result["losses_equal"], result["weights_equal"]

Each rank sits at one coordinate ``(dp, pp, tp)`` of ``mesh.ParallelDims`` (the rank grid
``arange(world).view(dp, pp, tp)``) and composes the three pieces the course built one by one:

- **tensor parallelism inside a stage**: every rank builds the same dense ``models.GPT`` from the
  seed and keeps its Megatron shard (``tensor.plan.parallelize`` over ``Groups.tp_group``); the loss
  is the vocabulary-parallel cross-entropy, so the logits are never gathered;
- **pipeline parallelism across stages**: the sharded model is cut like ``pipeline.stages.cut``
  (embedding on the first stage, head on the last, blocks balanced) and a schedule (1F1B by default;
  GPipe, ZB-H1, interleaved 1F1B, ZB-V) runs on ``pipeline.executor.Executor``, whose pipeline rank
  ``r`` is global rank ``Groups.pp_ranks[r]`` (its ``peers``);
- **data parallelism**: each replica trains on its rows of the batch and averages gradients over
  ``Groups.dp_group`` with the bucketed all-reduce of ``data_parallel``; then SGD or Adam steps.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM") is the recipe; lessons/09_3d_parallelism.ipynb the lesson. Every run is compared with
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
import functools
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab import models
from parallel_lab.checks import positive_int
from parallel_lab.parallel3d import data_parallel
from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.schedules import Schedule, build, stages_per_rank
from parallel_lab.pipeline.stages import DTYPES, Stage, check_blocks, cut_pieces
from parallel_lab.pipeline.validate import validate
from parallel_lab.planning import memory, memory_model
from parallel_lab.runtime import commlog, launcher, torchrun
from parallel_lab.runtime.mesh import ParallelDims, build_groups
from parallel_lab.tensor import layers
from parallel_lab.tensor.layers import allreduce_sequence_parallel_grads, vocab_parallel_cross_entropy
from parallel_lab.tensor.plan import check_tensor_parallel, parallelize
from parallel_lab.zero.sharded_adam import ShardedAdam

OPTIMIZERS = ("sgd", "adam")
TOLERANCE = 1e-9  # fp64: what "the same numbers" means for losses and weights
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
        return (f"dp {self.dp} x pp {self.pp} x tp {self.tp} = {self.world_size} ranks, {self.schedule}"
                f"{f' (v={self.virtual})' if self.virtual > 1 else ''}, {self.microbatches} micro-batches "
                f"of {self.batch // self.dp // self.microbatches} x {self.seq} tokens per replica")


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
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {cfg.optimizer!r}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {cfg.dtype!r}")
    if cfg.zero not in (0, 1):
        raise ValueError(f"3D training shards at most the optimizer state: zero must be 0 or 1 (ZeRO-1), "
                         f"got zero {cfg.zero!r} (stages 2-3 run on their own: parallel-lab run zero)")
    if cfg.zero and cfg.optimizer != "adam":
        raise ValueError(f"zero 1 shards Adam's moments; optimizer {cfg.optimizer!r} keeps no state to shard")
    for name in ("steps", "batch", "microbatches"):
        positive_int(name, getattr(cfg, name))
    schedule = validate(build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual))
    gpt = cfg.gpt  # positive sizes, hidden % heads
    check_blocks("gpt", cfg.layers, schedule.n_stages)
    if cfg.batch % cfg.dp:
        raise ValueError(f"batch {cfg.batch} is not divisible by dp {cfg.dp} (replicas need equal rows)")
    if (cfg.batch // cfg.dp) % cfg.microbatches:
        raise ValueError(f"batch / dp = {cfg.batch // cfg.dp} rows per replica are not divisible by "
                         f"microbatches {cfg.microbatches} (micro-batches must be equal for the loss to "
                         f"be the whole-batch mean)")

    check_tensor_parallel(gpt, cfg.tp, cfg.sequence_parallel and cfg.tp > 1)
    if memory_limit_gb is not None:
        need = predicted_memory(cfg)
        if need["total"] > memory_limit_gb * memory.GB:
            raise ValueError(f"plan does not fit: stage {need['stage']} needs {need['total'] / memory.GB:.3g} GB "
                             f"(weights {need['weights'] / memory.GB:.3g}, "
                             f"gradients {need['gradients'] / memory.GB:.3g}, "
                             f"optimizer {need['optimizer'] / memory.GB:.3g}, activations "
                             f"{need['activations'] / memory.GB:.3g}) > memory limit {memory_limit_gb:g} GB per device")
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
        raise ValueError(f"the memory model needs equal stages: layers {cfg.layers} % {stages} stages != 0")
    return memory_model.max_device_memory(
        model, micro_batch=cfg.batch // cfg.dp // cfg.microbatches, dp=cfg.dp, pp=cfg.pp, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, schedule=cfg.schedule, microbatches=cfg.microbatches,
        virtual=stages // cfg.pp, recompute="full" if cfg.recompute else "none", precision=precision(cfg),
        dropout=False, zero1=cfg.zero == 1)


# ----------------------------------------------------------------------------------------------
# One process: the reference.


def batch_for_step(cfg: Config, step: int):
    """The whole batch of step ``step``: ``(batch, seq)`` token ids and targets, the same everywhere."""
    return models.random_tokens(cfg.gpt, cfg.batch, seed=cfg.seed + 1 + step)


def make_optimizer(cfg: Config, params):
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr)


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


class _StageSpec:
    """What ``Executor`` needs to know about the model, for one replica of a 3D run: the loss (the
    vocabulary-parallel cross-entropy under TP), the boundary tensor's shape and the dtype."""

    def __init__(self, cfg: Config, group, sequence_parallel: bool):
        self.batch, self.torch_dtype = cfg.batch // cfg.dp, cfg.torch_dtype
        self.seq, self.hidden, self.tp = cfg.seq, cfg.hidden, cfg.tp
        self.sequence_parallel = sequence_parallel
        self.loss = functools.partial(_parallel_loss, group=group) if cfg.tp > 1 else models.cross_entropy

    def boundary_shape(self, rows: int) -> tuple[int, ...]:
        """``(rows, seq, hidden)``, or this rank's sequence shard ``(rows, seq/tp, hidden)``."""
        return (rows, self.seq // self.tp if self.sequence_parallel else self.seq, self.hidden)


def _parallel_loss(logits, targets, group):
    return vocab_parallel_cross_entropy(logits, targets, group).mean()  # (B, T, V/tp) -> scalar


def _model_pieces(cfg: Config, groups, state=None) -> list[nn.Module]:
    """The GPT as ``[embed, block 0, ..., head]``, this rank's TP shard of it (cut from the dense
    weights: the seed's, or ``state``), in ``cfg.dtype``."""
    dense = models.GPT(cfg.gpt, seed=cfg.seed).to(cfg.torch_dtype)
    if state is not None:
        dense.load_state_dict(state)
    if cfg.tp > 1:
        dense = parallelize(dense, group=groups.tp_group, sequence_parallel=cfg.sequence_parallel)
    return list(dense.as_sequential())


def build_stages(cfg: Config, schedule: Schedule, groups, device=None, state=None) -> dict[int, Stage]:
    """``{stage index: Stage}`` for the model stages this rank's pipeline rank holds, cut as
    ``pipeline.stages.cut_pieces`` cuts any model (embedding on the first stage, head on the last,
    blocks balanced; names global, ``"{piece}.{name}"``)."""
    mine = {s for s, r in enumerate(schedule.stage_to_rank) if r == groups.pp_rank}
    cut = cut_pieces(_model_pieces(cfg, groups, state), schedule.n_stages, head=1, tail=1, keep=mine)
    return {st.index: st._replace(module=st.module.to(device)) for st in cut if st is not None}


def _sharded(module: nn.Module) -> set[int]:
    """ids of the parameters split across the TP group (the others are replicated copies)."""
    out = set()
    for m in module.modules():
        if isinstance(m, layers.ColumnParallelLinear):
            out |= {id(p) for p in m.parameters(recurse=False)}
        elif isinstance(m, (layers.RowParallelLinear, layers.VocabParallelEmbedding)):
            out.add(id(m.weight))
    return out


def train_rank(cfg: Config, reference_state: dict | None = None, timed: bool = False,
               verbose: bool = False, schedule: Schedule | None = None) -> dict:
    """Rank function: ``cfg.steps`` training steps of this rank's part of the 3D-parallel GPT.

    Returns ``rank``, ``coords`` (dp, pp, tp), ``losses`` (per step, the mean over the whole batch;
    on the last pipeline stage, else None), ``step_s`` (wall seconds of each step, from a common
    start with ``timed``), ``cpu_s`` (CPU seconds of this process in each step), ``checksum`` (this
    rank's share of the sum of every weight of the model: sharded weights on every TP rank,
    replicated ones on TP rank 0, replica 0 only) and, given the reference's final dense ``state``,
    ``max_weight_diff`` of this rank's weights against the same shard cut from it. ``verbose``: the first replica's last
    stage prints ``step k/n loss ...``.
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


def _train(cfg, schedule, groups, reference_state, timed, verbose) -> dict:
    device = _device()
    sp = cfg.sequence_parallel and cfg.tp > 1
    stages = build_stages(cfg, schedule, groups, device)
    ex = Executor(schedule, stages, _StageSpec(cfg, groups.tp_group, sp), groups.pp_rank,  # validated by check
                  recompute=cfg.recompute, peers=groups.pp_ranks, check=False)
    params = [p for st in stages.values() for p in st.module.parameters()]
    opt = ShardedAdam(params, groups.dp_group, cfg.lr) if cfg.zero else make_optimizer(cfg, params)
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
        if sp:  # replicated parameters used on a sequence shard: sum their partial gradients
            for st in stages.values():
                allreduce_sequence_parallel_grads(st.module, groups.tp_group)
        if cfg.zero:  # ZeRO-1: the step reduce-scatters, updates this replica's slice, all-gathers
            commlog.set_activity(f"ZeRO-1 step (reduce-scatter, Adam on a slice, all-gather), step {step + 1}")
        elif cfg.dp > 1:
            commlog.set_activity(f"data-parallel gradient all-reduce, step {step + 1}")
            data_parallel.allreduce_gradients(params, groups.dp_group, cfg.bucket_bytes)
        opt.step()
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
    sharded = _sharded(nn.ModuleList(st.module for st in stages.values()))
    checksum = 0.0
    if groups.dp_rank == 0:
        checksum = sum(p.detach().double().sum().item() for p in params
                       if id(p) in sharded or groups.tp_rank == 0)
    out = {"rank": groups.rank, "coords": (groups.dp_rank, groups.pp_rank, groups.tp_rank),
           "losses": losses if last else None, "step_s": step_s, "cpu_s": cpu_s, "checksum": checksum,
           "optimizer_bytes": _optimizer_bytes(opt)}
    if reference_state is not None:
        ref = build_stages(cfg, schedule, groups, device, state=reference_state)
        out["max_weight_diff"] = max(
            (p - q).abs().max().item()
            for s in stages for p, q in zip(stages[s].module.parameters(), ref[s].module.parameters()))
    return out


def _optimizer_bytes(opt) -> int:
    """Bytes of optimizer state this rank holds after its steps (Adam: both moments; SGD: none)."""
    if isinstance(opt, ShardedAdam):
        return opt.state_bytes()
    return sum(t.numel() * t.element_size() for state in opt.state.values() for t in state.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


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
    launcher.check_world_size(cfg.world_size)
    schedule = check(cfg, memory_limit_gb=memory_limit_gb)
    say = progress or (lambda line: None)
    ref = reference(cfg)
    say(f"training the tiny GPT ({cfg.layers} layers, hidden {cfg.hidden}) on {cfg.describe()}, "
        f"{cfg.steps} steps of {cfg.optimizer} ...")
    ranks = launcher.run(train_rank, cfg.world_size, kwargs=dict(cfg=cfg, reference_state=ref["state"],
                                                                 timed=timed, schedule=schedule),
                         timeout=timeout)
    result = summarize(cfg, ranks, ref)
    for k, loss in enumerate(result["losses"]):
        say(f"step {k + 1}/{cfg.steps} loss {loss:.6f} (one process: {result['reference_losses'][k]:.6f})")
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
