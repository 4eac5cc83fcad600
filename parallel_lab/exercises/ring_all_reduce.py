"""Lesson 01's exercise: ring all-reduce from send/recv (lessons/01_ranks_and_collectives.ipynb).

    check_ring_all_reduce(my_ring_all_reduce)
    # ring all-reduce on 2 ranks: PASSED (5/5 cases; send/recv only, 2(p−1)/p of the tensor per rank)
    # ring all-reduce on 4 ranks: PASSED (5/5 cases; ...)

What it forbids, and how it knows: the answer may use only
``dist.isend``/``irecv``/``send``/``recv`` (and ``get_rank``, ``get_world_size``): a collective, or
the library's own ring (imported, or copied in renamed and reformatted: ``exercises.copies``), is
refused from the source; on the ranks, ``commlog`` records every call, so a collective reached any
other way shows up, and the bytes sent must be a ring's, 2(p−1)/p of the tensor per rank (2(p−1)·n
over all ranks). The inputs are drawn from a seed (different on every rank), and the checking
process recomputes their sum itself.
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
    short,
    tensor_of,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l, ngettext
from parallel_lab.runtime import commlog

CASES = (1, 4, 5, 12, 1001)  # element counts: fewer than the ranks, divisible, not divisible
WORLD_SIZES = (2, 4)
SEED = 1234
P2P = ("send", "recv", "isend", "irecv")
POLICY = Policy("my_ring_all_reduce", dist=(*P2P, "get_rank", "get_world_size"),
                builds=_l("it from isend/recv"))


def inputs(numel: int, rank: int, seed: int = SEED) -> torch.Tensor:
    """Rank ``rank``'s tensor for a case: integer-valued fp64 (any order of additions is exact)."""
    gen = torch.Generator().manual_seed(seed + 1000 * numel + rank)
    return torch.randint(-50, 51, (numel,), generator=gen).to(torch.float64)


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: run the answer on each case; per case the tensor it left (or returned) and the
    calls it made (commlog)."""
    fn = compile_answer(source, name)
    rank, out = dist.get_rank(), []
    for numel in cases:
        x = inputs(numel, rank)
        with commlog.recording() as log:
            result = fn(x)
        out.append({"value": plain(result if isinstance(result, torch.Tensor) else x), "ops": log.as_dict()})
        dist.barrier()  # keep ranks in step between cases, so a failure is pinned to its case
    return out


def judge_case(numel: int, world: int, answers: list[dict]) -> str | None:
    """Why the ranks' answers to one case are wrong, or None."""
    expected = sum(inputs(numel, r) for r in range(world))
    for rank, answer in enumerate(answers):
        got = tensor_of(answer["value"])
        if got is None or got.shape != expected.shape or not torch.equal(got, expected):
            shown = answer["value"] if got is None else None
            what = short(got) if shown is None else _("a {type}").format(type=shown["type"])
            return _("rank {rank}: got {got}, expected {expected}").format(rank=rank, got=what,
                                                                           expected=short(expected))
    used = sorted({op for a in answers for op in a["ops"]} - set(P2P))
    if used:
        return _("the ranks called {ops}; this exercise builds it from isend/recv").format(ops=", ".join(used))
    sent = sum(a["ops"].get(op, {"bytes": 0})["bytes"] for a in answers for op in ("send", "isend"))
    ring = 2 * (world - 1) * numel * 8
    if sent != ring:
        return _("the ranks sent {sent} bytes in all; a ring sends 2(p−1)·n = {ring} bytes (2(p−1)/p of the tensor "
                 "per rank): reduce-scatter then all-gather, one chunk per step").format(sent=sent, ring=ring)
    return None


def judge_world(world: int, per_rank: list) -> tuple[bool, str, tuple[int, int]]:
    """One world's verdict line and (cases passed, cases tried); the line names the first wrong case."""
    wrongs = [(numel, judge_case(numel, world, answers)) for numel, *answers in zip(CASES, *per_rank)]
    cases = counted(wrong is None for _numel, wrong in wrongs)
    numel, wrong = next(((n, w) for n, w in wrongs if w), (None, None))
    if wrong:
        size = ngettext("tensor of {n} element", "tensor of {n} elements", numel).format(n=numel)
        return False, failure(_("ring all-reduce on {world} ranks: FAILED"
                                " ({passed}/{tried} cases): {size}: {wrong}").format(
            world=world, passed=cases[0], tried=cases[1], size=size, wrong=wrong)), cases
    return True, _("ring all-reduce on {world} ranks: PASSED ({n}/{n} cases; send/recv only, 2(p−1)/p of the tensor "
                   "per rank)").format(world=world, n=len(CASES)), cases


def judge(source: str):
    return judge_worlds(harness, source, POLICY.name, str(EXERCISE.label), WORLD_SIZES, judge_world,
                        lambda world: len(CASES))


EXERCISE = register(Exercise(
    "ring-all-reduce", _l("ring all-reduce"), POLICY, judge,
    forbids="collectives (dist.all_reduce, ...) and the library's own ring: build it from isend/recv",
    copies=("parallel_lab.runtime.collectives:ring_all_reduce",)))


def check_ring_all_reduce(fn) -> Verdict:
    """Lesson 01's exercise: ``fn(tensor)`` sums ``tensor`` over all ranks in place with a ring of
    send/recv; checked on 2 and 4 real ranks. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
