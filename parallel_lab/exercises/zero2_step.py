"""Lesson 12's exercise: ZeRO-2's step for one flat gradient (lessons/12_zero_sharding.ipynb).

    def my_zero2_step(param, grad, state, lr):   # param: full flat (n), grad: this rank's (n)
        ...                                      # reduce-scatter, Adam on the shard, all-gather

    check_zero2_step(my_zero2_step)
    # ZeRO-2 step on 2 ranks: PASSED (2/2 cases, 3 steps each: equal to one process; ...)

Rajbhandari et al. 2020, "ZeRO", section 5.2 (P_os+g): each rank receives only its averaged shard of
the gradient (a reduce-scatter), updates only its shard of the parameters with only its shard of
Adam's state, and the updated shards are all-gathered into the full parameters (section 7.2.1: Ψ
moved by the reduce-scatter plus Ψ by the all-gather, the same 2Ψ as plain data parallelism).

The check runs the answer on 2 and 4 fresh ranks for a few Adam steps, each rank with its own
gradient (integer-valued fp64, drawn from a seed, so every order of additions gives the same sum),
and in the checking process

1. compares every rank's parameter with one process running ``torch.optim.Adam`` on the mean of the
   ranks' gradients, to 1e-12 (fp64);
2. reads what the ranks really sent (``runtime.commlog``): per step one reduce-scatter of the whole
   gradient and one all-gather of one shard, nothing else. An all-reduce of the whole gradient
   (followed by slicing) fails: it leaves every rank the whole averaged gradient, N times the shard
   ZeRO-2 keeps;
3. measures the optimizer state the rank keeps between steps (the tensors in ``state`` and in the
   answer's module-level names): at most Adam's two moments of one shard, 2n/N values.

What it forbids: ``parallel_lab`` (the engine's own ``zero`` package) and ``torch.optim`` (from the
source: write Adam's update yourself). Every verdict line is deterministic.
"""

from __future__ import annotations

import ast

import torch
import torch.distributed as dist

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    compile_answer,
    counted,
    failure,
    judge_worlds,
    register,
    short,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.runtime import commlog

CASES = ((8, 3), (1000, 3))  # (n values, Adam steps): n divisible by 2 and 4 ranks
WORLD_SIZES = (2, 4)
SEED = 1313
LR = 0.05
EXACT = 1e-12
REDUCE_SCATTER = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter")
ALL_GATHER = ("all_gather_single", "all_gather_into_tensor", "all_gather")
POLICY = Policy("my_zero2_step")  # torch, torch.distributed, math; any dist call (commlog judges them)


def initial_param(numel: int, seed: int = SEED) -> torch.Tensor:
    """The parameter every rank starts from (fp64)."""
    gen = torch.Generator().manual_seed(seed + numel)
    return torch.randn(numel, generator=gen, dtype=torch.float64)


def gradient(numel: int, rank: int, step: int, seed: int = SEED) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: small integers in fp64 (exact sums in any order)."""
    gen = torch.Generator().manual_seed(seed + 7919 * numel + 101 * step + rank)
    return torch.randint(-5, 6, (numel,), generator=gen).to(torch.float64)


def reference(numel: int, steps: int, world: int) -> torch.Tensor:
    """One process: ``torch.optim.Adam`` on the mean of the ranks' gradients, ``steps`` times."""
    param = initial_param(numel).clone().requires_grad_(True)
    opt = torch.optim.Adam([param], lr=LR)
    for step in range(steps):
        param.grad = sum(gradient(numel, r, step) for r in range(world)) / world
        opt.step()
    return param.detach()


# ----------------------------------------------------------------------------------------------
# On a rank.


