"""PipeDream: asynchronous 1F1B with weight stashing, against the flushed schedule.

PipeDream (Narayanan et al. 2019, "PipeDream: Generalized Pipeline Parallelism for DNN Training",
SOSP) never drains the pipeline: every stage alternates one forward and one backward forever and
applies an SGD update after each backward. Stage s then runs the forward of microbatch j with
weights that are p-1-s updates older than the ones current at its backward. Three modes, all 1F1B
on p ranks with one stage each (``schedules.one_f_one_b``), on the same data, all walked by the one
``executor.Executor`` (the asynchronous ones as one step of all ``steps * m`` microbatches, whose
worker, ``AsyncStage``, updates after every backward):

    "no-stash"  the backward differentiates whatever weights are current (updated in place), with
                activations the forward computed from older weights: forward and backward see
                different versions, and the update is not the gradient of any single model
    "stash"     weight stashing: a stage keeps every weight version still used by a microbatch in
                flight, and the backward uses the version its forward used (the gradient is exact
                for a model whose stages sit at different versions, as ``replay_stashed`` replays)
    "flush"     PipeDream-Flush / 1F1B (Narayanan et al. 2021): gradients of the m microbatches of
                a step accumulate, the pipeline drains, then one update: synchronous SGD exactly

    from parallel_lab.pipeline.pipedream import compare_modes
    out = compare_modes(stages=4, steps=3, microbatches=4)
    out["no-stash"]["staleness"]        # per stage, backward version - forward version per microbatch
    out["stash"]["diff_vs_replay"]      # ~1e-16: exactly PipeDream's weight-stashing semantics
    out["flush"]["diff_vs_sync_sgd"]    # ~1e-16: the flushed schedule is synchronous SGD
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.schedules import Schedule, one_f_one_b
from parallel_lab.pipeline.stages import ModelSpec, cut
from parallel_lab.pipeline.validate import validate
from parallel_lab.pipeline.worker import StageWorker
from parallel_lab.runtime import launcher

MODES = ("no-stash", "stash", "flush")
# Lesson 08 prints this method (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("AsyncStage._update",)


def _microbatches(spec: ModelSpec, steps: int, m: int):
    """``steps * m`` (x, target) microbatches: step t is rows t*batch .. (t+1)*batch of one draw."""
    x, target = spec.replace(batch=spec.batch * steps).data()
    return list(x.chunk(steps * m)), list(target.chunk(steps * m))


class Weights:
    """One weight version: ``tensors`` (leaves) and ``number``, how many updates made it."""

    def __init__(self, tensors, number: int = 0):
        self.tensors, self.number = tensors, number


class AsyncStage(StageWorker):
    """One stage of asynchronous 1F1B, the worker the Executor runs for PipeDream (its ``worker``
    hook): SGD after every backward, with or without weight stashing. Arguments as StageWorker's,
    plus ``lr`` and ``stash``; each microbatch is a minibatch, with its own mean loss (no 1/m), and
    a backward is one ``autograd.grad`` (asynchronous 1F1B has neither recompute nor split backward)."""

    def __init__(self, stage, loss_fn, n_microbatches: int, first: bool, last: bool, recompute: bool = False,
                 split: bool = False, fuse: bool = True, *, lr: float, stash: bool):
        if recompute or split:
            raise ValueError(f"asynchronous 1F1B runs plain F and B: got recompute {recompute}, split {split}")
        super().__init__(stage, loss_fn, n_microbatches, first, last, fuse=False)
        self.local = [name for name, _ in stage.module.named_parameters()]
        self.lr, self.stashing = lr, stash
        self.current = Weights([p.detach().clone().requires_grad_() for p in stage.module.parameters()])
        self.versions: list[tuple[int, int, int]] = []  # (microbatch, forward version, backward version)
        self.peak_versions = 1

    def forward(self, j: int, x, target=None):
        if not self.first:
            x.requires_grad_()
        w = self.current
        out = functional_call(self.module, dict(zip(self.local, w.tensors)), (x,))
        if self.last:
            out = self.loss_fn(out, target)  # each microbatch is a minibatch: its own mean loss
        self.stash[j] = (x, out, w, w.number)
        held = {id(v) for _, _, v, _ in self.stash.values()} | {id(self.current)}
        self.peak_versions = max(self.peak_versions, len(held))
        return out.detach()

    def backward(self, j: int, grad):
        x, out, w, forward_version = self.stash.pop(j)
        # Without stashing, w is the one Weights object updated in place, so w.number (and what
        # autograd's saved weights hold) is the latest version; with stashing, the one F used.
        self.versions.append((j, forward_version, w.number))
        wanted = ([] if self.first else [x]) + list(w.tensors)
        grads = torch.autograd.grad(out, wanted, grad)
        dx, grads = (None, grads) if self.first else (grads[0], grads[1:])
        self._update(grads)
        return dx

    @torch.no_grad()
    def _update(self, grads) -> None:
        """W_{k+1} = W_k - lr * g (PipeDream applies every gradient to the *current* weights)."""
        w = self.current
        if self.stashing:  # a new version; the old one lives on while a microbatch in flight uses it
            self.current = Weights([(t - self.lr * g).requires_grad_() for t, g in zip(w.tensors, grads)],
                                   w.number + 1)
        else:  # in place behind autograd's back (.data): graphs of microbatches in flight see it
            for t, g in zip(w.tensors, grads):
                t.data.sub_(self.lr * g)
            w.number += 1

    def weights(self) -> dict:
        return {name: t.detach().clone() for name, t in zip(self.names, self.current.tensors)}


def _async_rank(spec: ModelSpec, steps: int, schedule: Schedule, lr: float, stash: bool) -> dict:
    """Asynchronous 1F1B over all ``steps * m`` microbatches with no flush (one stage per rank): one
    Executor step of ``schedule`` (1F1B of all ``steps * m``), whose workers update after every backward."""
    rank, p = dist.get_rank(), dist.get_world_size()
    whole = spec.replace(batch=spec.batch * steps)  # the microbatches of every step, in one walk
    stage = cut(spec, p, keep={rank})[rank]
    ex = Executor(schedule, {rank: stage}, whole, rank, check=False,  # compare_modes validated it
                  worker=functools.partial(AsyncStage, lr=lr, stash=stash))
    ex.step(*whole.data())
    w = ex.workers[rank]
    return {"stage": rank, "weights": w.weights(), "versions": w.versions, "peak_versions": w.peak_versions}


def _flush_rank(spec: ModelSpec, steps: int, schedule: Schedule, lr: float) -> dict:
    """1F1B with a flush per step (the Executor running ``schedule``, 1F1B of one step's ``m``
    microbatches), one SGD update per step on the mean gradient."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), schedule.n_microbatches
    stage = cut(spec, p, keep={rank})[rank]
    ex = Executor(schedule, {rank: stage}, spec, rank, check=False)  # compare_modes validated it
    x, target = spec.replace(batch=spec.batch * steps).data()
    for t in range(steps):
        rows = slice(t * spec.batch, (t + 1) * spec.batch)
        ex.step(x[rows], target[rows])
        with torch.no_grad():
            for param in stage.module.parameters():
                param -= lr * param.grad
        ex.zero_grad()
    versions = [(t * m + j, t, t) for t in range(steps) for j in range(m)]  # all of step t use version t
    return {"stage": rank, "versions": versions, "peak_versions": 1,
            "weights": {name: q.detach().clone() for name, q in zip(stage.names, stage.module.parameters())}}


