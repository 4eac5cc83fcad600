"""Lesson 13's exercise: write the dispatch of a mixture of experts -- which assignments each expert
takes, in which order, and which are dropped for want of capacity (lessons/13_mixture_of_experts.ipynb).

    def my_dispatch(expert, experts, capacity):   # expert (n, k): token t's choice s is expert[t, s]
        return [[(t, s), ...], ...]               # per expert, its queue: the (token, choice) pairs it computes

    check_moe_dispatch(my_dispatch)
    # MoE dispatch, 6 tokens, 3 experts, top-2, capacity 4: PASSED: queues equal models.MoE's ...

The rule is ``models.MoE``'s (GShard, Lepikhin et al. 2020; the capacity of Switch, Fedus et al.
2021): an expert's queue fills choice by choice -- every token's first choice before any token's
second choice -- and within a choice in token order; an assignment whose place in its queue is the
capacity or beyond is dropped. ``queues[e][i]`` is the assignment with ``models.Routing.position``
i at expert e.

The answer runs on 2 fresh ranks. Each rank calls it on the checker's routings (plain lists the
checking process drew from seeds) and returns the queues as plain lists; then the ranks use the
answer's queues for a real expert-parallel forward of a ``models.MoE`` (2 experts per rank, each
rank its own tokens): the dispatch all-to-all sends each kept token row to its expert's rank in
queue order, the experts run, the combine all-to-all brings the rows home. The checking process
recomputes the queues from ``models.queue_positions`` and the dense layer's output on the whole
batch itself, and compares: the queues exactly, the output to 1e-12 in fp64. The library is
forbidden in the answer (from the source), and so is ``torch.distributed``: the dispatch is
arithmetic on the choices, the all-to-all is the harness's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    failure,
    plain,
    register,
    run_answer,
    tensor_of,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.moe.mappings import all_to_all
from parallel_lab.moe.run import Case, reference
from parallel_lab.runtime import commlog

EP = 2  # ranks of the real run
EXACT = 1e-12  # fp64: the same rows through the same experts, summed in the same order per token
POLICY = Policy("my_dispatch", imports=("math", "itertools", "collections"), dist=())
# The real run: 4 experts over 2 ranks, a capacity that drops (factor 1.0)
EP_CASE = Case(experts=4, top_k=2, capacity_factor=1.0, hidden=8, ffn=16, batch=4, seq=8, aux_coef=0.0, seed=3)
# The lesson's worked example: expert 0 is every other token's first choice, so its second-choice
# assignments find it full; queued token by token, token 2's second choice would push out token 5's first
WORKED = [[0, 1], [0, 2], [1, 0], [0, 1], [2, 0], [0, 1]]


def _drawn(n: int, experts: int, top_k: int, seed: int, popular: float) -> list:
    """Choices ``(n, k)`` of a random router whose expert 0 gets ``popular`` added to its logit."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((n, experts), generator=gen, dtype=torch.float64)
    logits[:, 0] += popular
    return models.top_k_routing(logits, top_k)[2].tolist()


def cases() -> list[tuple[str, list, int, int]]:
    """``(label, choices (n, k), experts, capacity)``: the worked example, a top-2 router with a
    popular expert, Switch's top-1, and no capacity (None: n, nothing dropped)."""
    out = [(WORKED, 3, 1.0), (_drawn(32, 4, 2, 11, 1.0), 4, 1.0), (_drawn(24, 4, 1, 12, 0.8), 4, 1.0),
           (_drawn(16, 4, 2, 13, 0.0), 4, None)]
    rows = []
    for choices, experts, factor in out:
        n, k = len(choices), len(choices[0])
        capacity = models.expert_capacity(n, experts, k, factor)
        what = _("no capacity factor") if factor is None else _("capacity factor {factor:g}").format(factor=factor)
        rows.append((_("{n} tokens, {experts} experts, top-{k}, {what} (capacity {capacity})").format(
            n=n, experts=experts, k=k, what=what, capacity=capacity), choices, experts, capacity))
    return rows


# ----------------------------------------------------------------------------------------------
# On a rank (trusted code beside the answer).


