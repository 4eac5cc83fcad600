"""Lesson 14's exercise: the log-sum-exp merge of two partial attention results, the step ring
attention repeats at every hop (lessons/14_long_context.ipynb).

    def my_merge(out_a, lse_a, out_b, lse_b):   # (..., t, d), (..., t) twice
        ...
        return out, lse                          # attention over both key blocks, and its lse

    check_lse_merge(my_merge)
    # lse merge, direct: PASSED (5/5 cases: ordinary scores, scores near 1000 ..., the identity)
    # lse merge in ring attention on 4 ranks: PASSED (3/3 cases: ...)

The online-softmax merge (Milakov & Gimelshein 2018; FlashAttention's rescaling, Dao et al. 2022;
each ring step of Liu et al. 2023): with ``lse = log(e^lse_a + e^lse_b)``, ``out = e^(lse_a - lse)
out_a + e^(lse_b - lse) out_b``, computed without overflow, and with the convention that a query
whose block saw no key has ``out = 0``, ``lse = -inf`` (the merge's identity).

Two parts, both on fresh ranks that return plain numbers; the checking process recomputes every
expected value itself, from the scores, never from the library's merge:

1. **direct**: five cases drawn from seeds, each a pair of score blocks and value blocks; the
   partial results (output, lse) of each block go into the answer, whose result must equal the
   attention over both blocks together: ordinary scores; scores near 1000, where ``exp`` overflows
   even in fp64; block b fully masked for some queries (``lse_b = -inf``), block a for others; and
   queries that see no key in either block (the result must be the identity, ``0`` and ``-inf``,
   not ``nan``);
2. **ring**: ring attention (``context.ring.ring_attention`` with the answer as its merge) on 4 real
   ranks, causal with the zig-zag split, not causal, and causal with sharp scores (q scaled by 300);
   every rank's output and its q, k, v gradients against the dense attention in fp64 (the
   backward uses the merged lse, so a wrong lse shows in the gradients).

Forbidden (from the source): ``parallel_lab`` (the library's ``blockwise.merge`` is not an answer),
and torch's ``softmax``/``log_softmax``/``logsumexp``/``logaddexp``/``scaled_dot_product_attention``,
which would do the stable arithmetic for you. Every verdict line is deterministic.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.context.blockwise import zigzag_shard, zigzag_unshard
from parallel_lab.context.ring import ring_attention
from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    compile_answer,
    counted,
    failure,
    plain,
    register,
    run_answer,
    tensor_of,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l

SEED = 15
WORLD = 4
TOLERANCE = 1e-10  # fp64: the same sums in a different order
SHORTCUTS = ("softmax", "log_softmax", "logsumexp", "logaddexp", "scaled_dot_product_attention")
POLICY = Policy("my_merge", imports=("math", "torch"), dist=(), forbidden=SHORTCUTS,
                forbidden_why=_l("write the merge from torch.exp, torch.log, torch.maximum and torch.where"))

# (name, what the verdict calls it)
DIRECT = (
    ("ordinary", _l("ordinary scores")),
    ("large", _l("scores near 1000 (exp overflows)")),
    ("masked-b", _l("block b sees no key for some queries (lse_b = -inf)")),
    ("masked-a", _l("block a sees no key for some queries (lse_a = -inf)")),
    ("empty", _l("no key in either block (the identity: out 0, lse -inf)")),
)
# (name, causal, factor on q)
RING = ((_l("causal, zig-zag"), True, 1.0), (_l("not causal"), False, 1.0),
        (_l("causal, sharp scores (q x 300)"), True, 300.0))
SHAPE = dict(batch=1, heads=2, seq=16, head_dim=4)  # seq divisible by 2·cp = 8


# ----------------------------------------------------------------------------------------------
# Inputs, the same wherever they are drawn (rank or checking process).


def partial(scores: torch.Tensor, values: torch.Tensor):
    """Attention of each query over one block, from its scores ``(B, n, t, k)`` (-inf: masked) and
    values ``(B, n, k, d)``: ``(out, lse)``; a query that sees no key gets ``0`` and ``-inf``."""
    lse = torch.logsumexp(scores, dim=-1)  # (B, n, t); -inf where the row is all -inf
    seen = torch.isfinite(lse).unsqueeze(-1)
    weights = torch.where(seen, torch.exp(scores - torch.where(seen, lse.unsqueeze(-1), 0.0)), 0.0)
    return weights @ values, lse


def direct_case(name: str, seed: int = SEED):
    """``(scores_a, values_a, scores_b, values_b)`` of one direct case: ``(1, 2, 6, 5)`` scores per
    block, ``(1, 2, 5, 3)`` values; fp64."""
    gen = torch.Generator().manual_seed(seed + DIRECT.index(next(c for c in DIRECT if c[0] == name)))
    sa, sb = (torch.randn((1, 2, 6, 5), generator=gen, dtype=torch.float64) * 3 for _ in range(2))
    va, vb = (torch.randn((1, 2, 5, 3), generator=gen, dtype=torch.float64) for _ in range(2))
    inf = float("-inf")
    if name == "large":
        sa, sb = sa + 1000.0, sb + 995.0
    elif name == "masked-b":
        sb[..., ::2, :] = inf
    elif name == "masked-a":
        sa[..., 1::2, :] = inf
    elif name == "empty":
        sa[..., :3, :] = inf
        sb[..., :3, :] = inf
    return sa, va, sb, vb


def direct_inputs(name: str):
    """The answer's four inputs for a direct case: ``(out_a, lse_a, out_b, lse_b)``."""
    sa, va, sb, vb = direct_case(name)
    return (*partial(sa, va), *partial(sb, vb))


