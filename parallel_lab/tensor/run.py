"""Run tensor-parallel layers on real ranks and check them against the dense model on one process.

    from parallel_lab.tensor.run import run_tensor
    run_tensor(tp=4, model="block", sequence_parallel=True)
    # {"tp": 4, "model": "block", "max_output_diff": 4e-16, "max_grad_diff": 1e-15,
    #  "collectives": {"all_gather_single": {...}, "reduce_scatter_single": {...}}, ...}

The parent computes the reference once with the dense module (``reference``) and sends it to the
ranks; every rank (``check_case``) rebuilds the same dense module from the seed, parallelizes it,
runs forward and backward on its shard of the input, and compares its output and every gradient
with the matching shard of the reference. The expected gradient shards come from cutting a copy of
the dense module whose weights *are* the reference gradients, with the same ``from_dense`` code:
whatever slicing a layer does to weights, it does to their gradients.

Layouts: ``replicated`` (every rank has it all), ``hidden`` (split along the last dimension),
``sequence`` (split along dimension 1, sequence parallelism).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parallel_lab import models
from parallel_lab.runtime import commlog, launcher
from parallel_lab.tensor import layers
from parallel_lab.tensor.plan import check_tensor_parallel, parallelize

DEFAULT_CONFIG = models.GPTConfig(vocab=96, seq=24, hidden=192, heads=24, layers=2)  # tp 1,2,3,4,6,8
MODELS = ("mlp", "block", "gpt")


class DenseCrossEntropy(nn.Module):
    """Per-token loss ``(B, T)`` from ``(B, T, V)`` logits: the reference for the parallel loss."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


class VocabParallelCrossEntropy(nn.Module):
    def __init__(self, group=None):
        super().__init__()
        self.group = group

    def forward(self, logits, targets):
        return layers.vocab_parallel_cross_entropy(logits, targets, self.group)


def _linear(fan_in, fan_out):
    return lambda cfg, seed: models.init_weights(nn.Linear(fan_in(cfg), fan_out(cfg)), seed)


def _hidden(cfg):
    return cfg.hidden


def _wide(cfg):
    return 2 * cfg.hidden


@dataclass(frozen=True)
class Case:
    """A dense module, how to parallelize it, its input and layouts (``"in>out"``; SP: None = n/a)."""

    build: Callable  # (config, seed) -> dense module
    parallel: Callable  # (dense, group, sequence_parallel) -> parallel module
    input: str  # "hidden" (B, T, H), "wide" (B, T, 2H), "ids" (B, T), "logits" (B, T, V) + targets,
    #             "tokens": ids and next-token targets, backward from the mean loss (the GPT)
    layouts: str
    sp_layouts: str | None


L = layers  # short, for the table
CASES = {
    "column": Case(_linear(_hidden, _wide),
                   lambda m, g, sp: L.ColumnParallelLinear.from_dense(m, g, sequence_parallel=sp),
                   "hidden", "replicated>hidden", "sequence>hidden"),
    "column_gather": Case(_linear(_hidden, _wide),
                          lambda m, g, sp: L.ColumnParallelLinear.from_dense(m, g, gather_output=True,
                                                                             sequence_parallel=sp),
                          "hidden", "replicated>replicated", "sequence>replicated"),
    "row": Case(_linear(_wide, _hidden),
                lambda m, g, sp: L.RowParallelLinear.from_dense(m, g, sequence_parallel=sp),
                "wide", "hidden>replicated", "hidden>sequence"),
    "row_split": Case(_linear(_wide, _hidden),
                      lambda m, g, sp: L.RowParallelLinear.from_dense(m, g, input_is_parallel=False,
                                                                      sequence_parallel=sp),
                      "wide", "replicated>replicated", "replicated>sequence"),
    "parallel_mlp": Case(lambda cfg, seed: models.MLP(cfg.hidden, seed),
                         lambda m, g, sp: L.ParallelMLP.from_dense(m, g, sequence_parallel=sp),
                         "hidden", "replicated>replicated", "sequence>sequence"),
    "attention": Case(lambda cfg, seed: models.init_weights(models.CausalSelfAttention(cfg), seed),
                      lambda m, g, sp: L.ParallelSelfAttention.from_dense(m, g, sequence_parallel=sp),
                      "hidden", "replicated>replicated", "sequence>sequence"),
    "embedding": Case(lambda cfg, seed: models.init_weights(nn.Embedding(cfg.vocab, cfg.hidden), seed),
                      lambda m, g, sp: L.VocabParallelEmbedding.from_dense(m, g, sequence_parallel=sp),
                      "ids", "replicated>replicated", "replicated>sequence"),
    "cross_entropy": Case(lambda cfg, seed: DenseCrossEntropy(),
                          lambda m, g, sp: VocabParallelCrossEntropy(g),
                          "logits", "hidden>replicated", None),
    # the three `run tensor` models, parallelized by their default plans
    "mlp": Case(lambda cfg, seed: models.MLP(cfg.hidden, seed),
                lambda m, g, sp: parallelize(m, None, g, sequence_parallel=sp),
                "hidden", "replicated>replicated", "sequence>sequence"),
    "block": Case(lambda cfg, seed: models.Block(cfg, seed),
                  lambda m, g, sp: parallelize(m, None, g, sequence_parallel=sp),
                  "hidden", "replicated>replicated", "sequence>sequence"),
    "gpt": Case(lambda cfg, seed: models.GPT(cfg, seed),
                lambda m, g, sp: parallelize(m, None, g, sequence_parallel=sp),
                "tokens", "replicated>hidden", "replicated>hidden"),
}


