"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers") on real ranks.

    out = ring_attention(q, k, v, causal=True, group=None)   # q, k, v: (B, n, seq/cp, d), zig-zag

Each rank keeps its query block; the key/value blocks travel around the ring (rank r sends to
r+1 and receives from r-1 with isend/irecv), one hop per step, and the rank merges each block's
partial result into its output with the log-sum-exp merge (``blockwise.merge``). The next block's
transfer is posted *before* the current block is computed, so communication overlaps compute.
Under a causal mask the sequence is laid out zig-zag (``blockwise.zigzag_shard``) and each step
computes only the visible part of its block (``blockwise.step_block``): every rank does the same work.

The backward pass is written out (``_RingAttention.backward``, as in FlashAttention-2 and the ring
implementations after it): the K/V blocks go around the ring a second time, and with each travels
the accumulator of its gradient (dK, dV), to which every rank adds its share; after ``cp`` steps
each accumulator is one hop from home and takes that hop. Nothing but q, k, v, the output and the
log-sum-exp is saved between forward and backward: no score matrix.

Messages per rank and pass (one message carries K and V of a block, stacked):
forward ``cp - 1`` K/V blocks; backward ``cp - 1`` K/V blocks and ``cp`` dK/dV blocks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.context.blockwise import attend, attend_backward, merge, step_block

KV_TAG, GRAD_TAG = 71, 72  # K/V blocks and their gradient accumulators travel side by side


class _Shift:
    """An asynchronous ring hop: ``tensor`` to rank r+1, the same shape from rank r-1; ``wait()``
    returns what arrived (and makes sure our own buffer has left)."""

    def __init__(self, tensor, group, tag):
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        group_of = group if group is not None else dist.group.WORLD
        nxt = dist.get_global_rank(group_of, (rank + 1) % cp)
        prv = dist.get_global_rank(group_of, (rank - 1) % cp)
        self.received = torch.empty_like(tensor)
        self.works = [dist.isend(tensor, nxt, group=group, tag=tag),
                      dist.irecv(self.received, prv, group=group, tag=tag)]

    def wait(self):
        for work in self.works:
            work.wait()
        return self.received


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group, merge_fn):
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        scale = q.shape[-1] ** -0.5
        kv = torch.stack((k, v)).contiguous()  # (2, B, n, t, d): one message per step
        out = lse = None
        for step in range(cp):
            shift = _Shift(kv, group, KV_TAG) if step < cp - 1 else None  # overlap with compute
            block = step_block(rank, (rank - step) % cp, cp, q.shape[-2], causal)
            o, l = attend(q[..., block.rows, :], kv[0][..., block.cols, :], kv[1][..., block.cols, :],
                          block.diagonal, scale)
            if out is None:  # step 0, the rank's own block: every query row sees it
                out, lse = o, l
            else:
                out[..., block.rows, :], lse[..., block.rows] = merge_fn(
                    out[..., block.rows, :], lse[..., block.rows], o, l)
            if shift is not None:
                kv = shift.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal = ctx.group, ctx.causal
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        scale = q.shape[-1] ** -0.5
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)  # (B, n, t): rowsum(dO * O)
        dq = torch.zeros_like(q)
        kv = torch.stack((k, v)).contiguous()
        grads = None  # the accumulator of dK, dV travelling with a block, once it left home
        for step in range(cp):
            shift = _Shift(kv, group, KV_TAG) if step < cp - 1 else None
            block = step_block(rank, (rank - step) % cp, cp, q.shape[-2], causal)
            rows = block.rows
            dq_b, dk_b, dv_b = attend_backward(q[..., rows, :], kv[0][..., block.cols, :],
                                               kv[1][..., block.cols, :], grad_out[..., rows, :],
                                               lse[..., rows], delta[..., rows], block.diagonal, scale)
            dq[..., rows, :] += dq_b
            dkv = grads.wait() if grads is not None else torch.zeros_like(kv)  # block (rank - step)'s
            dkv[0][..., block.cols, :] += dk_b
            dkv[1][..., block.cols, :] += dv_b
            # On one rank the block never leaves; else it goes on to r+1, which holds that block next.
            grads = _Shift(dkv, group, GRAD_TAG) if cp > 1 else None
            if shift is not None:
                kv = shift.wait()
        dkv = grads.wait() if grads is not None else dkv  # our own block's, home after cp hops
        return dq, dkv[0], dkv[1], None, None, None


def ring_attention(q, k, v, causal: bool = True, group=None, merge_fn=merge):
    """Attention of this rank's queries over the whole sequence, the K/V blocks passed around the
    ring of ``group``. ``q``, ``k``, ``v``: ``(B, n, seq/cp, d)``, this rank's zig-zag shard
    (``blockwise.zigzag_shard``); returns ``(B, n, seq/cp, d)``, differentiable in all three.
    ``merge_fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the log-sum-exp merge of each block
    into the running result (``blockwise.merge``; lesson 14's exercise plugs a student's in). The
    backward uses the merged log-sum-exp, so a wrong merge shows in the gradients too."""
    return _RingAttention.apply(q, k, v, causal, group, merge_fn)
