"""Lesson 11's exercise: the data-, pipeline- and tensor-parallel groups of a mesh, from its rank grid
(lessons/11_3d_parallelism.ipynb).

    def my_mesh_groups(dp, pp, tp):    # the course's grid: rank = (d·pp + p)·tp + t, tp fastest
        return {"dp": [[0, 4], ...], "pp": [[0, 2], ...], "tp": [[0, 1], ...]}

    check_mesh_groups(my_mesh_groups)
    # mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: PASSED (4 dp, 2 pp, 2 tp groups; an all-reduce of ...)
    # ...
    # mesh groups dp 2 × pp 3 × tp 4 (24 ranks, as lists): PASSED (12 dp, 8 pp, 6 tp groups; ...)

The answer is arithmetic: it may use neither ``torch.distributed`` nor the library (its mesh,
``runtime.mesh``, computes the same groups), which the review refuses from the source. It runs on
rank 0 of 4 fresh untrusted ranks (one launch), and its groups, as plain lists of ints, are
broadcast to the other ranks. For each 4-rank mesh whose groups split the ranks (each rank in
exactly one group of each axis), the harness -- trusted code -- creates every group with
``dist.new_group`` on every rank, in the listed order, and all-reduces ``2**rank`` over each: the sum
names exactly the ranks that took part. The checking process recomputes every rank's groups itself
(the ranks that share the other two coordinates) and compares them with both the listed groups and
what each rank's all-reduces summed. Larger meshes (2 × 2 × 2, 2 × 3 × 4) are judged as lists only:
8 ranks and their groups' gloo threads (~75 threads in all) exceed the grader's sandbox, 64 tasks,
where such a check failed with "Resource temporarily unavailable". A copy of the lesson's printed
2 × 2 × 2 groups, or an answer tuned to 4 ranks, still fails on 2 × 3 × 4.
Every verdict line is deterministic (no timings), so nbval compares it.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    failure,
    register,
    run_answer,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l

AXES = ("dp", "pp", "tp")
WORLD = 4  # the ranks of the one launch: the meshes of this size are also checked with collectives
CASES = ((1, 2, 2), (2, 1, 2), (2, 2, 1), (2, 2, 2), (2, 3, 4))  # (dp, pp, tp); the larger ones as lists
POLICY = Policy("my_mesh_groups", imports=("torch", "math", "itertools"), dist=(),
                builds=_l("the groups as lists of ranks, by arithmetic; the check creates them on the ranks"))


def shape_name(dp: int, pp: int, tp: int) -> str:
    return f"dp {dp} × pp {pp} × tp {tp}"


# ----------------------------------------------------------------------------------------------
# The reference, computed in the checking process (and nowhere near the answer).


def coords(rank: int, dp: int, pp: int, tp: int) -> dict:
    """The course's grid, ``torch.arange(world).view(dp, pp, tp)``: rank -> its three coordinates."""
    d, rest = divmod(rank, pp * tp)
    return {"dp": d, "pp": rest // tp, "tp": rest % tp}


def expected_group(axis: str, rank: int, dp: int, pp: int, tp: int) -> list[int]:
    """The ranks of ``rank``'s ``axis`` group: those that share its other two coordinates, in
    increasing order (which is the order of their ``axis`` coordinate)."""
    mine = coords(rank, dp, pp, tp)
    return [r for r in range(dp * pp * tp)
            if all(coords(r, dp, pp, tp)[a] == mine[a] for a in AXES if a != axis)]


# ----------------------------------------------------------------------------------------------
# Shared by the ranks and the checking process: what the answer returned, as plain data.


def plain_groups(value) -> dict | str:
    """The answer's result as ``{axis: [[int, ...], ...]}``, or why it is not that shape."""
    if not isinstance(value, dict):
        return _("returned {value}, not a dict {{'dp': [...], 'pp': [...], 'tp': [...]}} of the groups "
                 "along each axis").format(value=_a(value))
    missing = [repr(a) for a in AXES if a not in value]
    if missing:
        return _("returned a dict without {missing}: give the groups of every axis, dp, pp and tp").format(
            missing=_(" and ").join(missing))
    extra = sorted(repr(k) for k in value if k not in AXES)
    if extra:
        return _("returned a dict with {extra} besides 'dp', 'pp' and 'tp'").format(extra=", ".join(extra))
    out = {}
    for axis in AXES:
        groups = value[axis]
        if isinstance(groups, torch.Tensor):
            groups = groups.tolist()
        if not isinstance(groups, (list, tuple)):
            return _("returned {value} for {axis}: give a list of groups, each a list of ranks").format(
                value=_a(groups), axis=repr(axis))
        out[axis] = []
        for group in groups:
            if isinstance(group, torch.Tensor):
                group = group.tolist()
            if not isinstance(group, (list, tuple)):
                return _("returned {value} as one of the {axis} groups: each group is a list of ranks "
                         "(e.g. [0, 1])").format(value=_a(group), axis=axis)
            bad = next((r for r in group if isinstance(r, bool) or not isinstance(r, numbers.Integral)), None)
            if bad is not None:
                return _("returned {value} in a {axis} group: a group lists ranks, which are ints").format(
                    value=_a(bad), axis=axis)
            out[axis].append([int(r) for r in group])
    return out


def _a(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (numbers.Number, str)):
        return _("a {type}").format(type=type(value).__name__)
    return _("{value} (a {type})").format(value=repr(value), type=type(value).__name__)


def split_problem(groups: dict, world: int) -> str | None:
    """Why the groups of some axis do not split ``range(world)`` (every rank in exactly one group),
    or None. Only groups that do can be created on the ranks: ``dist.new_group`` needs valid ranks,
    and a rank in two groups of one axis would not know which one to use."""
    for axis in AXES:
        home = {}
        for group in groups[axis]:
            if not group:
                return _("the {axis} groups include an empty one, []").format(axis=axis)
            for r in group:
                if not 0 <= r < world:
                    return _("the {axis} group {group} holds rank {rank}, but the ranks are 0..{last}").format(
                        axis=axis, group=group, rank=r, last=world - 1)
                if r in home:
                    if home[r] is group:
                        return _("the {axis} group {group} lists rank {rank} twice: each rank belongs to exactly "
                                 "one group of each axis").format(axis=axis, group=group, rank=r)
                    return _("the {axis} group {group} and the {axis} group {other} both hold rank {rank}: each "
                             "rank belongs to exactly one group of each axis").format(
                                 axis=axis, group=group, other=home[r], rank=r)
                home[r] = group
        lost = [r for r in range(world) if r not in home]
        if lost:
            return _("rank {rank} is in no {axis} group: each rank belongs to exactly one group of each axis"
                     ).format(rank=lost[0], axis=axis)
    return None


# ----------------------------------------------------------------------------------------------
# On the ranks.


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank. Rank 0 runs the answer for each ``(dp, pp, tp)`` case and broadcasts its groups as
    plain data; then for each case of this world's size whose groups split the ranks, every rank
    creates every group (``dist.new_group``, same order everywhere) and all-reduces ``2**rank`` over
    each group it is in. Per case: ``{"answer": ...}`` (rank 0's groups, a reason or an error) and
    ``{"found": {axis: the ranks its all-reduce summed}}`` (empty for larger meshes)."""
    rank = dist.get_rank()
    box = [None]
    if rank == 0:
        fn = compile_answer(source, name)
        answers = []
        for dp, pp, tp in cases:
            try:
                groups = plain_groups(fn(dp, pp, tp))
                answers.append({"groups": groups} if isinstance(groups, dict) else {"wrong": groups})
            except Exception as err:  # the answer's own error: reported per case
                answers.append({"error": answer_error(err)})
        box = [answers]
    dist.broadcast_object_list(box, src=0)
    out = []
    for (dp, pp, tp), answer in zip(cases, box[0]):
        found = {}
        world = dist.get_world_size()
        if dp * pp * tp == world and "groups" in answer and split_problem(answer["groups"], world) is None:
            for axis in AXES:  # one axis at a time: a rank then holds one group of its own at once
                created = [dist.new_group(ranks=group) for group in answer["groups"][axis]]
                for group, handle in zip(answer["groups"][axis], created):
                    if rank in group:
                        value = torch.tensor([2.0 ** rank], dtype=torch.float64)
                        dist.all_reduce(value, group=handle)
                        total = int(value.item())
                        found[axis] = [r for r in range(world) if total >> r & 1]
                dist.barrier()
                for handle in created:
                    dist.destroy_process_group(handle)
        out.append({"answer": answer if rank == 0 else None, "found": found})
    return out


# ----------------------------------------------------------------------------------------------
# In the checking process.


def judge_case(dp: int, pp: int, tp: int, answer: dict, found: list[dict] | None) -> str | None:
    """Why the answer to one mesh is wrong, or None. ``found``: per rank, what its all-reduces summed
    (None for a mesh judged as lists only)."""
    world = dp * pp * tp
    call = f"{POLICY.name}({dp}, {pp}, {tp})"
    if "error" in answer:
        return _("{call} raised {error}").format(call=call, error=answer["error"])
    if "wrong" in answer:
        return f"{call} {answer['wrong']}"
    groups = plain_groups(answer.get("groups"))  # read again here: a rank's data is not trusted
    if isinstance(groups, str):
        return f"{call} {groups}"
    split = split_problem(groups, world)
    if split:
        return split
    for rank in range(world):
        c = coords(rank, dp, pp, tp)
        for axis in AXES:
            listed = next(sorted(g) for g in groups[axis] if rank in g)
            should = expected_group(axis, rank, dp, pp, tp)
            others = [a for a in AXES if a != axis]
            if listed != should:
                return _("the {axis} group of rank {rank} is {listed}, should be {should}: the ranks that share "
                         "its {a} and {b} coordinates ({a} {ca}, {b} {cb})").format(
                             axis=axis, rank=rank, listed=listed, should=should, a=others[0], b=others[1],
                             ca=c[others[0]], cb=c[others[1]])
            if found is None:
                continue
            got = found[rank].get(axis) if isinstance(found[rank], dict) else None
            if got != should:
                if got is None:
                    return _("rank {rank}'s all-reduce over its {axis} group {should} summed the values of "
                             "no group").format(rank=rank, axis=axis, should=should)
                return _("rank {rank}'s all-reduce over its {axis} group {should} summed the values of "
                         "ranks {got}").format(rank=rank, axis=axis, should=should, got=got)
    for axis in AXES:
        for group in groups[axis]:
            if group != sorted(group):
                return _("the {axis} group {group} is out of order: list it by {axis} coordinate, "
                         "{sorted} (member i of a group is the one at {axis} coordinate i)").format(
                             axis=axis, group=group, sorted=sorted(group))
    return None


def judge(source: str):
    per_rank = run_answer(harness, source, POLICY.name, WORLD, str(EXERCISE.label))
    if isinstance(per_rank, str):
        return False, [per_rank], (0, len(CASES))
    if any(not isinstance(rank, list) or len(rank) != len(CASES) for rank in per_rank):
        return False, [failure(_("mesh groups on {world} ranks: FAILED: the ranks did not return one result per mesh"
                         ).format(world=WORLD))], \
            (0, len(CASES))
    lines, passed, good = [], True, 0
    for index, (dp, pp, tp) in enumerate(CASES):
        world = dp * pp * tp
        on_ranks = world == WORLD
        label = (_("mesh groups {shape} on {world} ranks") if on_ranks else
                 _("mesh groups {shape} ({world} ranks, as lists)")).format(shape=shape_name(dp, pp, tp), world=world)
        answer = per_rank[0][index]["answer"] or {}
        found = [per_rank[r][index]["found"] for r in range(WORLD)] if on_ranks else None
        wrong = judge_case(dp, pp, tp, answer, found)
        if wrong:
            passed = False
            lines.append(failure(_("{label}: FAILED: {reason}").format(label=label, reason=wrong)))
            continue
        counts = ", ".join(f"{len(answer['groups'][axis])} {axis}" for axis in AXES)
        how = (_("an all-reduce of 2^rank over each summed exactly its members") if on_ranks else
               _("each the ranks that share the other two coordinates"))
        lines.append(_("{label}: PASSED ({counts} groups; {how})").format(label=label, counts=counts, how=how))
        good += 1
    return passed, lines, (good, len(CASES))


EXERCISE = register(Exercise(
    "mesh-groups", _l("mesh groups"), POLICY, judge,
    forbids="torch.distributed and the library's mesh (runtime.mesh): compute the groups from the rank grid "
            "yourself"))


def check_mesh_groups(fn) -> Verdict:
    """Lesson 11's exercise: ``fn(dp, pp, tp)`` returns ``{"dp": [...], "pp": [...], "tp": [...]}``, the
    groups of ranks along each axis of the course's rank grid (``arange(dp·pp·tp).view(dp, pp, tp)``);
    checked on 4 real ranks with an all-reduce over every group, and on larger meshes as lists.
    Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
