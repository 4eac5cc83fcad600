"""Lesson 02's first exercise: the row-parallel forward ``Y = X·W + bias`` from this rank's slices,
checked on real ranks against the dense product (lessons/02_tensor_parallelism.ipynb).

The answer takes an explicit ``group``; on 4 ranks the check also runs it in two groups of 2 with
different data, which catches a collective that ignores ``group`` (it would sum over all 4). It
forbids the library's parallel layers and mappings (from the source): the one collective is the
student's own ``dist.all_reduce``. The ranks return what the answer computed; the checking process
recomputes the dense product and compares.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    compile_answer,
    counted,
    failure,
    judge_worlds,
    plain,
    register,
    row_problem,
    short,
    tensor_of,
    tp_group_labels,
    tp_groups,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l

SHAPES = (((3,), 8, 5), ((2, 4), 8, 6))  # (leading dims of x, in features, out features)
WORLD_SIZES = (2, 4)
POLICY = Policy("my_row_parallel_forward", dist=("all_reduce", "get_rank", "get_world_size", "ReduceOp"),
                builds=_l("the row-parallel forward from one all-reduce"))


def shards(leading, n_in, n_out, index: int, r: int, tp: int):
    """``(x, w, bias, x_shard, w_shard)`` of group ``index``'s problem for its rank ``r`` of ``tp``."""
    x, w, bias = row_problem(leading, n_in, n_out, seed=100 * index + n_out)
    k = n_in // tp
    return x, w, bias, x[..., r * k:(r + 1) * k], w[r * k:(r + 1) * k]


def harness(source: str, name: str) -> list[dict]:
    """On a rank: the answer's output for every group layout and shape, in order."""
    fn = compile_answer(source, name)
    out = []
    for _label, group, tp, index in tp_groups():
        r = dist.get_rank(group)
        for leading, n_in, n_out in SHAPES:
            _x, _w, bias, x_shard, w_shard = shards(leading, n_in, n_out, index, r, tp)
            out.append(plain(fn(x_shard.clone(), w_shard.clone(), bias.clone(), group)))
            dist.barrier()  # keep ranks in step between cases, so a failure is pinned to its case
    return out


def hint(got, expected, partial, bias, tp, groups) -> str:
    """What a wrong output most likely is."""
    if got.shape != expected.shape:
        return _("shape {got}, expected {expected}").format(got=tuple(got.shape), expected=tuple(expected.shape))
    if torch.equal(got, partial + bias) or torch.equal(got, partial):
        return _("this is the rank's own partial product: sum it over the group with dist.all_reduce")
    if torch.equal(got, expected + (tp - 1) * bias):
        return _("the bias was added {tp} times (once per rank before the sum): add it once, after the "
                 "all-reduce").format(tp=tp)
    if torch.equal(got, expected - bias):
        return _("the bias is missing")
    if groups > 1:
        return _("got {got}, expected {expected}: pass group=group to the collective, or it sums over every "
                 "rank").format(got=short(got), expected=short(expected))
    return _("got {got}, expected {expected}").format(got=short(got), expected=short(expected))


def judge_case(world: int, per_rank: list, i: int, where: str, tp: int, groups: int, shape) -> str | None:
    """Why the ranks' outputs for case ``i`` are wrong (the first wrong rank), or None."""
    leading, n_in, n_out = shape
    for rank in range(world):
        index, r = (rank // tp if groups > 1 else 0), rank % tp
        x, w, bias, x_shard, w_shard = shards(leading, n_in, n_out, index, r, tp)
        expected, got = x @ w + bias, tensor_of(per_rank[rank][i])
        if got is None:
            detail = _("returned {type}, expected a tensor of shape {shape}").format(
                type=per_rank[rank][i]["type"], shape=tuple(expected.shape))
        elif got.shape != expected.shape or not torch.equal(got, expected):
            detail = hint(got, expected, x_shard @ w_shard, bias, tp, groups)
        else:
            continue
        return _("x {x}, W {w}, {where}: rank {rank}: {detail}").format(x=tuple(x.shape), w=tuple(w.shape),
                                                                         where=where, rank=rank, detail=detail)
    return None


def world_cases(world: int) -> list:
    return [(where, tp, groups, shape) for where, tp, groups in tp_group_labels(world) for shape in SHAPES]


def judge_world(world: int, per_rank: list) -> tuple[bool, str, tuple[int, int]]:
    wrongs = [judge_case(world, per_rank, i, *case) for i, case in enumerate(world_cases(world))]
    cases = counted(wrong is None for wrong in wrongs)
    wrong = next((w for w in wrongs if w), None)
    if wrong:
        return False, failure(_("row-parallel forward on {world} ranks: FAILED"
                                " ({passed}/{tried} cases): {wrong}").format(
            world=world, passed=cases[0], tried=cases[1], wrong=wrong)), cases
    passed = _("row-parallel forward on {world} ranks: PASSED ({n}/{n} cases)").format(world=world, n=cases[1])
    return True, passed, cases


def judge(source: str):
    return judge_worlds(harness, source, POLICY.name, str(EXERCISE.label), WORLD_SIZES, judge_world,
                        lambda world: len(world_cases(world)))


EXERCISE = register(Exercise(
    "row-parallel-forward", _l("row-parallel forward"), POLICY, judge,
    forbids="the library's parallel layers and mappings: one dist.all_reduce of your own"))


def check_row_parallel_forward(fn) -> Verdict:
    """Lesson 02's first exercise: ``fn(x_shard, w_shard, bias, group)`` computes the row-parallel
    ``Y = X·W + bias`` from this rank's column slice of ``X`` and row slice of ``W``; checked against
    the dense product on 2 and 4 real ranks. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