def _numel(value, seen) -> int:
    """Values of the tensors in ``value`` (a tensor, or dicts/lists/tuples of them), each storage once."""
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.numel())
        if key in seen:
            return 0
        seen.add(key)
        return value.numel()
    if isinstance(value, dict):
        return sum(_numel(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_numel(v, seen) for v in value)
    return 0


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: each case's steps; per case the final parameter, per step the calls made
    (commlog), and the most optimizer-state values kept between steps."""
    fn = compile_answer(source, name)
    namespace = fn.__globals__  # the answer cell's module-level names (state kept there counts too)
    rank, out = dist.get_rank(), []
    for numel, steps in cases:
        param, state, ops, kept = initial_param(numel).clone(), {}, [], 0
        for step in range(steps):
            with commlog.recording() as log:
                fn(param, gradient(numel, rank, step), state, LR)
            ops.append(log.as_dict())
            module_level = [v for k, v in namespace.items() if not k.startswith("__") and k != name]
            kept = max(kept, _numel(state, set()) + _numel(module_level, set()))
        out.append({"param": param.tolist(), "ops": ops, "state_values": kept})
        dist.barrier()  # keep ranks in step between cases
    return out


# ----------------------------------------------------------------------------------------------
# In the checking process.


def static_reason(source: str) -> str | None:
    """Why the source is refused before any rank runs (``torch.optim``), or None."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "optim":
            return _("uses torch.optim: write Adam's update of your shard yourself (its formulas are above the cell)")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any("optim" in n.split(".") for n in names):
                return _("imports torch.optim: write Adam's update of your shard yourself")
    return None


def judge_case(numel: int, steps: int, world: int, answers: list[dict]) -> str | None:
    """Why the ranks' answers to one case are wrong, or None."""
    expected = reference(numel, steps, world)
    shard = numel // world
    for rank, answer in enumerate(answers):
        got = torch.tensor(answer["param"], dtype=torch.float64)
        diff = (got - expected).abs()
        if diff.max().item() > EXACT:
            wrong = sorted({int(i) // shard for i in torch.nonzero(diff > EXACT).flatten().tolist()})
            hint = (_(" (only other ranks' shards differ: all-gather the updated shards into param)")
                    if rank not in wrong else "")
            return _("rank {rank}: param after {steps} steps is {got}, one process has {expected}; max difference "
                     "{diff:.3g} in the shard(s) of rank(s) {wrong}{hint}").format(
                rank=rank, steps=steps, got=short(got), expected=short(expected), diff=diff.max().item(), wrong=wrong,
                hint=hint)
    value_bytes = 8
    for step in range(steps):
        for rank, answer in enumerate(answers):
            ops = answer["ops"][step]
            if "all_reduce" in ops:
                return _("rank {rank} all-reduced {bytes} bytes at step {step}: an all-reduce leaves every rank the "
                         "whole averaged gradient, {numel} values, {world}x the {shard}-value shard ZeRO-2 keeps; the "
                         "gradient was not sharded. Reduce-scatter it so each rank receives only its own averaged "
                         "shard").format(rank=rank, bytes=ops["all_reduce"]["bytes"], step=step, numel=numel,
                                         world=world, shard=shard)
            scatters = sum(ops[op]["count"] for op in REDUCE_SCATTER if op in ops)
            gathers = sum(ops[op]["count"] for op in ALL_GATHER if op in ops)
            other = sorted(set(ops) - set(REDUCE_SCATTER) - set(ALL_GATHER))
            if other:
                return _("rank {rank} called {ops} at step {step}; ZeRO-2's step is one reduce-scatter of the "
                         "gradient and one all-gather of the updated shards").format(rank=rank, ops=", ".join(other),
                                                                                     step=step)
            if scatters != 1:
                return _("rank {rank} made {n} reduce-scatters at step {step}; ZeRO-2 reduce-scatters the gradient "
                         "once, so that each rank receives only its averaged shard").format(rank=rank, n=scatters,
                                                                                            step=step)
            scattered = sum(ops[op]["bytes"] for op in REDUCE_SCATTER if op in ops)
            if scattered != numel * value_bytes:
                return _("rank {rank} reduce-scattered {bytes} bytes at step {step}, not the whole gradient ({whole} "
                         "bytes)").format(rank=rank, bytes=scattered, step=step, whole=numel * value_bytes)
            gathered = sum(ops[op]["bytes"] for op in ALL_GATHER if op in ops)
            if gathers != 1 or gathered != shard * value_bytes:
                return _("rank {rank} made {n} all-gather(s) of {bytes} bytes at step {step}; ZeRO-2 all-gathers the "
                         "updated parameter shards once, {shard_bytes} bytes from each rank (its {shard} "
                         "values)").format(rank=rank, n=gathers, bytes=gathered, step=step,
                                           shard_bytes=shard * value_bytes, shard=shard)
    for rank, answer in enumerate(answers):
        if answer["state_values"] > 2 * shard:
            return _("rank {rank} keeps {values} values of optimizer state between steps; Adam's two moments of its "
                     "shard are 2n/N = {moments}: keep the moments for this rank's {shard}-value shard only (the "
                     "optimizer state was not sharded)").format(rank=rank, values=answer["state_values"],
                                                                moments=2 * shard, shard=shard)
    return None


def judge(source: str):
    reason = static_reason(source)
    if reason:
        line = failure(_("{label}: FAILED: your answer {reason}").format(label=str(EXERCISE.label), reason=reason))
        return False, [line], (0, 0)
    return judge_worlds(harness, source, POLICY.name, str(EXERCISE.label), WORLD_SIZES, judge_world,
                        lambda world: len(CASES))


def judge_world(world: int, per_rank: list) -> tuple[bool, str, tuple[int, int]]:
    wrongs = [(numel, judge_case(numel, steps, world, answers)) for (numel, steps), *answers in zip(CASES, *per_rank)]
    cases = counted(wrong is None for _numel, wrong in wrongs)
    numel, wrong = next(((n, w) for n, w in wrongs if w), (None, None))
    if wrong:
        return False, failure(_("ZeRO-2 step on {world} ranks: FAILED"
                                " ({passed}/{tried} cases): n = {numel}: {wrong}").format(
            world=world, passed=cases[0], tried=cases[1], numel=numel, wrong=wrong)), cases
    return True, _("ZeRO-2 step on {world} ranks: PASSED ({n}/{n} cases, {steps} Adam steps each: equal to one "
                   "process; one reduce-scatter of n and one all-gather of n/N per step; optimizer state 2n/N values "
                   "per rank)").format(world=world, n=len(CASES), steps=CASES[0][1]), cases


EXERCISE = register(Exercise(
    "zero2-step", _l("ZeRO-2 step"), POLICY, judge,
    forbids="the library (parallel_lab, its zero engine) and torch.optim: write the reduce-scatter, "
            "Adam on the shard and the all-gather yourself"))


def check_zero2_step(fn) -> Verdict:
    """Lesson 12's exercise: ``fn(param, grad, state, lr)`` does one ZeRO-2 step of one flat
    parameter in place; checked on 2 and 4 real ranks against one process. Prints and returns the
    verdict."""
    return EXERCISE.check_object(fn)
