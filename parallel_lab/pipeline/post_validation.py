"""The optimizer step after a pipeline step, with gradient clipping by the global norm, done two ways
on real ranks (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ICLR 2024, section 4, "Bypassing
optimizer synchronizations"):

    from parallel_lab.pipeline.post_validation import run_clipped
    result = run_clipped(build("zb-h1", 4, 8), max_norms=(1e9, 1e-3))
    result["cases"][1]["post-validated"]["max_param_diff"]     # against one process: clipped SGD
    result["cases"][1]["post-validated"]["rolled_back"]        # the ranks that redid their step

- **synchronised**: an all-reduce of the squared gradient norm over every pipeline rank, then each
  rank clips by the global norm and steps. Every rank waits for the last one's last W: in a
  training loop, every step starts from an empty pipeline (``search.problem.Judged.step``).
- **post-validated**: no synchronisation before the step. The squared norm is summed rank to rank
  (rank r receives the partial sum of ranks < r, adds its own, sends it on); each rank steps at
  once, unclipped, unless its partial norm already exceeds the threshold (then clipping is certain
  and it waits). The full norm then travels back from the last rank -- in the paper during the next
  step's warm-up, here right after -- and each rank validates: when clipping was needed, a rank that
  stepped rolls its update back in place and steps again, clipped.

Both give the weights of one process running clipped SGD on the whole batch; the second lets every
rank start its next step without waiting for the others. Plain SGD (``p -= lr * c * g``) keeps the
rollback one line; the paper rolls back Adam in place the same way. Starts processes.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from parallel_lab.pipeline.run import build_executor, plan
from parallel_lab.pipeline.schedules import Schedule
from parallel_lab.pipeline.stages import ModelSpec, reference
from parallel_lab.runtime import launcher

MODES = ("synchronised", "post-validated")
EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_: c = max_norm / (norm + eps)


def clip_coefficient(squared_norm: float, max_norm: float) -> float:
    """The factor clipping multiplies every gradient by: 1, or max_norm / (norm + eps) above it."""
    return min(1.0, max_norm / (math.sqrt(squared_norm) + EPS))


def _step(params, grads, lr: float, c: float, sign: float = 1.0) -> None:
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(sign * lr * c * g)


def _synchronised(params, grads, lr: float, max_norm: float) -> dict:
    total = torch.tensor([sum(float(g.double().pow(2).sum()) for g in grads)], dtype=torch.float64)
    dist.all_reduce(total)
    _step(params, grads, lr, clip_coefficient(float(total), max_norm))
    return {"stepped_early": False, "rolled_back": False}


def _post_validated(params, grads, lr: float, max_norm: float) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    partial = torch.zeros(1, dtype=torch.float64)
    if rank > 0:  # the partial sum of the ranks before, then ours, on to the next
        dist.recv(partial, rank - 1)
    partial += sum(float(g.double().pow(2).sum()) for g in grads)
    if rank < world - 1:
        dist.send(partial, rank + 1)
    early = clip_coefficient(float(partial), max_norm) == 1.0  # else clipping is certain: wait
    if early:
        _step(params, grads, lr, 1.0)
    total = partial.clone()  # the full sum travels back from the last rank
    if rank < world - 1:
        dist.recv(total, rank + 1)
    if rank > 0:
        dist.send(total, rank - 1)
    c = clip_coefficient(float(total), max_norm)
    rolled_back = early and c < 1.0
    if rolled_back:  # validation failed: undo the early step in place, then step clipped
        _step(params, grads, lr, 1.0, sign=-1.0)
    if rolled_back or not early:
        _step(params, grads, lr, c)
    return {"stepped_early": early, "rolled_back": rolled_back}


def clipped_rank(spec: ModelSpec, schedule: Schedule, lr: float, max_norms) -> dict:
    """Rank function: one pipeline step (``executor.Executor``) for this rank's gradients, then for
    each ``max_norm`` and each mode of ``MODES`` the optimizer step on a copy of this rank's weights.
    Returns ``{"rank", "cases": [{mode: {"params": {name: tensor}, "stepped_early", "rolled_back"}}]}``."""
    rank = dist.get_rank()
    ex = build_executor(spec, schedule, rank, check=False)
    x, target = spec.data()
    ex.step(x if rank == schedule.stage_to_rank[0] else None, target if rank == schedule.stage_to_rank[-1] else None)
    named = [(name, p) for w in ex.workers.values() for name, p in zip(w.names, w.params)]
    grads = [p.grad.detach().clone() for _, p in named]
    cases = []
    for max_norm in max_norms:
        case = {}
        for mode in MODES:
            params = [p.detach().clone() for _, p in named]
            flags = (_synchronised if mode == "synchronised" else _post_validated)(params, grads, lr, max_norm)
            case[mode] = {"params": {name: p for (name, _), p in zip(named, params)}, **flags}
        cases.append(case)
    return {"rank": rank, "cases": cases}


def one_process(spec: ModelSpec, lr: float, max_norm: float) -> dict:
    """The weights after one clipped SGD step of one process on the whole batch, by global name."""
    pieces, _, _ = spec.pieces()
    weights = {name: p.detach().clone() for name, p in torch.nn.Sequential(*pieces).named_parameters()}
    grads = reference(spec)["grads"]
    c = clip_coefficient(sum(float(g.double().pow(2).sum()) for g in grads.values()), max_norm)
    return {name: weights[name] - lr * c * grads[name] for name in weights}


def run_clipped(schedule: str | Schedule = "zb-h1", ranks: int = 4, microbatches: int = 8,
                max_norms=(1e9, 1e-3), lr: float = 0.1, model: str = "mlp", timeout: float = 60.0) -> dict:
    """Both optimizer steps after one pipeline step of ``schedule`` on its ranks, for each clipping
    threshold of ``max_norms``, against one process. Returns ``{"schedule", "norm" (the global
    gradient norm), "cases": [{"max_norm", "clipped", mode: {"max_param_diff", "stepped_early"
    (ranks), "rolled_back" (ranks)}}]}``."""
    sched, spec = plan(schedule, ranks, microbatches, model)
    for max_norm in max_norms:
        if not max_norm > 0:
            raise ValueError(f"max_norms must be > 0, got {max_norm!r}")
    answers = launcher.run(clipped_rank, sched.n_ranks, kwargs=dict(spec=spec, schedule=sched, lr=lr,
                                                                    max_norms=tuple(max_norms)), timeout=timeout)
    grads = reference(spec)["grads"]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    cases = []
    for k, max_norm in enumerate(max_norms):
        expected = one_process(spec, lr, max_norm)
        case = {"max_norm": max_norm, "clipped": clip_coefficient(norm ** 2, max_norm) < 1.0}
        for mode in MODES:
            got = {name: p for a in answers for name, p in a["cases"][k][mode]["params"].items()}
            case[mode] = {
                "max_param_diff": max(float((got[n] - expected[n]).abs().max()) for n in expected),
                "stepped_early": [a["rank"] for a in answers if a["cases"][k][mode]["stepped_early"]],
                "rolled_back": [a["rank"] for a in answers if a["cases"][k][mode]["rolled_back"]]}
        cases.append(case)
    return {"schedule": sched.name, "norm": norm, "cases": cases}