def _inputs(case: Case, config, batch, seed, dtype):
    """``(inputs, targets)``, the same in every process: ``inputs`` is ``[x]`` (``[logits, targets]``
    for the loss case); ``targets`` is set for the GPT only, which backpropagates its mean loss."""
    gen = torch.Generator().manual_seed(seed + 1)
    width = {"hidden": config.hidden, "wide": 2 * config.hidden, "logits": config.vocab}.get(case.input)
    if case.input in ("ids", "tokens"):
        idx, targets = models.random_tokens(config, batch, seed + 1)
        return [idx], targets if case.input == "tokens" else None
    x = torch.randn((batch, config.seq, width), generator=gen).to(dtype)
    if case.input == "logits":
        return [x, torch.randint(config.vocab, (batch, config.seq), generator=gen)], None
    return [x], None


def shard(tensor, layout: str, rank: int, tp: int):
    """This rank's part of ``tensor`` in ``layout`` (``replicated``, ``hidden`` or ``sequence``)."""
    if tensor is None or layout == "replicated":
        return tensor
    return tensor.chunk(tp, dim=-1 if layout == "hidden" else 1)[rank]


def reference(case: str, config=DEFAULT_CONFIG, dtype=torch.float64, seed: int = 0, batch: int = 2) -> dict:
    """Forward and backward of the dense module on one process (no torch.distributed)."""
    c = CASES[case]
    dense = c.build(config, seed).to(dtype)
    inputs, targets = _inputs(c, config, batch, seed, dtype)
    x = inputs[0].clone().requires_grad_(inputs[0].is_floating_point())
    out = dense(x, *inputs[1:])
    loss = grad_output = None
    if targets is not None:  # the GPT: backward from the mean next-token loss
        loss = models.cross_entropy(out, targets)
        loss.backward()
    else:
        gen = torch.Generator().manual_seed(seed + 2)
        grad_output = torch.randn(out.shape, generator=gen).to(dtype)
        out.backward(grad_output)
    return {
        "inputs": inputs, "targets": targets, "output": out.detach(), "grad_output": grad_output,
        "loss": None if loss is None else loss.detach(), "input_grad": x.grad,
        "grads": {name: p.grad for name, p in dense.named_parameters()},
    }


class SavedBytes:
    """Bytes of the tensors autograd saves for the backward inside ``with counter.saved():``, the
    parameters left out: each storage once, from the lowest to the highest byte any saved tensor
    reaches (the rule of ``parallel_lab.pipeline.activation_bytes``, which this layer may not import)."""

    def __init__(self, exclude=()):
        self.skip = {t.untyped_storage().data_ptr() for t in exclude}
        self.extents: dict[int, tuple[int, int]] = {}

    def add(self, t):
        if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in self.skip:
            size, first = t.element_size(), t.storage_offset()
            last = first + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
            lo, hi = self.extents.get(t.untyped_storage().data_ptr(), (first * size, (last + 1) * size))
            self.extents[t.untyped_storage().data_ptr()] = (min(lo, first * size), max(hi, (last + 1) * size))
        return t

    @property
    def total(self) -> int:
        return sum(hi - lo for lo, hi in self.extents.values())

    @contextmanager
    def saved(self):
        with torch.autograd.graph.saved_tensors_hooks(self.add, lambda t: t):
            yield self


