"""Lesson 01's collectives on real ranks: who holds what before and after, and ring all-reduce
from send/recv.

Lesson 01 (lessons/01_ranks_and_collectives.ipynb) runs these on simulated GPUs: ``holdings`` shows
each of the six collectives on small integer tensors (all-to-all too, which lessons 13 and 14 use),
and ``ring_all_reduce`` is the reference solution of its exercise. Everything here that runs on a
rank reads its rank from ``torch.distributed`` and takes the group explicitly. The all-reduce the
package's layers call is ``runtime.transport.all_reduce`` (shared memory, one shot, or the backend's
own).

A ring all-reduce over p ranks sends 2(p−1) messages of n/p bytes per rank (Patarasuk & Yuan 2009,
the algorithm behind NCCL's and gloo's large all-reduces); its α–β cost is
``parallel_lab.hardware.ring_all_reduce_time``, its timing on this machine
``parallel_lab.planning.calibration.time_all_reduce``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.runtime.transport import global_rank

COLLECTIVES = ("send/recv", "broadcast", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")


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
    if name == "all_to_all":  # rank r sends its slot j to rank j: who holds what is transposed
        before, out = mine.clone(), torch.empty(p)
        dist.all_to_all_single(out, mine)
        return {"before": before.tolist(), "after": out.tolist()}
    raise ValueError(f"unknown collective {name!r}; choose one of {COLLECTIVES}")


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
    right, left = global_rank(group, (rank + 1) % p), global_rank(group, (rank - 1) % p)
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