def _queues(fn, choices, experts: int, capacity: int) -> dict:
    """The answer's queues for one routing as plain lists, or what went wrong."""
    try:
        got = fn(torch.tensor(choices, dtype=torch.long), experts, capacity)
    except Exception as err:  # the answer's own error
        return {"error": answer_error(err)}
    try:
        if isinstance(got, dict):
            got = [got.get(e, []) for e in range(experts)]
        return {"queues": [[[int(t), int(s)] for t, s in queue] for queue in got]}
    except (TypeError, ValueError):
        return {"malformed": type(got).__name__}


def _runnable(queues, n: int, k: int, experts: int) -> bool:
    return len(queues) == experts and all(0 <= t < n and 0 <= s < k for q in queues for t, s in q)


def _expert_parallel(fn, case: Case) -> dict:
    """The MoE forward over the world with the answer's queues: each rank its tokens and its experts."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    dense = case.build()
    x = reference(case)["x"].reshape(-1, case.hidden)  # (n, H) the whole batch; this rank uses its slice
    n, E, k, local = x.shape[0], case.experts, case.top_k, case.experts // ep
    with torch.no_grad():
        _, gate, expert = models.top_k_routing(dense.router(x), k)
    capacity = models.expert_capacity(n, E, k, case.capacity_factor)
    got = _queues(fn, expert.tolist(), E, capacity)
    if "queues" not in got or not _runnable(got["queues"], n, k, E):
        return {"skipped": True}
    queues, per_rank = got["queues"], n // ep
    owner = [t // per_rank for t in range(n)]  # the rank that holds token t
    # Dispatch: to rank d, this rank's assignments in the queues of d's experts, expert by expert
    order = [(t, s) for d in range(ep) for e in range(d * local, (d + 1) * local) for t, s in queues[e]
             if owner[t] == rank]
    send = [sum(1 for e in range(d * local, (d + 1) * local) for t, _ in queues[e] if owner[t] == rank)
            for d in range(ep)]
    recv = [sum(1 for e in range(rank * local, (rank + 1) * local) for t, _ in queues[e] if owner[t] == src)
            for src in range(ep)]
    which = torch.tensor([e - rank * local for src in range(ep) for e in range(rank * local, (rank + 1) * local)
                          for t, _ in queues[e] if owner[t] == src], dtype=torch.long)
    mine = [dense.experts[rank * local + i] for i in range(local)]
    token = torch.tensor([t - rank * per_rank for t, _ in order], dtype=torch.long)
    choice = torch.tensor([s for _, s in order], dtype=torch.long)
    flat = x[rank * per_rank:(rank + 1) * per_rank]
    with torch.no_grad(), commlog.recording() as log:
        arrived = all_to_all(flat[token], recv, send)
        y = all_to_all(models.run_experts(mine, arrived, which), send, recv)
        gates = gate[rank * per_rank:(rank + 1) * per_rank][token, choice]
        out = flat.new_zeros(flat.shape).index_add(0, token, gates[:, None] * y)
    return {"output": plain(out), "sent": sum(send), "received": sum(recv), "log": log.as_dict(),
            "queues": queues}


def harness(source: str, name: str, routings: list, case: Case) -> dict:
    """On each rank: the answer's queues for every routing, then the expert-parallel forward."""
    fn = compile_answer(source, name)
    return {"cases": [_queues(fn, choices, experts, capacity) for choices, experts, capacity in routings],
            "ep": _expert_parallel(fn, case)}


# ----------------------------------------------------------------------------------------------
# In the checking process.


def reference_queues(choices, experts: int, capacity: int) -> list[list[tuple[int, int]]]:
    """``models.MoE``'s queues: per expert, its kept (token, choice) pairs ordered by queue position."""
    expert = torch.tensor(choices, dtype=torch.long)
    counts = models.assignment_counts(expert, experts)
    position = models.queue_positions(expert, experts, counts.cumsum(0) - counts)  # (n, k)
    queues = [[] for _ in range(experts)]
    for (t, s), p in sorted(((ts, int(position[ts])) for ts in _pairs(expert)), key=lambda item: item[1]):
        if p < capacity:
            queues[int(expert[t, s])].append((t, s))
    return queues


def _pairs(expert):
    n, k = expert.shape
    return [(t, s) for t in range(n) for s in range(k)]


def token_major_queues(choices, experts: int, capacity: int) -> list[list[tuple[int, int]]]:
    """The queues filled token by token (token 0's choices, then token 1's...): the common mistake."""
    queues = [[] for _ in range(experts)]
    for t, row in enumerate(choices):
        for s, e in enumerate(row):
            if len(queues[e]) < capacity:
                queues[e].append((t, s))
    return queues


