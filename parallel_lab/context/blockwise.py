"""Attention one block at a time: the pure pieces ring attention is made of (no torch.distributed).

    out_a, lse_a = attend(q, k[..., :8, :], v[..., :8, :], causal=False, scale=s)
    out_b, lse_b = attend(q, k[..., 8:, :], v[..., 8:, :], causal=False, scale=s)
    out, lse = merge(out_a, lse_a, out_b, lse_b)     # == attention of q over all 16 keys

Shapes: ``(B, n, t, d)`` (batch, heads, positions, head width), SDPA's layout; ``lse`` is
``(B, n, t)``, the log-sum-exp of each query's scores over the keys seen so far.

- ``attend``: softmax attention of a query block over one key/value block, returning the output
  *and* its log-sum-exp, so that blocks can be combined later.
- ``merge``: the online-softmax combination of two partial results (Milakov & Gimelshein 2018,
  "Online normalizer calculation for softmax"; the rescaling FlashAttention does between key blocks,
  Dao et al. 2022): ``lse = log(e^lse_a + e^lse_b)``, ``out = e^(lse_a-lse) out_a + e^(lse_b-lse) out_b``.
  Exact, associative and commutative: any order of blocks gives the full softmax.
- ``attend_backward``: FlashAttention-2's backward for one block (Dao 2023): with the *final* lse
  and ``delta = rowsum(dO * O)``, the probabilities are recomputed from the scores, so no score
  matrix is kept between forward and backward.
- Zig-zag load balancing for causal masks (``zigzag_*``, ``step_block``): the sequence in 2·cp
  chunks, rank i holding chunks i and 2·cp-1-i (Megatron-LM's context parallelism; "zig-zag" ring
  attention), so that every rank does the same work under the causal mask.
- ``measuring``: what the lessons call "memory of the scores", measured: every score block
  ``attend`` and ``attend_backward`` materialise is seen by the meters open on this process.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------------------------
# Measuring the score blocks.


@dataclass
class ScoreMeter:
    """The score tensors ``(B, n, rows, cols)`` materialised inside a ``measuring()`` block:
    ``peak_bytes`` (the largest one; blocks are made one at a time), ``total_bytes`` and ``blocks``."""

    peak_bytes: int = 0
    total_bytes: int = 0
    blocks: int = 0

    def see(self, scores: torch.Tensor) -> None:
        nbytes = scores.numel() * scores.element_size()
        self.peak_bytes = max(self.peak_bytes, nbytes)
        self.total_bytes += nbytes
        self.blocks += 1

    def as_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "total_bytes": self.total_bytes, "blocks": self.blocks}


_meters: list[ScoreMeter] = []


@contextmanager
def measuring():
    """``with measuring() as meter:`` every score block made inside is counted (autograd's backward
    on CPU tensors runs in the calling thread, so a backward inside the block counts too)."""
    meter = ScoreMeter()
    _meters.append(meter)
    try:
        yield meter
    finally:
        _meters.remove(meter)


def _scores(q, k, causal: bool, scale: float):
    """``(B, n, tq, d) x (B, n, tk, d) -> (B, n, tq, tk)`` scaled scores; ``causal``: the block is on
    the diagonal (query i sees keys 0..i of it; ``tq == tk``), the rest set to -inf."""
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, n, tq, tk)
    for meter in _meters:
        meter.see(scores)
    if causal:
        tq, tk = scores.shape[-2:]
        if tq != tk:
            raise ValueError(f"a causal (diagonal) block must be square, got {tq} queries x {tk} keys")
        above = torch.ones(tq, tk, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return scores


# ----------------------------------------------------------------------------------------------
# One block forward, the merge, one block backward.


def attend(q, k, v, causal: bool, scale: float):
    """Attention of ``q`` ``(B, n, tq, d)`` over one block ``k``, ``v`` ``(B, n, tk, d)``.

    Returns ``(out, lse)``: ``out`` ``(B, n, tq, d)`` normalised over this block only, ``lse``
    ``(B, n, tq)`` the log-sum-exp of the block's scores. Differentiable (Ulysses runs it under
    autograd; the ring calls it inside its own autograd.Function, under no_grad).
    """
    scores = _scores(q, k, causal, scale)  # (B, n, tq, tk)
    lse = torch.logsumexp(scores, dim=-1)  # (B, n, tq)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def merge(out_a, lse_a, out_b, lse_b):
    """Combine two partial results over disjoint key blocks into one: ``(out, lse)``.

    ``out_*`` ``(..., t, d)``, ``lse_*`` ``(..., t)``. The weights ``e^(lse_x - lse)`` are the shares
    of the two blocks in the combined softmax denominator; computing them from the log-sum-exps keeps
    every exponent <= 0 (no overflow, the same trick as a stable softmax).
    """
    lse = torch.logaddexp(lse_a, lse_b)  # (..., t)
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse


def attend_backward(q, k, v, grad_out, lse, delta, causal: bool, scale: float):
    """Gradients of one block's share of the attention: ``(dq, dk, dv)`` for ``q`` ``(B, n, tq, d)``
    and the block ``k``, ``v`` ``(B, n, tk, d)``.

    ``grad_out`` ``(B, n, tq, d)`` is the gradient of the *final* output, ``lse`` ``(B, n, tq)`` the
    *final* log-sum-exp and ``delta = (grad_out * out).sum(-1)`` ``(B, n, tq)``, so that
    ``P = exp(S - lse)`` is this block's part of the full softmax and
    ``dS = P * (dP - delta)`` (the softmax Jacobian, FlashAttention-2, Dao 2023).
    """
    p = torch.exp(_scores(q, k, causal, scale) - lse.unsqueeze(-1))  # (B, n, tq, tk); masked -> 0
    dv = p.transpose(-2, -1) @ grad_out  # (B, n, tk, d)
    dp = grad_out @ v.transpose(-2, -1)  # (B, n, tq, tk)
    ds = p * (dp - delta.unsqueeze(-1)) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, dv


# ----------------------------------------------------------------------------------------------
# The zig-zag split (load balancing under the causal mask).


def zigzag_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks rank ``rank`` holds: ``(rank, 2·cp - 1 - rank)``."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank must be in 0..{cp - 1} for cp {cp}, got rank {rank}")
    return rank, 2 * cp - 1 - rank


def zigzag_positions(seq: int, cp: int, rank: int) -> list[int]:
    """The global positions of rank ``rank``'s ``seq / cp`` tokens, in its local order (ascending)."""
    c = seq // (2 * cp)
    first, second = zigzag_chunks(rank, cp)
    return [*range(first * c, (first + 1) * c), *range(second * c, (second + 1) * c)]