def direct_expected(name: str):
    """Attention over both blocks together, from the scores: ``(out, lse)``."""
    sa, va, sb, vb = direct_case(name)
    return partial(torch.cat((sa, sb), dim=-1), torch.cat((va, vb), dim=-2))


def ring_inputs(factor: float, seed: int = SEED):
    """``(q, k, v, grad_out)`` ``(B, n, seq, d)`` of the whole sequence, fp64."""
    gen = torch.Generator().manual_seed(seed + 100)
    shape = (SHAPE["batch"], SHAPE["heads"], SHAPE["seq"], SHAPE["head_dim"])
    q, k, v, grad = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4))
    return q * factor, k, v, grad


def dense(causal: bool, factor: float):
    """The single-process reference in the checking process: output and q, k, v gradients."""
    q, k, v, grad = ring_inputs(factor)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, n, seq, seq)
    if causal:
        seq = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# ----------------------------------------------------------------------------------------------
# On the ranks.


def _pair(result) -> dict:
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return {"out": plain(result[0]), "lse": plain(result[1])}
    return {"returned": type(result).__name__}


def harness(source: str, name: str) -> dict:
    """On a rank: the direct cases (rank 0 only), then ring attention with the answer as its merge,
    each case's output and q, k, v gradients (this rank's zig-zag shard)."""
    fn = compile_answer(source, name)
    rank, cp = dist.get_rank(), dist.get_world_size()
    direct = [_pair(fn(*direct_inputs(case))) for case, _label in DIRECT] if rank == 0 else []
    ring = []
    for _label, causal, factor in RING:
        q, k, v, grad = (zigzag_shard(x, cp, rank, dim=2) for x in ring_inputs(factor))
        q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
        out = ring_attention(q, k, v, causal, None, merge_fn=fn)
        out.backward(grad)
        ring.append({"out": plain(out), "dq": plain(q.grad), "dk": plain(k.grad), "dv": plain(v.grad)})
        dist.barrier()
    return {"direct": direct, "ring": ring}


# ----------------------------------------------------------------------------------------------
# In the checking process.


def _why(got: torch.Tensor, want: torch.Tensor, what: str, dense: bool = False) -> tuple[str, str] | None:
    """Why ``got`` is not ``want`` (equal infinities agree), or None: ``(code, text)``, the code one of
    "shape", "nan", "infinite", "differs" (the hint is chosen by it, never by the words, which are
    translated). ``dense``: ``want`` is the dense attention, not the attention over both blocks."""
    if got.shape != want.shape:
        return "shape", _("{what} has shape {got}, expected {want}").format(
            what=what, got=list(got.shape), want=list(want.shape))
    if torch.isnan(got).any():
        text = (_("{what} has nan where the attention is {value}") if dense else
                _("{what} has nan where the attention over both blocks is {value}"))
        return "nan", text.format(what=what, value=_at(want, torch.isnan(got)))
    if not torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
        if (torch.isinf(got) != torch.isinf(want)).any():
            return "infinite", _("{what} is infinite where it should be finite (or the other way round)").format(
                what=what)
        both = torch.isfinite(got)
        worst = (got - want)[both].abs().max().item()
        text = (_("{what} differs from the attention by up to {worst:.3g}") if dense else
                _("{what} differs from the attention over both blocks by up to {worst:.3g}"))
        return "differs", text.format(what=what, worst=worst)
    return None


def _at(want: torch.Tensor, where: torch.Tensor) -> str:
    value = want[where].flatten()[0].item()
    return f"{value:g}" if value == value else _("undefined")