def pipedream_rank(spec: ModelSpec, steps: int, schedules: dict, lr: float, modes=MODES) -> dict:
    """Rank function: every mode in ``modes`` on this rank's stage, from the same initial weights.
    ``schedules``: the validated 1F1B schedules ``compare_modes`` built, ``"async"`` over all
    ``steps * m`` microbatches and ``"flush"`` over one step's ``m``."""
    run = {"no-stash": lambda: _async_rank(spec, steps, schedules["async"], lr, stash=False),
           "stash": lambda: _async_rank(spec, steps, schedules["async"], lr, stash=True),
           "flush": lambda: _flush_rank(spec, steps, schedules["flush"], lr)}
    return {mode: run[mode]() for mode in modes}


# ----------------------------------------------------------------------------------------------
# Single-process references.


def sync_sgd(spec: ModelSpec, steps: int, lr: float) -> dict:
    """Synchronous SGD on one process: ``steps`` updates on the whole batch's mean loss."""
    pieces, _, _ = spec.pieces()
    model = nn.Sequential(*pieces)
    x, target = spec.replace(batch=spec.batch * steps).data()
    for t in range(steps):
        rows = slice(t * spec.batch, (t + 1) * spec.batch)
        model.zero_grad()
        spec.loss(model(x[rows]), target[rows]).backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= lr * param.grad
    return {name: q.detach() for name, q in model.named_parameters()}


def forward_versions(p: int, n: int) -> list[list[int]]:
    """``v[s][j]``: the weight version stage s uses for microbatch j's forward in asynchronous 1F1B,
    i.e. how many backwards (= updates) stage s runs before F of j, read off the schedule."""
    versions = []
    for actions in one_f_one_b(p, n).ranks:
        done, row = 0, [0] * n
        for a in actions:
            if a.kind == "F":
                row[a.microbatch] = done
            else:
                done += 1
        versions.append(row)
    return versions


