"""Context parallelism on real ranks, checked against the dense attention on one process.

    from parallel_lab.context.run import run_context
    run_context(cp=4, variant="ring", causal=True)
    # {"cp": 4, "variant": "ring", "max_output_diff": 1e-15, "max_grad_diff": 1e-14,
    #  "score_bytes_per_rank": {"measured": 8192, "predicted": 8192, "one_process": 131072, ...},
    #  "bytes_sent_per_rank": {"measured": 163840, "predicted": 163840},
    #  "collectives": {"irecv": {"count": 10, ...}, "isend": {"count": 10, "bytes": 163840}}, ...}

The course GPT's attention layer (``models.CausalSelfAttention``) is used as it is: each rank
builds it from the seed and ``ContextParallelAttention`` runs its own q, k, v and output
projections on the rank's part of the sequence (they act per token), with the attention core in
between replaced by ring attention (``ring``, zig-zag layout) or DeepSpeed-Ulysses (``ulysses``,
consecutive positions). Each rank's weight gradients cover its tokens only; one all-reduce over the
cp group sums them (Megatron-LM folds it into the data-parallel one), reported apart as ``grad_sync``.

The reference: the dense module's forward and backward on the whole sequence (causal), or, not
causal, the same module's projections around ``F.scaled_dot_product_attention(is_causal=False)``
(the dense module is causal only). Compared in fp64: each rank's output and input gradient with its
part of the reference, every weight gradient (after the sum) with the reference's.

Measured on the ranks and compared with ``cost.context_cost``: the bytes each rank sends (commlog),
and the largest attention-score tensor a rank materialises at once, forward or backward
(``blockwise.measuring``): ring ``B·n·(seq/cp)²``, Ulysses ``B·(n/cp)·seq²``, one process ``B·n·seq²``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parallel_lab import hardware, models
from parallel_lab.checks import positive_int
from parallel_lab.context import blockwise
from parallel_lab.context.cost import VARIANTS, context_cost
from parallel_lab.context.ring import ring_attention
from parallel_lab.context.ulysses import ulysses_attention
from parallel_lab.i18n import _
from parallel_lab.runtime import commlog, launcher

DEFAULT_CONFIG = models.GPTConfig(vocab=8, seq=32, hidden=64, heads=8, layers=1)  # cp 1, 2, 4, 8
CORES = {"ring": ring_attention, "ulysses": ulysses_attention}


def check_context_parallel(config: models.GPTConfig, cp: int, variant: str) -> None:
    """Raise ValueError naming the broken invariant, before any process starts."""
    positive_int("cp", cp)
    if cp > launcher.MAX_WORLD_SIZE:
        raise ValueError(_("cp {cp} > {most}, the most ranks the launcher starts (launcher.MAX_WORLD_SIZE)").format(
            cp=cp, most=launcher.MAX_WORLD_SIZE))
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if variant == "ring" and config.seq % (2 * cp):
        raise ValueError(_("seq {seq} is not divisible by 2·cp = {chunks} (the zig-zag split gives each of the cp "
                           "{cp} ranks two of 2·cp equal chunks)").format(seq=config.seq, chunks=2 * cp, cp=cp))
    if variant == "ulysses" and config.heads % cp:
        raise ValueError(_("heads {heads} is not divisible by cp {cp} (Ulysses gives each rank heads / cp of the "
                           "heads)").format(heads=config.heads, cp=cp))
    if variant == "ulysses" and config.seq % cp:
        raise ValueError(_("seq {seq} is not divisible by cp {cp} (each rank holds seq / cp positions)").format(
            seq=config.seq, cp=cp))


def shard(x, variant: str, cp: int, rank: int):
    """Rank ``rank``'s part of ``x`` ``(B, seq, ...)``: zig-zag (ring) or consecutive (Ulysses)."""
    if variant == "ring":
        return blockwise.zigzag_shard(x, cp, rank, dim=1)
    return x.chunk(cp, dim=1)[rank]


def unshard(parts, variant: str):
    """The whole ``(B, seq, ...)`` tensor from every rank's ``shard``, in rank order."""
    return blockwise.zigzag_unshard(parts, dim=1) if variant == "ring" else torch.cat(parts, dim=1)


