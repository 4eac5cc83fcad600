"""Lesson 02's first exercise: the row-parallel forward ``Y = X·W + bias`` from this rank's slices,
checked on real ranks against the dense product (lessons/02_tensor_parallelism.ipynb).

The student's code takes an explicit ``group``; on 4 ranks the check also runs it in two groups of
2 with different data, which catches a collective that ignores ``group`` (it would sum over all 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import Verdict, check_on_ranks, row_problem, short, tp_groups

ROW_SHAPES = (((3,), 8, 5), ((2, 4), 8, 6))  # (leading dims of x, in features, out features)


def row_parallel_forward_cases(student_fn):
    """On a rank: ``student_fn(x_shard, w_shard, bias, group)`` against the dense ``X·W + bias``,
    with ``X`` split along its last dimension and ``W`` along its rows, for each group and shape."""
    results = []
    for where, group, tp, index in tp_groups():
        r = dist.get_rank(group)
        for leading, n_in, n_out in ROW_SHAPES:
            x, w, bias = row_problem(leading, n_in, n_out, seed=100 * index + n_out)
            k = n_in // tp
            x_shard, w_shard = x[..., r * k:(r + 1) * k], w[r * k:(r + 1) * k]
            expected = x @ w + bias
            got = student_fn(x_shard.clone(), w_shard.clone(), bias.clone(), group)
            ok = isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected)
            detail = "" if ok else _row_hint(got, expected, x_shard @ w_shard, bias, tp, where)
            results.append((f"x {tuple(x.shape)}, W {tuple(w.shape)}, {where}", ok, detail))
            dist.barrier()  # keep ranks in step between cases, so a failure is pinned to its case
    return results


def _row_hint(got, expected, partial, bias, tp, where) -> str:
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a tensor of shape {tuple(expected.shape)}"
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if torch.equal(got, partial + bias) or torch.equal(got, partial):
        return "this is the rank's own partial product: sum it over the group with dist.all_reduce"
    if torch.equal(got, expected + (tp - 1) * bias):
        return f"the bias was added {tp} times (once per rank before the sum): add it once, after the all-reduce"
    if torch.equal(got, expected - bias):
        return "the bias is missing"
    if "groups" in where:
        return (f"got {short(got)}, expected {short(expected)}: pass group=group to the collective, "
                f"or it sums over every rank")
    return f"got {short(got)}, expected {short(expected)}"


def check_row_parallel_forward(fn, world_sizes=(2, 4)) -> Verdict:
    """Lesson 02's first exercise: ``fn(x_shard, w_shard, bias, group)`` computes the row-parallel
    ``Y = X·W + bias`` from this rank's column slice of ``X`` and row slice of ``W``; checked against
    the dense product on real ranks. Prints and returns the verdict."""
    verdict = check_on_ranks(fn, row_parallel_forward_cases, world_sizes, "row-parallel forward")
    print(verdict)
    return verdict
