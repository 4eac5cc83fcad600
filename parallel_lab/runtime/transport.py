"""All-reduce by the fastest way this group has: the one the package's layers call.

``all_reduce(tensor, group)`` is ``dist.all_reduce`` with the transport chosen per call:

- **shared memory** (``runtime.shared_channel``) when the group's ranks can share it (gloo, one x86-64
  Linux host) and the tensor is a CPU tensor of at most ``shared_memory.MAX_BYTES``;
- else **one shot** (``one_shot_all_reduce``) for a sum on gloo over more than 2 ranks, contiguous,
  of at most ``ONE_SHOT_MAX_BYTES``;
- else the backend's own (gloo's ring, or NCCL's choice by size).

Tensor parallelism's f and g (``tensor.mappings``), the vocabulary-parallel loss and layer norms
(``tensor.layers``) and 3D training's data-parallel buckets (``parallel3d.data_parallel``) all go
through it. ``commlog`` records each call as the one all_reduce it is, whatever carries it. Every
path leaves the same bits on every rank of the group (a replicated activation stays replicated).

Lesson 01's ring all-reduce, built from send/recv, is ``runtime.collectives.ring_all_reduce``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.runtime import commlog, shared_channel, shared_memory

# One shot, the latency-optimal all-reduce for small tensors. A ring needs 2(p-1) steps one after
# another, each a message's latency; for a small tensor the latency is the whole cost. One shot: every
# rank sends its whole tensor to every other rank at once and adds the p tensors itself -- one step,
# (p-1)·n bytes sent per rank instead of 2(p-1)/p·n. MPICH switches algorithms by message size for the
# same reason (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations
# in MPICH": recursive doubling for short messages, Rabenseifner's reduce-scatter + all-gather for
# long ones); TensorRT-LLM's ONESHOT all-reduce is this algorithm for tensor parallelism's small
# activations. gloo's ``all_reduce`` runs its ring at every size. Measured on 2 cores (``parallel-lab
# bench collectives``): with 4 ranks, 32-128 KB take about half the time one shot (6 steps become 1),
# 1 MB about the same; with 2 ranks the ring is only 2 steps, and one shot was faster in most runs but
# up to 1.4x slower in others, and the TP benchmark's small 2-rank rows with it, so 2 ranks keep
# gloo's. NCCL picks its own algorithm by size, so on NCCL the call is left to it. Where the ranks of
# a group can share memory (one x86 host: ``runtime.shared_channel``), the same one-shot sum goes
# through memory instead of messages, which is faster still (0.07-0.4 ms against gloo's 1-4 ms here).

ONE_SHOT_MAX_BYTES = 256 * 2**10  # gloo, more than 2 ranks, at most this many bytes: one shot


def one_shot_all_reduce(tensor: torch.Tensor, group=None, async_op: bool = False):
    """Sum a contiguous ``tensor`` over ``group`` in place in one step: send it to every other rank,
    receive theirs, add all p in group-rank order -- the same order on every rank, so every rank ends
    with bit-identical sums (a replicated activation stays replicated). Returns ``tensor``, or with
    ``async_op`` a handle whose ``wait()`` finishes the sum (the messages are in flight until then;
    ``tensor`` must not change before)."""
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    if not tensor.is_contiguous():
        raise ValueError(f"one_shot_all_reduce needs a contiguous tensor, got strides {tensor.stride()}")
    if p == 1:
        return _Pending(tensor) if async_op else tensor
    parts = [tensor if r == rank else torch.empty_like(tensor) for r in range(p)]
    requests = []
    for step in range(1, p):  # to r+step, from r-step: every rank sends and receives at once
        requests.append(dist.isend(tensor, dst=global_rank(group, (rank + step) % p), group=group))
        requests.append(dist.irecv(parts[(rank - step) % p], src=global_rank(group, (rank - step) % p), group=group))
    pending = _Pending(tensor, requests, parts)
    return pending if async_op else pending.wait()


class _Pending:
    """An all-reduce in flight: ``wait()`` waits for its requests, adds the one-shot parts into the
    tensor if there are any, and returns the tensor."""

    def __init__(self, tensor, requests=(), parts=None):
        self.tensor, self.requests, self.parts = tensor, requests, parts

    def wait(self):
        for request in self.requests:
            request.wait()
        if self.parts:
            total = self.parts[0] + self.parts[1]
            for part in self.parts[2:]:
                total += part
            self.tensor.copy_(total)
        return self.tensor


def uses_one_shot(tensor: torch.Tensor, group=None) -> bool:
    """Whether ``all_reduce`` sends ``tensor`` one shot: gloo, more than 2 ranks, contiguous, at most
    ``ONE_SHOT_MAX_BYTES`` (see above), and not through shared memory (``uses_shared_memory``)."""
    small = tensor.numel() * tensor.element_size() <= ONE_SHOT_MAX_BYTES
    return (small and tensor.is_contiguous() and dist.get_world_size(group) > 2
            and dist.get_backend(group) == "gloo" and not uses_shared_memory(tensor, group))


def uses_shared_memory(tensor: torch.Tensor, group=None) -> bool:
    """Whether ``all_reduce`` sums ``tensor`` through shared memory (``runtime.shared_channel``): a CPU
    tensor of at most ``shared_memory.MAX_BYTES`` on a group whose channel is open. Collective the
    first time for a group (its ranks agree whether they can share memory)."""
    small = tensor.numel() * tensor.element_size() <= shared_memory.MAX_BYTES
    return small and tensor.device.type == "cpu" and shared_channel.for_group(group) is not None


def all_reduce(tensor: torch.Tensor, group=None, async_op: bool = False, op=dist.ReduceOp.SUM):
    """``dist.all_reduce(tensor, op=op, group=group)`` (in place; a sum, or ``ReduceOp.MAX``),
    through shared memory where the ranks can (``uses_shared_memory``: one x86 host), else a sum
    one shot where that is faster (``uses_one_shot``), else gloo's or NCCL's own. Recorded by
    ``commlog`` as the one all_reduce it is. Returns ``tensor``, or with ``async_op`` a handle whose
    ``wait()`` returns it reduced (the shared-memory one is done before it returns)."""
    if dist.get_world_size(group) == 1:
        return _Pending(tensor) if async_op else tensor
    how = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max"}.get(op)
    if how is not None and uses_shared_memory(tensor, group):
        with commlog.speaking_for("all_reduce", tensor, group):
            shared_channel.for_group(group).all_reduce(tensor, how)
        return _Pending(tensor) if async_op else tensor
    if op == dist.ReduceOp.SUM and uses_one_shot(tensor, group):
        with commlog.speaking_for("all_reduce", tensor, group):
            return one_shot_all_reduce(tensor, group, async_op)
    work = dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return _Pending(tensor, [work]) if async_op else tensor


def global_rank(group, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (the same number for the world, ``None``)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