class ContextParallelAttention(nn.Module):
    """``(B, seq/cp, H) -> (B, seq/cp, H)``: the dense module's projections on this rank's tokens,
    ring or Ulysses attention over the cp group in between. Shares ``dense``'s weights."""

    def __init__(self, dense: models.CausalSelfAttention, variant: str, causal: bool = True, group=None):
        super().__init__()
        self.dense, self.core, self.causal, self.group = dense, CORES[variant], causal, group

    def forward(self, x):  # (B, t, H), t = seq / cp
        B, t, H = x.shape
        d = self.dense.head_dim
        # (B, t, H) -> (B, n, t, d)
        q, k, v = (proj(x).view(B, t, H // d, d).transpose(1, 2)
                   for proj in (self.dense.q, self.dense.k, self.dense.v))
        y = self.core(q, k, v, self.causal, self.group)  # (B, n, t, d)
        return self.dense.proj(y.transpose(1, 2).reshape(B, t, H))


def allreduce_grads(module: nn.Module, group=None) -> None:
    """Sum the weight gradients over the cp group: one all-reduce of them all, flattened."""
    grads = [p.grad for p in module.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def build(config, seed: int, dtype):
    return models.init_weights(models.CausalSelfAttention(config), seed).to(dtype)


def dense_forward(dense: models.CausalSelfAttention, x, causal: bool):
    """The single-process reference: the module itself (causal), or its projections around
    bidirectional attention."""
    if causal:
        return dense(x)
    B, T, H = x.shape
    d = dense.head_dim
    q, k, v = (p(x).view(B, T, H // d, d).transpose(1, 2) for p in (dense.q, dense.k, dense.v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # (B, n, T, d)
    return dense.proj(y.transpose(1, 2).reshape(B, T, H))


def reference(config=DEFAULT_CONFIG, causal: bool = True, dtype=torch.float64, seed: int = 0,
              batch: int = 2) -> dict:
    """Forward and backward of the dense attention on one process (no torch.distributed)."""
    dense = build(config, seed, dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((batch, config.seq, config.hidden), generator=gen).to(dtype).requires_grad_()
    out = dense_forward(dense, x, causal)
    grad_output = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(grad_output)
    return {"x": x.detach(), "output": out.detach(), "grad_output": grad_output, "input_grad": x.grad,
            "grads": {name: p.grad for name, p in dense.named_parameters()}}


def max_diff(a, b) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def check_case(variant: str, causal: bool = True, config=DEFAULT_CONFIG, dtype=torch.float64, seed: int = 0,
               batch: int = 2, ref: dict | None = None, group=None) -> dict:
    """Rank function: ``variant`` over ``group`` against ``ref``. Returns this rank's
    ``output_diff``, ``grad_diff`` (max over the input and every weight), ``grad_diffs`` by name, its
    ``output``, the collectives of ``forward``, ``backward`` and ``grad_sync``, and the score meters
    (``scores_forward``, ``scores_backward``: ``peak_bytes``, ``total_bytes``, ``blocks``)."""
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    ref = reference(config, causal, dtype, seed, batch) if ref is None else ref
    model = ContextParallelAttention(build(config, seed, dtype), variant, causal, group)
    x = shard(ref["x"], variant, cp, rank).clone().requires_grad_()
    with commlog.recording() as forward, blockwise.measuring() as scores_forward:
        out = model(x)
    with commlog.recording() as backward, blockwise.measuring() as scores_backward:
        out.backward(shard(ref["grad_output"], variant, cp, rank))
    with commlog.recording() as grad_sync:
        allreduce_grads(model, group)
    grad_diffs = {name.removeprefix("dense."): max_diff(p.grad, ref["grads"][name.removeprefix("dense.")])
                  for name, p in model.named_parameters()}
    grad_diffs["<input>"] = max_diff(x.grad, shard(ref["input_grad"], variant, cp, rank))
    return {
        "rank": rank, "variant": variant, "causal": causal,
        "output_diff": max_diff(out.detach(), shard(ref["output"], variant, cp, rank)),
        "grad_diff": max(grad_diffs.values()), "grad_diffs": grad_diffs, "output": out.detach(),
        "forward": forward.as_dict(), "backward": backward.as_dict(), "grad_sync": grad_sync.as_dict(),
        "scores_forward": scores_forward.as_dict(), "scores_backward": scores_backward.as_dict(),
    }


def check_cases(jobs: list[dict]) -> list[dict]:
    """Rank function: ``check_case(**job)`` for each job, in one launch (tests use it per cp)."""
    return [check_case(**job) for job in jobs]


def bytes_sent(collectives: dict, cp: int) -> int:
    """Bytes a rank sends, from commlog's per-call bytes: every ``isend``; of an ``all_to_all_single``
    (commlog counts the rank's whole buffer) the ``(cp-1)/cp`` that leaves the rank."""
    sent = collectives.get("isend", {}).get("bytes", 0)
    return sent + (cp - 1) * collectives.get("all_to_all_single", {}).get("bytes", 0) // cp


def summarize(results: list[dict], variant: str, causal: bool, config, batch: int, dtype) -> dict:
    """The ``run context`` report from every rank's ``check_case`` result."""
    cp, first = len(results), results[0]
    element = torch.tensor([], dtype=dtype).element_size()
    cost = context_cost(variant, batch=batch, seq=config.seq, hidden=config.hidden, heads=config.heads, cp=cp,
                        link=hardware.PCIE4, dtype_bytes=element, causal=causal)
    collectives = commlog.merge_counts(first["forward"], first["backward"])
    return {
        "cp": cp, "variant": variant, "causal": causal, "dtype": str(dtype).removeprefix("torch."),
        "config": dataclasses.asdict(config), "batch": batch,
        "max_output_diff": max(r["output_diff"] for r in results),
        "max_grad_diff": max(r["grad_diff"] for r in results),
        "score_bytes_per_rank": {
            "measured": max(max(r["scores_forward"]["peak_bytes"], r["scores_backward"]["peak_bytes"])
                            for r in results),
            "predicted": cost.score_peak_bytes,
            "forward_total_measured": max(r["scores_forward"]["total_bytes"] for r in results),
            "forward_total_predicted": cost.score_forward_bytes,
            "one_process": batch * config.heads * config.seq ** 2 * element,
            "what": "the largest attention-score tensor (batch x heads x query rows x key columns) one rank "
                    "materialises at once, forward or backward; forward_total: all score blocks of a forward",
        },
        "bytes_sent_per_rank": {"measured": max(bytes_sent(commlog.merge_counts(r["forward"], r["backward"]), cp)
                                                for r in results),
                                "predicted": cost.bytes_sent},
        "collectives": collectives, "forward": first["forward"], "backward": first["backward"],
        "grad_sync": first["grad_sync"],
    }


def run_context(cp: int, variant: str = "ring", causal: bool = True, seq: int | None = None,
                heads: int | None = None, batch: int = 2, dtype=torch.float64, seed: int = 0, *,
                config: models.GPTConfig = DEFAULT_CONFIG, timeout: float = 120.0) -> dict:
    """``parallel-lab run context``: the course attention with ``variant`` on ``cp`` ranks against
    the dense module. ``seq`` / ``heads`` replace the config's (hidden kept: heads must divide it).
    Returns the command's JSON dict (``collectives``: rank 0's, one forward and backward of the
    attention; the weight-gradient sum is reported apart as ``grad_sync``)."""
    positive_int("batch", batch)
    changes = {k: v for k, v in (("seq", seq), ("heads", heads)) if v is not None}
    config = dataclasses.replace(config, **changes)  # GPTConfig checks its own sizes
    check_context_parallel(config, cp, variant)  # before any process starts
    ref = reference(config, causal, dtype, seed, batch)
    job = dict(variant=variant, causal=causal, config=config, dtype=dtype, seed=seed, batch=batch, ref=ref)
    results = launcher.run(check_case, cp, kwargs=job, timeout=timeout)
    return summarize(results, variant, causal, config, batch, dtype)
