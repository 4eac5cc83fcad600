"""Lesson 02's second exercise: Megatron's g operator (all-reduce forward, identity backward) as a
``torch.autograd.Function``, checked on real ranks (lessons/02_tensor_parallelism.ipynb)."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import Verdict, check_class_on_ranks, integers, row_problem, short, tp_groups


def g_operator_cases(student_cls):
    """On a rank: ``student_cls.apply(x, group)`` as Megatron's g. (1) forward: the sum over the
    group; (2) inside a row-parallel layer ``g(x_r·W_r) + bias``: output, and the gradients of
    ``x_r``, ``W_r`` and the bias against the dense layer's."""
    results = []
    for where, group, tp, index in tp_groups():
        r = dist.get_rank(group)
        gen = torch.Generator().manual_seed(10 * index + dist.get_rank())  # different on every rank
        mine = integers(gen, 3, 4)
        expected = mine.clone()
        dist.all_reduce(expected, group=group)
        got = student_cls.apply(mine.clone(), group)
        ok = isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected)
        detail = "" if ok else (f"got {short(got)}, expected the group's sum {short(expected)}"
                                if isinstance(got, torch.Tensor) else f"returned {type(got).__name__}")
        results.append((f"forward sums over {where}", ok, detail))
        dist.barrier()

        x, w, bias = row_problem((2, 3), 8, 5, seed=100 * index + 7)
        gen = torch.Generator().manual_seed(100 * index + 8)
        grad_out = integers(gen, 2, 3, 5)  # dL/dY, the same on every rank of the group
        dense = [t.clone().requires_grad_() for t in (x, w, bias)]
        (dense[0] @ dense[1] + dense[2]).backward(grad_out)
        k = 8 // tp
        x_r, w_r, b = (x[..., r * k:(r + 1) * k].clone().requires_grad_(),
                       w[r * k:(r + 1) * k].clone().requires_grad_(), bias.clone().requires_grad_())
        y = student_cls.apply(x_r @ w_r, group) + b
        y.backward(grad_out)
        checks = [("output", y.detach(), (x @ w + bias)),
                  ("grad of x_r", x_r.grad, dense[0].grad[..., r * k:(r + 1) * k]),
                  ("grad of W_r", w_r.grad, dense[1].grad[r * k:(r + 1) * k]),
                  ("grad of bias", b.grad, dense[2].grad)]
        wrong = [(what, g, e) for what, g, e in checks if g is None or not torch.equal(g, e)]
        detail = ""
        if wrong:
            what, g, e = wrong[0]
            detail = f"{what}: " + ("none" if g is None else f"got {short(g)}, expected {short(e)}")
            if g is not None and what != "output" and torch.equal(g, e * tp):
                detail += (f" ({tp}x too large: the gradient of g's output is already the same on every "
                           f"rank, so its backward must pass it on unchanged, not sum it)")
        results.append((f"row-parallel layer with g, forward and backward, {where}", not wrong, detail))
        dist.barrier()
    return results


def check_g_operator(cls, world_sizes=(2, 4)) -> Verdict:
    """Lesson 02's second exercise: ``cls`` is a ``torch.autograd.Function`` whose ``apply(x, group)``
    is Megatron's g (all-reduce forward, identity backward); checked on real ranks. Prints and
    returns the verdict."""
    if not (inspect.isclass(cls) and issubclass(cls, torch.autograd.Function)):
        raise TypeError(f"expected a torch.autograd.Function subclass, got {cls!r}")
    verdict = check_class_on_ranks(cls, g_operator_cases, world_sizes, "g operator")
    print(verdict)
    return verdict