def _hint(case: str, code: str, key: str) -> str:
    """The hint for a direct ``case`` whose ``key`` ("lse" or "out") is wrong in the way ``code`` names."""
    if code == "nan" and case == "empty":
        return _("; with both lse = -inf, -inf - (-inf) is nan: where no block saw a key, use 0 in place of "
                 "the maximum, and divide by 1 where the sum of weights is 0")
    if code in ("nan", "infinite") and case in ("large",):
        return _("; e^1000 overflows even in fp64: subtract the larger lse before exponentiating")
    if code == "nan" and case.startswith("masked"):
        return _("; a block with lse = -inf must get weight 0 (e^(-inf - m) = 0), not nan")
    if code == "differs" and key == "lse":
        return _("; the merged lse is log(e^lse_a + e^lse_b), the log of the joint softmax denominator")
    if code == "differs":
        return _("; weight each output by its block's share of the joint softmax denominator, e^(lse_x - lse)")
    return ""


def judge_direct_case(case, label: str, answer: dict) -> str | None:
    if "returned" in answer:
        return _("{label}: my_merge returned a {type}; return the pair (out, lse)").format(
            label=label, type=answer["returned"])
    want_out, want_lse = direct_expected(case)
    for key, want in (("lse", want_lse), ("out", want_out)):  # an overflowing lse explains the rest
        got = tensor_of(answer[key])
        if got is None:
            return _("{label}: {key} is a {type}, not a tensor").format(label=label, key=key, type=answer[key]["type"])
        why = _why(got, want, key)
        if why:
            code, text = why
            return _("{label}: {why}").format(label=label, why=text) + _hint(case, code, key)
    return None


def judge_ring_case(i: int, label: str, causal: bool, factor, per_rank: list[dict]) -> str | None:
    ref = dense(causal, factor)
    for key in ("out", "dq", "dk", "dv"):
        got = zigzag_unshard([tensor_of(r["ring"][i][key]) for r in per_rank], dim=2)
        why = _why(got, ref[key], key if key == "out" else _("the gradient {key}").format(key=key), dense=True)
        if why:
            return _("{label}: {why} (dense attention, fp64)").format(label=label, why=why[1])
    return None


def direct_cases(answers: list[dict]) -> list:
    """Why each direct case is wrong (None where it is right)."""
    return [judge_direct_case(case, label, answer) for (case, label), answer in zip(DIRECT, answers)]


def ring_cases(per_rank: list[dict]) -> list:
    """Why each ring-attention case is wrong (None where it is right)."""
    return [judge_ring_case(i, label, causal, factor, per_rank) for i, (label, causal, factor) in enumerate(RING)]


def judge_direct(answers: list[dict]) -> str | None:
    """Why the first wrong direct case is wrong, or None."""
    return next((w for w in direct_cases(answers) if w), None)


def judge(source: str):
    per_rank = run_answer(harness, source, POLICY.name, WORLD, str(EXERCISE.label))
    if isinstance(per_rank, str):
        return False, [per_rank], (0, len(DIRECT) + len(RING))
    lines, passed = [], True
    direct, ring = direct_cases(per_rank[0]["direct"]), ring_cases(per_rank)
    cases = counted(wrong is None for wrong in direct + ring)
    wrong = next((w for w in direct if w), None)
    if wrong:
        passed = False
        lines.append(failure(_("lse merge, direct: FAILED ({passed}/{tried} cases): {wrong}").format(
            passed=direct.count(None), tried=len(DIRECT), wrong=wrong)))
    else:
        lines.append(_("lse merge, direct: PASSED ({n}/{n} cases: {cases})").format(
            n=len(DIRECT), cases=", ".join(str(label) for _case, label in DIRECT)))
    wrong = next((w for w in ring if w), None)
    if wrong:
        passed = False
        lines.append(failure(_("lse merge in ring attention on {world} ranks: FAILED ({passed}/{tried} cases): "
                       "{wrong}").format(world=WORLD, passed=ring.count(None), tried=len(RING), wrong=wrong)))
    else:
        lines.append(_("lse merge in ring attention on {world} ranks: PASSED ({n}/{n} cases: {cases}; output and q, "
                       "k, v gradients equal the dense attention in fp64)").format(
            world=WORLD, n=len(RING), cases=", ".join(str(label) for label, _causal, _factor in RING)))
    return passed, lines, cases


EXERCISE = register(Exercise(
    "lse-merge", _l("lse merge"), POLICY, judge,
    forbids="the library's merge (no parallel_lab import) and torch's softmax, log_softmax, logsumexp, "
            "logaddexp and scaled_dot_product_attention: write the stable merge yourself",
    copies=("parallel_lab.context.blockwise:merge",)))


def check_lse_merge(fn) -> Verdict:
    """Lesson 14's exercise: ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)`` merges two partial
    attention results; checked directly on adversarial inputs and inside ring attention on 4 real
    ranks. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