def max_diff(a, b) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def check_case(case: str, config=DEFAULT_CONFIG, sequence_parallel: bool = False, dtype=torch.float64,
               seed: int = 0, batch: int = 2, ref: dict | None = None, group=None) -> dict:
    """Rank function: run ``case`` tensor-parallel over ``group`` and compare with ``ref``.

    Returns this rank's ``output_diff``, ``grad_diff`` (max over every parameter and the input),
    ``grad_diffs`` by name, ``loss_diff`` (gpt), its ``output``, the collectives it made in
    ``forward``, ``backward`` and the sequence-parallel gradient sum ``grad_sync``, and
    ``saved_bytes``: what autograd kept for the backward on this rank (``SavedBytes``).
    """
    c = CASES[case]
    rank, tp = dist.get_rank(group), dist.get_world_size(group)
    ref = reference(case, config, dtype, seed, batch) if ref is None else ref
    in_layout, out_layout = (c.sp_layouts if sequence_parallel else c.layouts).split(">")
    model = c.parallel(c.build(config, seed).to(dtype), group, sequence_parallel)
    x = shard(ref["inputs"][0], in_layout, rank, tp).clone()
    x.requires_grad_(x.is_floating_point())

    with commlog.recording() as forward, SavedBytes(exclude=model.parameters()).saved() as saved:
        out = model(x, *ref["inputs"][1:])
        if ref["targets"] is not None:
            loss = layers.vocab_parallel_cross_entropy(out, ref["targets"], group).mean()
    with commlog.recording() as backward:
        if ref["targets"] is not None:
            loss.backward()
        else:
            out.backward(shard(ref["grad_output"], out_layout, rank, tp))
    with commlog.recording() as grad_sync:
        layers.allreduce_sequence_parallel_grads(model, group)

    # The expected gradient shards: cut the reference gradients like the weights.
    grads_as_weights = c.build(config, seed).to(dtype)
    with torch.no_grad():
        for name, p in grads_as_weights.named_parameters():
            p.copy_(ref["grads"][name])
    expected = dict(c.parallel(grads_as_weights, group, sequence_parallel).named_parameters())
    grad_diffs = {name: max_diff(p.grad, expected[name]) for name, p in model.named_parameters()}
    if x.requires_grad:
        grad_diffs["<input>"] = max_diff(x.grad, shard(ref["input_grad"], in_layout, rank, tp))
    result = {
        "rank": rank, "case": case, "sequence_parallel": sequence_parallel,
        "output_diff": max_diff(out.detach(), shard(ref["output"], out_layout, rank, tp)),
        "grad_diff": max(grad_diffs.values(), default=0.0), "grad_diffs": grad_diffs,
        "output": out.detach(), "forward": forward.as_dict(), "backward": backward.as_dict(),
        "grad_sync": grad_sync.as_dict(), "saved_bytes": saved.total,
    }
    if ref["targets"] is not None:
        result["loss_diff"] = abs(loss.item() - ref["loss"].item())
    return result


def check_cases(jobs: list[dict]) -> list[dict]:
    """Rank function: ``check_case(**job)`` for each job, in one launch (tests use it per tp)."""
    return [check_case(**job) for job in jobs]


def ring_bytes(collectives: dict, tp: int) -> float:
    """Bytes each rank sends with ring algorithms, from commlog's per-call bytes (what a rank passes
    in): all-reduce of N sends 2(p-1)/p N; reduce-scatter of an N input (p-1)/p N; all-gather of an
    N/p shard (p-1) N/p. So an all-reduce costs exactly one reduce-scatter plus one all-gather."""
    factor = {"all_reduce": 2 * (tp - 1) / tp, "reduce_scatter_single": (tp - 1) / tp,
              "all_gather_single": tp - 1}
    return sum(row["bytes"] * factor.get(op, 0.0) for op, row in collectives.items())


def run_tensor(tp: int, model: str = "mlp", sequence_parallel: bool = False, dtype=torch.float64,
               seed: int = 0, *, config: models.GPTConfig = DEFAULT_CONFIG, batch: int = 2,
               timeout: float = 60.0) -> dict:
    """``parallel-lab run tensor``: run ``model`` ("mlp", "block" or "gpt") on ``tp`` ranks and
    compare with the dense model. Returns the command's JSON dict (``collectives``: rank 0's, one
    forward and backward; the sequence-parallel gradient sum is reported apart as ``grad_sync``)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    check_tensor_parallel(config, tp, sequence_parallel)  # before any process starts
    ref = reference(model, config, dtype, seed, batch)
    job = dict(case=model, config=config, sequence_parallel=sequence_parallel, dtype=dtype, seed=seed,
               batch=batch, ref=ref)
    results = launcher.run(check_case, tp, kwargs=job, timeout=timeout)
    first = results[0]
    report = {
        "tp": tp, "model": model, "sequence_parallel": sequence_parallel,
        "dtype": str(dtype).removeprefix("torch."), "config": dataclasses.asdict(config), "batch": batch,
        "max_output_diff": max(r["output_diff"] for r in results),
        "max_grad_diff": max(r["grad_diff"] for r in results),
        "collectives": commlog.merge_counts(first["forward"], first["backward"]),
        "forward": first["forward"], "backward": first["backward"], "grad_sync": first["grad_sync"],
    }
    report["ring_bytes"] = ring_bytes(report["collectives"], tp)
    if model == "gpt":
        report["loss_diff"] = max(r["loss_diff"] for r in results)
    return report
