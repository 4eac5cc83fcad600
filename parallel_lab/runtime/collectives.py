"""Collectives on real ranks: who holds what before and after, and ring all-reduce from send/recv.

Lesson 01 (lessons/01_ranks_and_collectives.ipynb) runs these on simulated GPUs. Everything here
that runs on a rank reads its rank from ``torch.distributed`` and takes the group explicitly.

A ring all-reduce over p ranks sends 2(p−1) messages of n/p bytes per rank (Patarasuk & Yuan 2009,
the algorithm behind NCCL's and gloo's large all-reduces); its α–β cost is
``parallel_lab.hardware.ring_all_reduce_time``, its timing on this machine
``parallel_lab.planning.calibration.time_all_reduce``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.runtime import commlog, shared_memory

COLLECTIVES = ("send/recv", "broadcast", "all_reduce", "all_gather", "reduce_scatter")


# ----------------------------------------------------------------------------------------------
# Who holds what: each collective on p ranks with small integer tensors (exact, easy to read).


def holdings(name: str) -> dict:
    """Run collective ``name`` on this rank; return ``{"before": [...], "after": [...]}`` (lists of
    numbers, ``None`` where the rank holds nothing). Rank r starts with ``10·r + j`` in slot j."""
    rank, p = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([10.0 * rank + j for j in range(p)])
    if name == "send/recv":  # rank 0 sends its tensor to rank 1; rank 1's buffer is overwritten
        before = mine.clone()
        if rank == 0:
            dist.send(mine, dst=1)
        elif rank == 1:
            dist.recv(mine, src=0)
        return {"before": before.tolist(), "after": mine.tolist()}
    if name == "broadcast":  # rank 0's tensor is copied to everyone
        before = mine.clone()
        dist.broadcast(mine, src=0)
        return {"before": before.tolist(), "after": mine.tolist()}
    if name == "all_reduce":  # everyone ends with the element-wise sum
        before = mine.clone()
        dist.all_reduce(mine)
        return {"before": before.tolist(), "after": mine.tolist()}
    if name == "all_gather":  # rank r holds one chunk (slot r); everyone ends with all chunks
        chunk = mine[rank:rank + 1].clone()
        out = torch.empty(p)
        dist.all_gather_single(out, chunk)
        return {"before": [chunk.item() if j == rank else None for j in range(p)], "after": out.tolist()}
    if name == "reduce_scatter":  # the sum, but rank r keeps only chunk r
        out = torch.empty(1)
        dist.reduce_scatter_single(out, mine)
        return {"before": mine.tolist(), "after": [out.item() if j == rank else None for j in range(p)]}
    raise ValueError(f"unknown collective {name!r}; choose one of {COLLECTIVES}")


def check_collective(name: str) -> None:
    """Raise before launch for a collective name that does not exist."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; choose one of {', '.join(COLLECTIVES)}")


# ----------------------------------------------------------------------------------------------
# Ring all-reduce from send/recv: the reference solution of lesson 01's exercise.


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group`` in place with a ring: p−1 reduce-scatter steps,
    then p−1 all-gather steps, each rank sending one chunk to its right neighbour per step.

    Every rank sends 2(p−1)/p of the tensor in total, independent of p — why rings scale.
    """
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    if p == 1:
        return tensor
    flat = tensor.view(-1)
    chunks = list(flat.tensor_split(p))  # views: writing a chunk writes the tensor
    right, left = _global(group, (rank + 1) % p), _global(group, (rank - 1) % p)
    incoming = torch.empty_like(chunks[0]) if chunks[0].numel() else torch.empty(0, dtype=flat.dtype)
    for step in range(2 * (p - 1)):
        # Reduce-scatter step s: send chunk (rank - s), add the incoming chunk (rank - s - 1); after
        # p-1 steps rank r owns the full sum of chunk r+1. All-gather step s: pass owned chunks on.
        reduce_phase = step < p - 1
        send_index = (rank - step) % p if reduce_phase else (rank + 1 - (step - p + 1)) % p
        recv_index = (send_index - 1) % p
        buffer = incoming[: chunks[recv_index].numel()]
        request = dist.isend(chunks[send_index].contiguous(), dst=right, group=group)
        dist.recv(buffer, src=left, group=group)
        request.wait()
        if reduce_phase:
            chunks[recv_index] += buffer
        else:
            chunks[recv_index].copy_(buffer)
    return tensor


# ----------------------------------------------------------------------------------------------
# One-shot all-reduce: the latency-optimal algorithm for small tensors.
#
# A ring needs 2(p-1) steps one after another, each a message's latency; for a small tensor the
# latency is the whole cost. One shot: every rank sends its whole tensor to every other rank at once
# and adds the p tensors itself -- one step, (p-1)·n bytes sent per rank instead of 2(p-1)/p·n.
# MPICH switches algorithms by message size for the same reason (Thakur, Rabenseifner & Gropp 2005,
# "Optimization of Collective Communication Operations in MPICH": recursive doubling for short
# messages, Rabenseifner's reduce-scatter + all-gather for long ones); TensorRT-LLM's ONESHOT
# all-reduce is this algorithm for tensor parallelism's small activations. gloo's ``all_reduce``
# runs its ring at every size. Measured on 2 cores (``parallel-lab bench collectives``): with 4
# ranks, 32-128 KB take about half the time one shot (6 steps become 1), 1 MB about the same; with
# 2 ranks the ring is only 2 steps, and one shot was faster in most runs but up to 1.4x slower in
# others, and the TP benchmark's small 2-rank rows with it, so 2 ranks keep gloo's. NCCL picks its
# own algorithm by size, so on NCCL the call is left to it. Where the ranks of a group can share
# memory (one x86 host: ``runtime.shared_memory``), the same one-shot sum goes through memory
# instead of messages, which is faster still (0.07-0.4 ms against gloo's 1-4 ms here).

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
        requests.append(dist.isend(tensor, dst=_global(group, (rank + step) % p), group=group))
        requests.append(dist.irecv(parts[(rank - step) % p], src=_global(group, (rank - step) % p), group=group))
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
    """Whether ``all_reduce`` sums ``tensor`` through shared memory (``runtime.shared_memory``): a CPU
    tensor of at most ``shared_memory.MAX_BYTES`` on a group whose channel is open. Collective the
    first time for a group (its ranks agree whether they can share memory)."""
    small = tensor.numel() * tensor.element_size() <= shared_memory.MAX_BYTES
    return small and tensor.device.type == "cpu" and shared_memory.channel(group) is not None


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
            shared_memory.channel(group).all_reduce(tensor, how)
        return _Pending(tensor) if async_op else tensor
    if op == dist.ReduceOp.SUM and uses_one_shot(tensor, group):
        with commlog.speaking_for("all_reduce", tensor, group):
            return one_shot_all_reduce(tensor, group, async_op)
    work = dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return _Pending(tensor, [work]) if async_op else tensor


def _global(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