def _pair(ts) -> str:
    return _("(token {token}, choice {choice})").format(token=ts[0], choice=ts[1])


def _first(items) -> str:
    items = list(items)
    return ", ".join(f"({t}, {s})" for t, s in items[:6]) + (", ..." if len(items) > 6 else "")


RULE = _l("the queues fill choice by choice, every token's first choice before any second choice (GShard), "
          "and within a choice in token order")


def _diagnose(queues, choices, experts: int, capacity: int) -> str | None:
    """Why the answer's queues are not ``models.MoE``'s, or None when they are."""
    ref = reference_queues(choices, experts, capacity)
    queues = [[tuple(ts) for ts in q] for q in queues]
    if queues == ref:
        return None
    if len(queues) != experts:
        return _("returned {got} queues; expected one per expert ({experts})").format(got=len(queues), experts=experts)
    n, k = len(choices), len(choices[0])
    for e, q in enumerate(queues):
        for t, s in q:
            if not (0 <= t < n and 0 <= s < k):
                return _("expert {e}'s queue holds ({t}, {s}), which is no assignment: tokens 0..{n}, "
                         "choices 0..{k}").format(e=e, t=t, s=s, n=n - 1, k=k - 1)
            if choices[t][s] != e:
                return _("expert {e}'s queue holds {pair}, but that choice is expert {other}").format(
                    e=e, pair=_pair((t, s)), other=choices[t][s])
        if len(set(q)) != len(q):
            twice = next(ts for ts in q if q.count(ts) > 1)
            return _("expert {e} receives {pair} twice").format(e=e, pair=_pair(twice))
    for e, q in enumerate(queues):
        if len(q) > capacity:
            return _("expert {e} receives {got} assignments, but its capacity is {capacity}: drop those "
                     "whose place in the queue is {capacity} or beyond (the token keeps its other choices)").format(
                         e=e, got=len(q), capacity=capacity)
    if queues == token_major_queues(choices, experts, capacity):
        e = next((e for e in range(experts) if set(queues[e]) != set(ref[e])), None)
        if e is None:
            e = next(e for e in range(experts) if queues[e] != ref[e])
            return _("you filled the queues token by token: expert {e}'s queue is [{yours}], its "
                     "queue positions in models.MoE [{ref}]; {rule}").format(
                         e=e, yours=_first(queues[e]), ref=_first(ref[e]), rule=RULE)
        extra, missing = sorted(set(queues[e]) - set(ref[e])), sorted(set(ref[e]) - set(queues[e]))
        return _("you filled the queues token by token: expert {e} keeps {extra} and drops "
                 "{missing}; {rule}").format(e=e, extra=_pair(extra[0]), missing=_pair(missing[0]), rule=RULE)
    for e, (q, r) in enumerate(zip(queues, ref)):
        if set(q) != set(r):
            extra, missing = sorted(set(q) - set(r)), sorted(set(r) - set(q))
            if not extra:
                return _("expert {e} keeps {got} assignments and drops {missing}, but it has room "
                         "for {capacity}: drop only beyond the capacity").format(
                             e=e, got=len(q), missing=_pair(missing[0]), capacity=capacity)
            if not missing:
                return _("expert {e} keeps {extra}, which does not fit: {rule}").format(
                    e=e, extra=_pair(extra[0]), rule=RULE)
            return _("expert {e} keeps {extra} and drops {missing}; {rule}").format(
                e=e, extra=_pair(extra[0]), missing=_pair(missing[0]), rule=RULE)
    e = next(e for e, (q, r) in enumerate(zip(queues, ref)) if q != r)
    return _("expert {e} takes the right assignments in another order: yours [{yours}], the "
             "library's queue positions [{ref}]; {rule}").format(
                 e=e, yours=_first(queues[e]), ref=_first(ref[e]), rule=RULE)


