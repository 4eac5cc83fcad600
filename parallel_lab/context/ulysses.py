"""DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-all from a sequence split to a head split and back.

    out = ulysses_attention(q, k, v, causal=True, group=None)  # (B, n, seq/cp, d) -> same

Each rank holds ``seq / cp`` consecutive positions of every head. One all-to-all (q, k and v
stacked into one buffer) gives every rank the *whole* sequence of ``n / cp`` heads; it runs full
attention on them (``blockwise.attend``: all ``seq x seq`` scores of its heads at once), and a
second all-to-all returns the output to the sequence split. The backward of an all-to-all is the
all-to-all the other way, so the backward pass makes the same two calls, reversed.

Per rank and pass: two ``all_to_all_single`` calls, of ``3 x`` and ``1 x`` its share of one of q, k,
v (``B x seq/cp x hidden`` elements); a rank keeps ``1/cp`` of each buffer and sends the rest.
Heads must divide by ``cp`` (``run.check_context_parallel`` says so before any process starts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.context.blockwise import attend


def _all_to_all(x, scatter_dim: int, gather_dim: int, group):
    """Chunk ``i`` of ``x`` along ``scatter_dim`` goes to rank ``i``; what rank ``j`` sent is placed
    ``j``-th along ``gather_dim``. One ``all_to_all_single`` (gloo supports it)."""
    cp = dist.get_world_size(group)
    if cp == 1:
        return x
    send = torch.stack(x.chunk(cp, dim=scatter_dim)).contiguous()  # (cp, ...): row i for rank i
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Forward: ``_all_to_all(x, scatter, gather)``; backward: the same with the dimensions swapped."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def ulysses_attention(q, k, v, causal: bool = True, group=None):
    """Attention of this rank's ``(B, n, seq/cp, d)`` queries (consecutive positions: rank r holds
    ``r·seq/cp .. (r+1)·seq/cp - 1``) over the whole sequence; returns ``(B, n, seq/cp, d)``."""
    qkv = torch.stack((q, k, v))  # (3, B, n, t, d)
    qkv = _AllToAll.apply(qkv, 2, 3, group)  # (3, B, n/cp, seq, d): heads split, whole sequence
    out, _ = attend(qkv[0], qkv[1], qkv[2], causal, q.shape[-1] ** -0.5)  # (B, n/cp, seq, d)
    return _AllToAll.apply(out, 2, 1, group)  # (B, n, t, d): back to the sequence split
