"""Lesson 01's exercise: ring all-reduce from send/recv, checked on real ranks
(lessons/01_ranks_and_collectives.ipynb).

    check_ring_all_reduce(my_ring_all_reduce)
    # ring all-reduce on 2 ranks: PASSED (5/5 cases)
    # ring all-reduce on 4 ranks: PASSED (5/5 cases)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import Verdict, check_on_ranks, short

RING_CASES = (1, 4, 5, 12, 1001)  # element counts: fewer than the ranks, divisible, not divisible


def ring_all_reduce_cases(student_fn, cases=RING_CASES):
    """On a rank: the student's ring all-reduce against ``dist.all_reduce`` on integer-valued fp64
    tensors (so that any order of additions gives exactly the same sum)."""
    rank = dist.get_rank()
    results = []
    for numel in cases:
        x = torch.arange(numel, dtype=torch.float64) * (rank + 1) + rank
        expected = x.clone()
        dist.all_reduce(expected)
        out = student_fn(x)
        got = out if isinstance(out, torch.Tensor) else x
        ok = got.shape == expected.shape and torch.equal(got, expected)
        detail = "" if ok else f"got {short(got)}, expected {short(expected)}"
        results.append((f"tensor of {numel} element{'s' * (numel != 1)}", ok, detail))
        dist.barrier()  # keep ranks in step between cases, so a failure is pinned to its case
    return results


def check_ring_all_reduce(fn, world_sizes=(2, 4)) -> Verdict:
    """Lesson 01's exercise: ``fn(tensor)`` sums ``tensor`` over all ranks in place with a ring of
    send/recv; checked against ``dist.all_reduce`` on real ranks. Prints and returns the verdict."""
    verdict = check_on_ranks(fn, ring_all_reduce_cases, world_sizes, "ring all-reduce")
    print(verdict)
    return verdict