def zigzag_shard(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s part of ``x``: chunks ``rank`` and ``2·cp-1-rank`` of 2·cp along ``dim``."""
    chunks = x.chunk(2 * cp, dim=dim)
    first, second = zigzag_chunks(rank, cp)
    return torch.cat((chunks[first], chunks[second]), dim=dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole tensor from every rank's ``zigzag_shard`` (in rank order)."""
    cp = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]  # rank r: (chunk r, chunk 2cp-1-r)
    ordered = [halves[i][0] for i in range(cp)] + [halves[cp - 1 - i][1] for i in range(cp)]
    return torch.cat(ordered, dim=dim)


@dataclass(frozen=True)
class Block:
    """What a rank computes at one ring step: its query ``rows`` against the visiting block's key
    ``cols`` (slices of the local length); ``diagonal``: causal inside (its own block), else the part
    taken is fully visible."""

    rows: slice
    cols: slice
    diagonal: bool


def step_block(rank: int, source: int, cp: int, local: int, causal: bool) -> Block:
    """Rank ``rank`` holding the keys of rank ``source`` (zig-zag layout, ``local = seq / cp``).

    Causal, with chunks ``c = local / 2``: its own block is the diagonal (lower-triangular, since
    its positions ascend). A block from an earlier rank (``source < rank``): both query chunks see
    its first chunk (``source`` < ``rank``) and neither sees its second (``2cp-1-source`` is after
    both). A later rank's block: only the second query chunk (``2cp-1-rank``) sees it, all of it.
    Either way ``local x local/2`` scores, half the diagonal's ``local x local``: every rank does
    the same work. Not causal: everything.
    """
    full, first, second = slice(0, local), slice(0, local // 2), slice(local // 2, local)
    if not causal:
        return Block(full, full, False)
    if source == rank:
        return Block(full, full, True)
    if source < rank:
        return Block(full, first, False)
    return Block(second, full, False)
