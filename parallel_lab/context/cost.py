"""What context parallelism costs one rank per training step, in bytes and α–β seconds (pure).

    from parallel_lab import hardware
    from parallel_lab.context.cost import context_cost
    c = context_cost("ring", batch=1, seq=131072, hidden=8192, heads=64, cp=8,
                     link=hardware.LINKS["nvlink4"], dtype_bytes=2)
    c.bytes_sent, c.comm_s, c.score_peak_bytes

For the planner (``planning/``, a layer above) and the lessons; ``run.run_context`` holds the byte
counts equal to what commlog records on real ranks. Sizes, with ``t = seq / cp`` positions per rank
and ``block = batch · t · hidden · dtype_bytes`` (one of K or V of one rank):

- **ring**: forward ``cp - 1`` messages of ``2·block`` (K and V) to the next rank; backward
  ``cp - 1`` of K/V and ``cp`` of their gradients (none on one rank). Each message one hop:
  ``α + n·β`` (β the inverse bandwidth, seconds per byte, as in lesson 01). The transfer of a
  step overlaps the step's block of compute, so with ``flops`` given, the exposed time is
  ``Σ max(0, message - block compute)``.
- **Ulysses**: forward two all-to-alls, of ``3·block`` (q, k, v) and ``block`` (the output);
  backward the same two. An all-to-all of a rank's ``n`` bytes sends ``(cp-1)/cp · n`` in
  ``cp - 1`` messages: ``(cp-1)·α + (cp-1)/cp · n·β`` (pairwise exchange). Nothing overlaps it.
- **scores**: the largest score tensor a rank holds at once (``score_peak_bytes``): ring
  ``B·n·t²`` (one block), Ulysses ``B·(n/cp)·seq²`` (all scores of its heads); and the scores a
  forward makes in all (``score_forward_bytes``): ``B·n·seq²/cp`` for both without a mask, ring
  causal ``(cp+1)/(2cp)`` of that (the zig-zag steps skip the masked halves), while Ulysses makes
  every masked score too. One process: ``B·n·seq²``.

With ``flops``, the attention's FLOPs per rank are counted on the same blocks: forward
``4·B·n·rows·cols·head_dim`` a block (QK^T and PV), backward 2.5 times that (FlashAttention-2
recomputes the scores).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from parallel_lab.checks import positive_int, positive_number
from parallel_lab.hardware import Link

VARIANTS = ("ring", "ulysses")
BACKWARD_FLOPS = 2.5  # FlashAttention-2's backward: 5 matmuls of a block against the forward's 2


@dataclass(frozen=True)
class ContextCost:
    """One rank's communication and attention-score memory for one step (forward + backward)."""

    variant: str
    cp: int
    causal: bool
    messages_forward: int
    messages_backward: int
    bytes_forward: int  # sent by one rank
    bytes_backward: int
    comm_forward_s: float
    comm_backward_s: float
    score_peak_bytes: int
    score_forward_bytes: int
    compute_s: float | None = None  # attention only, when flops is given
    exposed_comm_s: float | None = None  # the communication compute does not hide

    @property
    def bytes_sent(self) -> int:
        return self.bytes_forward + self.bytes_backward

    @property
    def messages(self) -> int:
        return self.messages_forward + self.messages_backward

    @property
    def comm_s(self) -> float:
        return self.comm_forward_s + self.comm_backward_s

    def as_dict(self) -> dict:
        return {**asdict(self), "bytes_sent": self.bytes_sent, "messages": self.messages, "comm_s": self.comm_s}


def _ring_blocks(cp: int, t: int, causal: bool) -> list[tuple[int, int]]:
    """``(rows, cols)`` of the score block a rank computes at each ring step (``blockwise.step_block``)."""
    if not causal:
        return [(t, t)] * cp
    return [(t, t)] + [(t, t // 2)] * (cp - 1)


def _ring_exposed(cp: int, hop: float, forward_s: list[float]) -> float:
    """Seconds of ring communication compute does not hide, as ``ring.py`` orders it: forward step
    i's K/V hop (i < cp-1) runs during step i's block; backward step i's K/V hop and the gradient
    hop posted at step i-1 run during step i's block, and the last gradient hop after all of it."""
    if cp == 1:
        return 0.0
    exposed = sum(max(0.0, hop - f) for f in forward_s[:-1])
    for i, f in enumerate(forward_s):
        hops = (i < cp - 1) + (i > 0)
        exposed += max(0.0, hops * hop - f * BACKWARD_FLOPS)
    return exposed + hop


def context_cost(variant: str, *, batch: int, seq: int, hidden: int, heads: int, cp: int, link: Link,
                 dtype_bytes: int = 2, causal: bool = True, flops: float | None = None) -> ContextCost:
    """The cost of ``variant`` ("ring" or "ulysses") for one rank of ``cp``; ``flops``: achieved
    FLOP/s of a device, to add the attention's compute time and the communication left exposed."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    for name, value in (("batch", batch), ("seq", seq), ("hidden", hidden), ("heads", heads), ("cp", cp),
                        ("dtype_bytes", dtype_bytes)):
        positive_int(name, value)
    t = seq // cp
    block = batch * t * hidden * dtype_bytes
    head_dim = hidden // heads

    def block_flops(rows, cols, n):  # QK^T and PV of one block over n heads
        return 4 * batch * n * rows * cols * head_dim

    if variant == "ring":
        blocks = _ring_blocks(cp, t, causal)
        grad_messages = cp if cp > 1 else 0
        fwd_messages, bwd_messages = cp - 1, cp - 1 + grad_messages
        fwd_bytes, bwd_bytes = fwd_messages * 2 * block, bwd_messages * 2 * block
        fwd_s, bwd_s = fwd_messages * link.cost(2 * block), bwd_messages * link.cost(2 * block)
        peak = batch * heads * t * t * dtype_bytes
        made = sum(batch * heads * r * c * dtype_bytes for r, c in blocks)
        step_flops = [block_flops(r, c, heads) for r, c in blocks]
    else:
        def a2a_bytes(n):
            return (cp - 1) * n // cp

        def a2a_s(n):
            return 0.0 if cp == 1 else (cp - 1) * link.latency + a2a_bytes(n) / link.bandwidth

        fwd_messages = bwd_messages = 2 * (cp - 1)
        fwd_bytes = bwd_bytes = a2a_bytes(3 * block) + a2a_bytes(block)
        fwd_s = bwd_s = a2a_s(3 * block) + a2a_s(block)
        peak = made = batch * (heads // cp) * seq * seq * dtype_bytes
        step_flops = [block_flops(seq, seq, heads // cp)]
    compute = exposed = None
    if flops is not None:
        positive_number("flops", flops)
        compute = sum(step_flops) * (1 + BACKWARD_FLOPS) / flops
        if variant == "ring":
            exposed = _ring_exposed(cp, link.cost(2 * block), [f / flops for f in step_flops])
        else:
            exposed = fwd_s + bwd_s
    return ContextCost(variant, cp, causal, fwd_messages, bwd_messages, fwd_bytes, bwd_bytes, fwd_s, bwd_s,
                       peak, made, compute, exposed)
