"""Lesson 02's second exercise: Megatron's g operator (all-reduce forward, identity backward) as a
``torch.autograd.Function``, checked on real ranks (lessons/02_tensor_parallelism.ipynb).

The ranks run the answer twice per group layout: alone (its forward must be the group's sum) and
inside a row-parallel layer ``g(x_r·W_r) + bias`` whose output and gradients (of ``x_r``, ``W_r``
and the bias) must equal the dense layer's. They return those tensors; the checking process
computes the dense layer and compares. The library's mappings (its own f and g) are forbidden.
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
    integers,
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

WORLD_SIZES = (2, 4)
POLICY = Policy("MyG", dist=("all_reduce", "get_rank", "get_world_size", "ReduceOp"),
                builds=_l("g from one all-reduce"))
GRADS = ("output", "grad of x_r", "grad of W_r", "grad of bias")
# How a verdict names each of GRADS.
GRAD_NAMES = {"output": _l("output"), "grad of x_r": _l("grad of x_r"), "grad of W_r": _l("grad of W_r"),
              "grad of bias": _l("grad of bias")}


def mine(index: int, rank: int) -> torch.Tensor:
    """What global rank ``rank`` feeds g alone, in group layout ``index`` (different on every rank)."""
    return integers(torch.Generator().manual_seed(10 * index + rank), 3, 4)


def layer_problem(index: int):
    """``(x, w, bias, grad_out)`` of the row-parallel layer in group layout ``index``."""
    x, w, bias = row_problem((2, 3), 8, 5, seed=100 * index + 7)
    grad_out = integers(torch.Generator().manual_seed(100 * index + 8), 2, 3, 5)  # dL/dY, the group's
    return x, w, bias, grad_out


def harness(source: str, name: str) -> list[dict]:
    """On a rank: per group layout, g's forward alone and the layer's output and three gradients."""
    cls = compile_answer(source, name)
    out = []
    for _label, group, tp, index in tp_groups():
        r = dist.get_rank(group)
        alone = plain(cls.apply(mine(index, dist.get_rank()).clone(), group))
        dist.barrier()
        x, w, bias, grad_out = layer_problem(index)
        k = 8 // tp
        x_r, w_r, b = (x[..., r * k:(r + 1) * k].clone().requires_grad_(),
                       w[r * k:(r + 1) * k].clone().requires_grad_(), bias.clone().requires_grad_())
        y = cls.apply(x_r @ w_r, group) + b
        y.backward(grad_out)
        out.append({"alone": alone, "layer": [plain(t) if t is not None else {"type": "None"}
                                              for t in (y, x_r.grad, w_r.grad, b.grad)]})
        dist.barrier()
    return out


def expected_layer(index: int, r: int, tp: int) -> list[torch.Tensor]:
    """The dense layer's output and the gradients of rank ``r``'s slices."""
    x, w, bias, grad_out = layer_problem(index)
    dense = [t.clone().requires_grad_() for t in (x, w, bias)]
    (dense[0] @ dense[1] + dense[2]).backward(grad_out)
    k = 8 // tp
    return [(x @ w + bias), dense[0].grad[..., r * k:(r + 1) * k], dense[1].grad[r * k:(r + 1) * k], dense[2].grad]


def judge_forward(where: str, tp: int, groups: int, answers: list[dict]) -> str | None:
    """Why g's forward alone is wrong for one group layout (it must sum over the group), or None."""
    for rank, answer in enumerate(answers):
        index, r = (rank // tp if groups > 1 else 0), rank % tp
        first = rank - r
        expected = sum(mine(index, q) for q in range(first, first + tp))
        got = tensor_of(answer["alone"])
        if got is None or got.shape != expected.shape or not torch.equal(got, expected):
            shown = short(got) if got is not None else _("a {type}").format(type=answer["alone"]["type"])
            return _("forward sums over {where}: rank {rank}: got {got}, expected the group's sum {expected}").format(
                where=where, rank=rank, got=shown, expected=short(expected))
    return None


def judge_layer(where: str, tp: int, groups: int, answers: list[dict]) -> str | None:
    """Why the row-parallel layer built with g is wrong, forward and backward, or None."""
    for rank, answer in enumerate(answers):
        index, r = (rank // tp if groups > 1 else 0), rank % tp
        for what, data, e in zip(GRADS, answer["layer"], expected_layer(index, r, tp)):
            g = tensor_of(data)
            if g is None or g.shape != e.shape or not torch.equal(g, e):
                detail = (_("{what}: none") if g is None else _("{what}: got {got}, expected {expected}")).format(
                    what=GRAD_NAMES[what], got=short(g) if g is not None else "", expected=short(e))
                if g is not None and what != "output" and g.shape == e.shape and torch.equal(g, e * tp):
                    detail += _(" ({tp}x too large: the gradient of g's output is already the same on every "
                                "rank, so its backward must pass it on unchanged, not sum it)").format(tp=tp)
                return _("row-parallel layer with g, forward and backward, {where}: rank {rank}: {detail}").format(
                    where=where, rank=rank, detail=detail)
    return None


def judge_world(world: int, per_rank: list) -> tuple[bool, str, tuple[int, int]]:
    """Per group layout two cases, g alone and the layer built with it; the line names the first wrong."""
    wrongs = []
    for i, (where, tp, groups) in enumerate(tp_group_labels(world)):
        answers = [answers[i] for answers in per_rank]
        wrongs += [judge_forward(where, tp, groups, answers), judge_layer(where, tp, groups, answers)]
    cases = counted(wrong is None for wrong in wrongs)
    wrong = next((w for w in wrongs if w), None)
    if wrong:
        return False, failure(_("g operator on {world} ranks: FAILED ({passed}/{tried} cases): {wrong}").format(
            world=world, passed=cases[0], tried=cases[1], wrong=wrong)), cases
    return True, _("g operator on {world} ranks: PASSED ({n}/{n} cases)").format(world=world, n=cases[1]), cases


def judge(source: str):
    return judge_worlds(harness, source, POLICY.name, str(EXERCISE.label), WORLD_SIZES, judge_world,
                        lambda world: 2 * len(tp_group_labels(world)))


EXERCISE = register(Exercise(
    "g-operator", _l("g operator"), POLICY, judge,
    forbids="the library's mappings (its own f and g): one dist.all_reduce of your own"))


def check_g_operator(cls) -> Verdict:
    """Lesson 02's second exercise: ``cls`` is a ``torch.autograd.Function`` whose ``apply(x, group)``
    is Megatron's g (all-reduce forward, identity backward); checked on 2 and 4 real ranks. Prints
    and returns the verdict."""
    if not isinstance(cls, type):
        raise TypeError(f"g operator: pass the class you wrote, MyG (a torch.autograd.Function); got {cls!r}")
    return EXERCISE.check_object(cls)
