"""Tensor-parallel layers (Shoeybi et al. 2019, Megatron-LM), each cut from a dense module.

Every layer is built with ``from_dense(module, group, ...)``: it keeps this rank's slice of the
dense weights, so that a parallel run can be compared with ``parallel_lab.models`` on one process.
With ``p`` ranks in ``group``:

- ``ColumnParallelLinear``: ``Y = X A``, ``A = [A_1 .. A_p]`` split by output columns; rank i
  computes ``Y_i = X A_i``. Entry op f (or the sequence all-gather); optional gather of ``Y``.
- ``RowParallelLinear``: ``Y = X A``, ``A`` split by input rows, ``X = [X_1 .. X_p]``; rank i
  computes the partial sum ``X_i A_i``; exit op g (or the sequence reduce-scatter), then the bias.
- ``ParallelMLP``: column then row, GELU on the shard in between: one all-reduce forward (g), one
  backward (f) -- the paper's figure 3a.
- ``ParallelSelfAttention``: heads split across ranks (figure 3b): one fused column projection to
  this rank's q, k, v; attention on its own heads; a row output projection.
- ``VocabParallelEmbedding``: the vocabulary split by rows; ids outside this rank's rows give 0,
  then the ranks' rows are summed (g).
- ``vocab_parallel_cross_entropy``: the loss from vocabulary-split logits without gathering them.

``sequence_parallel=True`` (Korthikanti et al. 2022) keeps activations between layers split along
the sequence: entries all-gather, exits reduce-scatter. Parameters used on a sequence shard (the
row bias, LayerNorms, position embeddings) then get only part of their gradient on each rank; they
carry ``param.sequence_parallel = True`` and ``allreduce_sequence_parallel_grads`` sums them after
backward (Megatron does the same when it finalises gradients). A column-parallel layer keeps only its
``(B, T/p, in)`` shard of the input for the backward and all-gathers it again there (Korthikanti et
al. 2022, section 4.2.2; Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication``), so that
every activation between the split layers is stored ``1/p`` times: ``34/t`` in the paper's
``sbh(34/t + 5as/(ht))``, which ``parallel_lab.planning.memory_model`` counts. The price is one extra
all-gather per column-parallel layer in the backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parallel_lab import models
from parallel_lab.runtime import transport
from parallel_lab.tensor.mappings import (
    _all_gather,
    _reduce_scatter,
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)


def _shard(tensor, dim, group, what):
    """This rank's contiguous copy of ``tensor``'s chunk along ``dim`` (rank order)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    size = tensor.shape[dim]
    if size % world:
        raise ValueError(f"{what} {size} is not divisible by tp {world}")
    piece = tensor.detach().narrow(dim, rank * (size // world), size // world)
    return piece.clone(memory_format=torch.contiguous_format)


def _param(tensor, sequence_parallel=False):
    """A replicated parameter (a copy of ``tensor``), marked for the sequence-parallel grad sum."""
    p = nn.Parameter(tensor.detach().clone())
    p.sequence_parallel = sequence_parallel  # read by allreduce_sequence_parallel_grads
    return p


class _SequenceParallelColumnLinear(torch.autograd.Function):
    """``Y = all_gather(X_shard) · Wᵀ + b`` that saves only ``X_shard`` (this rank's ``(B, T/p, in)``).

    Forward: all-gather the input along the sequence, multiply. Backward: all-gather the input again
    (the extra all-gather of Korthikanti et al. 2022, section 4.2.2) for the weight gradient, and
    reduce-scatter the input gradient, each rank's partial ``dL/dX``, back to the sequence shards (SP's
    f backward). Keeping the gathered input instead would store it ``p`` times over.
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, group, dim):
        ctx.save_for_backward(x_shard, weight)
        ctx.group, ctx.dim, ctx.has_bias = group, dim, bias is not None
        return F.linear(_all_gather(x_shard, dim, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_shard, weight = ctx.saved_tensors
        x = _all_gather(x_shard, ctx.dim, ctx.group)  # the input again, (B, T, in)
        grad_input = _reduce_scatter(grad.matmul(weight), ctx.dim, ctx.group)  # (B, T/p, in), summed
        grad_weight = grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None


class ColumnParallelLinear(nn.Module):
    """``(..., in) -> (..., out/p)`` this rank's columns, or ``(..., out)`` with ``gather_output``.

    With ``sequence_parallel`` the input is this rank's ``(B, T/p, in)`` and is all-gathered first;
    only the shard is kept for the backward, which gathers it again (``_SequenceParallelColumnLinear``).
    ``weight``: ``(out/p, in)``, ``bias``: ``(out/p,)``.
    """

    def __init__(self, weight, bias, group=None, gather_output=False, sequence_parallel=False):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel

    @classmethod
    def from_dense(cls, linear: nn.Linear, group=None, *, gather_output=False, sequence_parallel=False):
        what = "out_features"
        bias = None if linear.bias is None else _shard(linear.bias, 0, group, what)
        return cls(_shard(linear.weight, 0, group, what), bias, group, gather_output, sequence_parallel)

    def forward(self, x):
        if self.sequence_parallel:  # (B, T/p, in) -> all-gathered (B, T, in), times W: (B, T, out/p)
            y = _SequenceParallelColumnLinear.apply(x, self.weight, self.bias, self.group, 1)
        else:
            x = copy_to_tensor_parallel_region(x, self.group)  # f
            y = F.linear(x, self.weight, self.bias)  # (..., out/p)
        return gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``(..., in/p)`` this rank's slice (or ``(..., in)`` unless ``input_is_parallel``) -> ``(..., out)``.

    With ``sequence_parallel`` the output is this rank's ``(B, T/p, out)`` (reduce-scatter instead of
    all-reduce). ``weight``: ``(out, in/p)``; ``bias``: ``(out,)``, replicated and added once, after
    the sum.
    """

    def __init__(self, weight, bias, group=None, input_is_parallel=True, sequence_parallel=False):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else _param(bias, sequence_parallel)
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel

    @classmethod
    def from_dense(cls, linear: nn.Linear, group=None, *, input_is_parallel=True, sequence_parallel=False):
        weight = _shard(linear.weight, 1, group, "in_features")
        return cls(weight, linear.bias, group, input_is_parallel, sequence_parallel)

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.group)  # (..., in) -> (..., in/p)
        y = F.linear(x, self.weight)  # (..., out): this rank's partial sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.group)  # (B, T/p, out)
        else:
            y = reduce_from_tensor_parallel_region(y, self.group)  # g
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    """``models.MLP`` split column then row: ``(..., H) -> (..., 4H/p) -> (..., H)``."""

    def __init__(self, fc1: ColumnParallelLinear, act: nn.Module, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.act, self.fc2 = fc1, act, fc2  # the dense names, for comparison

    @classmethod
    def from_dense(cls, mlp: models.MLP, group=None, *, sequence_parallel=False):
        fc1 = ColumnParallelLinear.from_dense(mlp.fc1, group, sequence_parallel=sequence_parallel)
        fc2 = RowParallelLinear.from_dense(mlp.fc2, group, sequence_parallel=sequence_parallel)
        return cls(fc1, mlp.act, fc2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ParallelSelfAttention(nn.Module):
    """``models.CausalSelfAttention`` with its heads split: ``(B, T, H) -> (B, T, H)``.

    Rank i holds heads ``[i*n/p, (i+1)*n/p)``: one column projection ``(B, T, H) -> (B, T, 3H/p)``
    (q, k and v fused, so one f for all three), attention on those heads, a row output projection.
    """

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, head_dim: int):
        super().__init__()
        self.qkv, self.proj, self.head_dim = qkv, proj, head_dim

    @classmethod
    def from_dense(cls, attn: models.CausalSelfAttention, group=None, *, sequence_parallel=False):
        heads, world = attn.q.out_features // attn.head_dim, dist.get_world_size(group)
        if heads % world:
            raise ValueError(f"heads {heads} is not divisible by tp {world}")
        # A head is a contiguous block of head_dim output rows, so this rank's heads are its chunk.
        what = "hidden"
        weight = torch.cat([_shard(m.weight, 0, group, what) for m in (attn.q, attn.k, attn.v)])
        bias = torch.cat([_shard(m.bias, 0, group, what) for m in (attn.q, attn.k, attn.v)])
        qkv = ColumnParallelLinear(weight, bias, group, sequence_parallel=sequence_parallel)
        proj = RowParallelLinear.from_dense(attn.proj, group, sequence_parallel=sequence_parallel)
        return cls(qkv, proj, attn.head_dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, H/p)
        return self.proj(models.causal_attention(q, k, v, self.head_dim))  # (B, T, H/p) -> (B, T|T/p, H)


class VocabParallelEmbedding(nn.Module):
    """``(B, T)`` ids -> ``(B, T, H)`` (or this rank's ``(B, T/p, H)`` with sequence parallelism).

    ``weight``: rows ``[start, start + V/p)`` of the dense ``(V, H)`` table.
    """

    def __init__(self, weight, start: int, group=None, sequence_parallel=False):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.start, self.end = start, start + weight.shape[0]
        self.group, self.sequence_parallel = group, sequence_parallel

    @classmethod
    def from_dense(cls, embedding: nn.Embedding, group=None, *, sequence_parallel=False):
        weight = _shard(embedding.weight, 0, group, "vocab")
        return cls(weight, dist.get_rank(group) * weight.shape[0], group, sequence_parallel)

    def forward(self, ids):  # (B, T)
        outside = (ids < self.start) | (ids >= self.end)  # another rank holds these rows
        local = (ids - self.start).masked_fill_(outside, 0)
        x = F.embedding(local, self.weight).masked_fill_(outside.unsqueeze(-1), 0.0)  # (B, T, H)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(x, self.group)  # (B, T/p, H)
        return reduce_from_tensor_parallel_region(x, self.group)  # g: each id found on one rank


class ParallelEmbeddings(nn.Module):
    """``models.Embeddings`` with a vocabulary-parallel token table: ``(B, T)`` -> ``(B, T|T/p, H)``.

    With sequence parallelism each rank adds the position embeddings of its own positions only.
    """

    def __init__(self, tok: VocabParallelEmbedding, pos: nn.Embedding, drop: nn.Module, group=None,
                 sequence_parallel=False):
        super().__init__()
        self.tok, self.pos, self.drop = tok, pos, drop
        self.group, self.sequence_parallel = group, sequence_parallel
        pos.weight.sequence_parallel = sequence_parallel

    @classmethod
    def from_dense(cls, embed: models.Embeddings, group=None, *, sequence_parallel=False):
        tok = VocabParallelEmbedding.from_dense(embed.tok, group, sequence_parallel=sequence_parallel)
        pos = nn.Embedding.from_pretrained(embed.pos.weight.detach().clone(), freeze=False)
        return cls(tok, pos, embed.drop, group, sequence_parallel)

    def forward(self, idx):  # (B, T)
        x = self.tok(idx)  # (B, T, H), or (B, T/p, H) with sequence parallelism
        first = dist.get_rank(self.group) * x.shape[1] if self.sequence_parallel else 0
        positions = torch.arange(first, first + x.shape[1], device=idx.device)
        return self.drop(x + self.pos(positions))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's cross-entropy over vocabulary-split logits: three all-reduces of ``(B, T)``."""

    @staticmethod
    def forward(ctx, logits, targets, group):  # (B, T, V/p), (B, T)
        start = dist.get_rank(group) * logits.shape[-1]
        # 1. the global max, for a stable softmax (it cancels out, so no gradient flows through it)
        logits_max = logits.amax(dim=-1)  # (B, T)
        transport.all_reduce(logits_max, group, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)  # (B, T, V/p)
        # 2. the target's logit: held by exactly one rank, the others contribute 0
        outside = (targets < start) | (targets >= start + logits.shape[-1])
        local = (targets - start).masked_fill_(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill_(outside, 0.0)
        transport.all_reduce(target_logit, group)
        # 3. the softmax denominator
        exp = shifted.exp_()  # (B, T, V/p), reusing shifted's memory
        sum_exp = exp.sum(dim=-1)  # (B, T)
        transport.all_reduce(sum_exp, group)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)  # the softmax
        return sum_exp.log_() - target_logit  # (B, T): -log softmax[target]

    @staticmethod
    def backward(ctx, grad):  # (B, T)
        softmax, local, outside = ctx.saved_tensors
        # d loss / d logits = softmax - onehot(target); the onehot lives on the target's rank only
        grad_logits = softmax * grad.unsqueeze(-1)  # a new tensor: softmax stays intact
        hit = (~outside).to(grad.dtype) * grad
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad_logits, None, None


def vocab_parallel_cross_entropy(logits, targets, group=None):
    """Per-token loss ``(B, T)`` from this rank's ``(B, T, V/p)`` logits and the global ``(B, T)``
    targets, never gathering the ``(B, T, V)`` logits (Megatron-LM section 3, output embedding)."""
    return _VocabParallelCrossEntropy.apply(logits, targets, group)


def allreduce_sequence_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum over ranks the gradients of parameters marked ``sequence_parallel`` (one all-reduce).

    Call after backward with sequence parallelism: each rank saw a part of the sequence, so its
    gradient of a replicated parameter used on that part is a partial sum.
    """
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])  # one collective for all of them
    transport.all_reduce(flat, group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