def _queue_case(label: str, answer: dict, choices, experts: int, capacity: int) -> tuple[bool, str]:
    head = _("MoE dispatch, {label}").format(label=label)
    if "error" in answer:
        return False, failure(_("{head}: FAILED: {name} raised {error}").format(head=head, name=POLICY.name,
                                                                         error=answer["error"]))
    if "malformed" in answer:
        return False, failure(_("{head}: FAILED: {name} returned a {type}; expected a list of "
                        "{experts} queues, each a list of (token, choice) pairs").format(
                            head=head, name=POLICY.name, type=answer["malformed"], experts=experts))
    why = _diagnose(answer["queues"], choices, experts, capacity)
    if why:
        return False, failure(_("{head}: FAILED: {why}").format(head=head, why=why))
    ref = reference_queues(choices, experts, capacity)
    kept = sum(len(q) for q in ref)
    total = len(choices) * len(choices[0])
    return True, _("{head}: PASSED: queues equal models.MoE's ({kept} of {total} assignments kept, "
                   "{dropped} dropped; loads {loads})").format(head=head, kept=kept, total=total,
                                                              dropped=total - kept, loads=[len(q) for q in ref])


def _ep_case(results: list[dict], case: Case) -> tuple[bool, str]:
    n = case.batch * case.seq
    head = _("MoE dispatch on {ep} real ranks ({experts} experts, {per} per rank, "
             "{n} tokens, top-{k}, capacity factor {factor:g})").format(
                 ep=EP, experts=case.experts, per=case.experts // EP, n=n, k=case.top_k, factor=case.capacity_factor)
    if any(r["ep"].get("skipped") for r in results):
        return False, failure(_("{head}: FAILED: not run: the queues above must be a list of lists of (token, choice) "
                        "pairs").format(head=head))
    ref = reference(case)
    with torch.no_grad():
        choices = models.top_k_routing(case.build().router(ref["x"].reshape(n, case.hidden)), case.top_k)[2]
    why = _diagnose(results[0]["ep"]["queues"], choices.tolist(), case.experts, ref["capacity"])
    if why:
        return False, failure(_("{head}: FAILED: {why}").format(head=head, why=why))
    want = ref["output"].reshape(n, case.hidden)
    per_rank = n // EP
    for rank, r in enumerate(results):
        got = tensor_of(r["ep"]["output"])
        expected = want[rank * per_rank:(rank + 1) * per_rank]
        if got is None or got.shape != expected.shape or (got - expected).abs().max().item() > EXACT:
            return False, failure(_("{head}: FAILED: rank {rank}'s output differs from models.MoE's on the whole "
                                    "batch: the all-to-alls sent the rows your queues name, and those are not the "
                                    "layer's").format(
                                head=head, rank=rank))
    sent = sum(r["ep"]["sent"] for r in results)
    kept = n * case.top_k - ref["dropped"]
    if sent != kept:
        return False, failure(_("{head}: FAILED: the dispatch sent {sent} token rows, models.MoE keeps {kept}").format(
            head=head, sent=sent, kept=kept))
    return True, _("{head}: PASSED: the dispatch and combine all-to-alls carried {sent} of {total} "
                   "assignments ({dropped} dropped) and the output equals models.MoE's on the whole "
                   "batch (fp64, to 1e-12)").format(head=head, sent=sent, total=n * case.top_k,
                                                   dropped=ref["dropped"])


def judge(source: str):
    labelled = cases()
    routings = [(choices, experts, capacity) for _, choices, experts, capacity in labelled]
    results = run_answer(harness, source, POLICY.name, EP, str(EXERCISE.label), args=(routings, EP_CASE))
    tried = len(labelled) + 1  # every routing, and the real expert-parallel run
    if isinstance(results, str):
        return False, [results], (0, tried)
    lines, passed, good = [], True, 0
    for (label, choices, experts, capacity), answer in zip(labelled, results[0]["cases"]):
        ok, line = _queue_case(label, answer, choices, experts, capacity)
        passed &= ok
        good += ok
        lines.append(line)
    if passed:
        ok, line = _ep_case(results, EP_CASE)
        passed &= ok
        good += ok
        lines.append(line)
    return passed, lines, (good, tried)


EXERCISE = register(Exercise(
    "moe-dispatch", _l("MoE dispatch"), POLICY, judge,
    forbids="the library (models.MoE's queue_positions, moe.layer) and torch.distributed: write the queues yourself",
    copies=("parallel_lab.models:queue_positions",)))


def check_moe_dispatch(fn) -> Verdict:
    """Lesson 13's exercise: ``fn(expert, experts, capacity)`` -- ``expert`` an ``(n, k)`` long tensor,
    token t's s-th choice ``expert[t, s]`` -- returns, per expert, the (token, choice) pairs it
    computes, in queue order, at most ``capacity`` of them. One line per routing, then the real run
    on 2 ranks. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