def replay_stashed(spec: ModelSpec, p: int, steps: int, m: int, lr: float) -> dict:
    """PipeDream with weight stashing, replayed on one process: microbatch j's gradient is that of
    the model whose stage s sits at version ``forward_versions[s][j]``; stage s then applies it to
    its current weights, in microbatch order (1F1B runs a stage's backwards in that order)."""
    stages = cut(spec, p)
    history = [[[q.detach().clone() for q in st.module.parameters()]] for st in stages]
    local = [[name for name, _ in st.module.named_parameters()] for st in stages]
    used = forward_versions(p, steps * m)
    xs, targets = _microbatches(spec, steps, m)
    for j in range(steps * m):
        weights = [[t.clone().requires_grad_() for t in history[s][used[s][j]]] for s in range(p)]
        h = xs[j]
        for s, st in enumerate(stages):
            h = functional_call(st.module, dict(zip(local[s], weights[s])), (h,))
        grads = torch.autograd.grad(spec.loss(h, targets[j]), [t for w in weights for t in w])
        k = 0
        for s in range(p):
            n = len(weights[s])
            history[s].append([t - lr * g for t, g in zip(history[s][-1], grads[k:k + n])])
            k += n
    return {name: t for s, st in enumerate(stages) for name, t in zip(st.names, history[s][-1])}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in b)


def compare_modes(stages: int = 4, steps: int = 3, microbatches: int = 4, lr: float = 0.1,
                  spec: ModelSpec | None = None, timeout: float = 60.0) -> dict:
    """Run the three modes on ``stages`` ranks and compare them with the references.

    Returns per mode: ``versions`` (per stage, [microbatch, forward version, backward version]),
    ``staleness`` (per stage, backward - forward version per microbatch), ``peak_versions`` (weight
    versions a stage holds at once), ``diff_vs_sync_sgd`` and ``diff_vs_replay`` (largest weight
    difference from synchronous SGD and from the weight-stashing replay).
    """
    spec = spec or ModelSpec("mlp", hidden=16, layers=stages, batch=4 * microbatches)
    if spec.batch % microbatches:
        raise ValueError(f"batch {spec.batch} is not divisible by microbatches {microbatches}")
    cut(spec, stages)  # raises when there are more stages than layers, before any process starts
    # built and validated once, here: the ranks run these very schedules, so they cannot disagree
    schedules = {"async": validate(one_f_one_b(stages, steps * microbatches)),
                 "flush": validate(one_f_one_b(stages, microbatches))}
    per_rank = launcher.run(pipedream_rank, stages, args=(spec, steps, schedules, lr), timeout=timeout)
    sgd, replay = sync_sgd(spec, steps, lr), replay_stashed(spec, stages, steps, microbatches, lr)
    out = {}
    for mode in MODES:
        ranks = [r[mode] for r in per_rank]
        weights = {k: v for r in ranks for k, v in r["weights"].items()}
        out[mode] = {
            "versions": [r["versions"] for r in ranks],
            "staleness": [[b - f for _, f, b in r["versions"]] for r in ranks],
            "peak_versions": [r["peak_versions"] for r in ranks],
            "diff_vs_sync_sgd": _max_diff(weights, sgd),
            "diff_vs_replay": _max_diff(weights, replay),
        }
    return out


# ----------------------------------------------------------------------------------------------
# Weight versions read off the schedule (no processes): what lesson 08 and its quiz compare with.


def expected_versions(stages: int, steps: int, microbatches: int) -> dict:
    """The weight versions of ``pipedream.compare_modes``, read off the schedule (no processes):
    per mode, per stage, ``(microbatch, forward version, backward version)``.

    Asynchronous 1F1B updates a stage after each of its backwards, which it runs in microbatch
    order, so B of microbatch j sees j updates when nothing is stashed; F of j sees the backwards
    that came before it (``forward_versions``). Stashing makes B use F's version. The flushed
    schedule updates once per step: step t's microbatches all use version t."""
    n = steps * microbatches
    fwd = forward_versions(stages, n)
    return {
        "no-stash": [[(j, fwd[s][j], j) for j in range(n)] for s in range(stages)],
        "stash": [[(j, fwd[s][j], fwd[s][j]) for j in range(n)] for s in range(stages)],
        "flush": [[(j, j // microbatches, j // microbatches) for j in range(n)] for s in range(stages)],
    }


def staleness(stages: int, stage: int) -> float:
    """Updates stage ``stage`` applies between a microbatch's forward and its backward in the steady
    state of asynchronous 1F1B: p - 1 - s (read off the schedule, as in ``expected_versions``)."""
    n = 2 * stages + 1  # past the warm-up
    forward, backward = expected_versions(stages, 1, n)["no-stash"][stage][-1][1:]
    return float(backward - forward)


def stashed_versions(stages: int, stage: int, microbatches: int | None = None) -> float:
    """Most weight versions stage ``stage`` holds at once with weight stashing: the current one and
    every older one a microbatch in flight still needs (p - s once the pipeline is full). Walks
    the 1F1B order of the stage, as ``pipedream.AsyncStage`` does on a rank."""
    n = microbatches or 2 * stages + 1
    current, inflight, peak = 0, {}, 1
    for a in one_f_one_b(stages, n).ranks[stage]:
        if a.kind == "F":
            inflight[a.microbatch] = current
            peak = max(peak, len(set(inflight.values()) | {current}))
        else:
            inflight.pop(a.microbatch)
            current += 1
    return float(peak)
