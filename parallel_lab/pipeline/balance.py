"""Balancing pipeline stages: cut a model at given boundaries, run it for real, and see the bubble.

    from parallel_lab.pipeline import balance, partition
    spec = balance.spec(vocab=2048, layers=6)             # a GPT whose LM head is heavy
    parts = [0, 2, 4, 6, 8]                               # DeepSpeed's ``parts``: stage s holds
                                                          # pieces parts[s] .. parts[s+1]-1
    result = balance.run_cut(spec, parts, "1f1b", 8)      # the run_pipeline dict, on real ranks
    result["max_grad_diff"], result["bubble_measured"]

    layer_f = [1, 2, 2, 2, 2, 2, 4]                       # forward cost per layer (backward: 2x)
    balance.stage_costs(layer_f, [0, 3, 4, 5, 7])         # per-stage Costs for the simulator
    balance.bubble_curves(layer_f, {"even": [0, 3, 4, 5, 7], "balanced": [0, 2, 4, 6, 7]}, [1, 8, 64])
    balance.limit_bubble([5, 2, 2, 6])                    # 1 - mean/max: what no m can remove

``parallel_lab.pipeline.stages.cut`` always cuts the same way (the GPT's embedding pinned to the
first stage, its head to the last, the transformer blocks spread evenly): the right cut when every
block costs the same and the ends cost nothing. Lesson 09 (lessons/09_balancing_stages.ipynb) needs
any cut, e.g. one from ``parallel_lab.pipeline.partition``; ``stages.cut_at`` builds the stages from
boundaries over *all* pieces (embedding, blocks, head), and ``cut_rank`` is
``pipeline.run.pipeline_rank`` with that cut. Everything else -- the executor, the comparison with
one process, the simulator fed the measured costs, both clocks -- is ``parallel_lab.pipeline``
unchanged.

Why balance at all: in a pipeline every stage waits for the slowest one, so with per-stage costs
``c_s`` a step takes about ``m * max(c)`` plus the fill and drain, and the idle share tends to
``1 - mean(c) / max(c)`` however many micro-batches there are (``limit_bubble``). Micro-batches
shrink the fill-and-drain bubble; only a balanced cut shrinks this one.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab.hardware import PCIE4, Link
from parallel_lab.pipeline import partition, profile
from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.run import STEPS, make_spec, recorded_steps, report
from parallel_lab.pipeline.schedules import Schedule, build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.stages import ModelSpec, bounds, check_parts, check_stages, cut_at
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import launcher

# The lesson's real model: a tiny GPT whose vocabulary makes the LM head (projection to 4096 logits
# and the loss) cost about two transformer blocks, as a 50k-token vocabulary does in a real GPT
# with few layers per stage. Sizes stay small so that 4 ranks run a step in well under a second.
LESSON_GPT = dict(hidden=64, heads=4, seq=16, vocab=4096, layers=5)


def spec(model: str = "gpt", microbatches: int = 8, rows: int = 2, dtype: str = "float64", seed: int = 0,
         **sizes) -> ModelSpec:
    """The ModelSpec of a run: ``LESSON_GPT`` sizes (overridden by ``sizes``), ``rows`` sequences per
    micro-batch. Raises ValueError (naming the values) before anything starts."""
    base = dict(LESSON_GPT) if model == "gpt" else {}
    base.update({k: v for k, v in sizes.items() if v is not None})
    return make_spec(model, microbatches, dtype, seed, batch=rows * microbatches, **base)


def piece_names(spec: ModelSpec) -> list[str]:
    """A short name per piece of ``spec``: ``embed``, ``block 0``, ..., ``head`` (GPT) or ``mlp 0``, ..."""
    if spec.model == "gpt":
        return ["embed", *(f"block {i}" for i in range(spec.layers)), "head"]
    return [f"mlp {i}" for i in range(spec.layers)]


class WithLoss(nn.Module):
    """The last piece followed by the loss, as the last stage runs it: ``x -> loss(piece(x), target)``.
    The loss is real work (a softmax over the whole vocabulary for the GPT) that a per-layer profile
    of the model alone would miss."""

    def __init__(self, piece: nn.Module, loss_fn, target: torch.Tensor):
        super().__init__()
        self.piece, self.loss_fn, self.target = piece, loss_fn, target

    def forward(self, x):
        return self.loss_fn(self.piece(x), self.target)


def profile_pieces(spec: ModelSpec, microbatches: int = 8, repeats: int = 5) -> list:
    """``parallel_lab.pipeline.profile.profile_layers`` of the pieces a pipeline of ``spec`` cuts, on one
    micro-batch (``spec.batch / microbatches`` rows), in ``spec``'s dtype, the loss included in the
    last piece (``WithLoss``): one ``LayerProfile`` per piece, ready for ``partition(..., "time")``."""
    pieces, _, _ = spec.pieces()
    x, target = spec.data()
    rows = spec.batch // microbatches
    pieces = pieces[:-1] + [WithLoss(pieces[-1], spec.loss, target[:rows])]
    return profile.profile_layers(pieces, x[:rows], repeats=repeats)


def cut_rank(spec: ModelSpec, schedule: Schedule, parts: Sequence[int], link: Link = PCIE4,
             warmup: int = 1, steps: int = STEPS) -> dict:
    """Rank function: ``pipeline.run.pipeline_rank`` with the stages cut at ``parts``. Runs
    ``warmup`` unrecorded steps, then ``steps`` recorded ones (``pipeline.run.recorded_steps``:
    the records of the one with the median makespan on the virtual clock, every step's for the
    costs)."""
    rank = dist.get_rank()
    mine = {s for s, r in enumerate(schedule.stage_to_rank) if r == rank}
    stages = {st.index: st for st in cut_at(spec, parts, keep=mine) if st is not None}
    ex = Executor(schedule, stages, spec, rank, link=link, check=False)  # run_cut validated it
    out = recorded_steps(ex, *spec.data(), warmup=warmup, steps=steps)
    return {"rank": rank, **out,
            "grads": {name: p.grad for w in ex.workers.values() for name, p in zip(w.names, w.params)}}


def run_cut(spec: ModelSpec, parts: Sequence[int], schedule: str = "1f1b", microbatches: int = 8,
            link: Link = PCIE4, warmup: int = 1, steps: int = STEPS, timeout: float = 60.0) -> dict:
    """Run ``schedule`` on ``len(parts) - 1`` ranks with the model cut at ``parts``; returns the
    ``parallel_lab.pipeline.run.run_pipeline`` dict (``max_grad_diff``, ``loss_diff`` against one
    process, ``bubble_measured`` on the virtual clock, ``bubble_predicted``, ``costs`` per stage,
    ``timeline``, ...) plus ``parts``. ``spec.batch`` must split into ``microbatches`` equal rows."""
    pieces, _, _ = spec.pieces()
    parts = check_parts(parts, len(pieces))
    n_stages = len(parts) - 1
    launch = launcher.prepare(cut_rank, n_stages, timeout=timeout)  # before the schedule is built
    if spec.batch % microbatches:
        raise ValueError(f"batch {spec.batch} is not divisible by microbatches {microbatches}")
    sched = validate(build(schedule, n_stages, microbatches))
    if sched.n_stages != n_stages:
        raise ValueError(f"{schedule} runs {sched.n_stages} model stages on {n_stages} ranks; a cut at "
                         f"parts gives one stage per rank (use a schedule with one stage per rank)")
    kwargs = dict(spec=spec, schedule=sched, parts=parts, link=link, warmup=warmup, steps=steps)
    ranks = launcher.start(launch, kwargs=kwargs)
    return {**report(sched, spec, ranks, link=link), "parts": parts}


# ----------------------------------------------------------------------------------------------
# The arithmetic of imbalance (pure: no process).


def stage_costs(layer_f: Sequence[float], parts: Sequence[int], layer_b: Sequence[float] | None = None,
                backward: float = 2.0) -> Costs:
    """Simulator costs of the stages of ``parts``: per stage, the sum of its layers' forward costs
    ``layer_f`` and backward costs ``layer_b`` (default ``backward`` x forward)."""
    parts = check_parts(parts, len(layer_f))
    b = [backward * f for f in layer_f] if layer_b is None else list(layer_b)
    return Costs(F=partition.stage_loads(layer_f, parts), B=partition.stage_loads(b, parts))


def _numbers(values) -> list[float]:
    """A list of floats from a sequence or a comma-separated string ("3, 4, 4, 7": quiz banks pass
    parameters as hashable values, and a YAML list is not one)."""
    if isinstance(values, str):
        values = values.split(",")
    return [float(x) for x in values]


def limit_bubble(loads) -> float:
    """The bubble fraction that stage loads ``loads`` leave however many micro-batches run:
    ``1 - mean / max`` (every stage idles while it waits for the slowest)."""
    loads = _numbers(loads)
    if not loads or min(loads) <= 0:
        raise ValueError(f"loads must be positive numbers, got {loads}")
    return 1.0 - sum(loads) / len(loads) / max(loads)


def bubble_curves(layer_f: Sequence[float], cuts: Mapping[str, Sequence[int]], microbatches: Sequence[int],
                  schedule: str = "1f1b", layer_b: Sequence[float] | None = None) -> dict:
    """Simulated bubble fraction for each cut (name -> parts) and each micro-batch count:
    ``{name: [bubble at m for m in microbatches]}``."""
    out = {}
    for name, parts in cuts.items():
        costs = stage_costs(layer_f, parts, layer_b)
        out[name] = [simulate(build(schedule, len(parts) - 1, m), costs).bubble_fraction for m in microbatches]
    return out


def bubble_with_stage_costs(loads, microbatches: int, schedule: str = "1f1b", backward: float = 2.0) -> float:
    """Simulated bubble fraction of ``schedule`` on ``len(loads)`` stages whose forward costs are
    ``loads`` (backward ``backward`` x forward), free links. Quiz answers use it."""
    loads = _numbers(loads)
    costs = Costs(F=loads, B=[backward * x for x in loads])
    return simulate(build(schedule, len(loads), int(microbatches)), costs).bubble_fraction


def min_bottleneck(weights, stages: int) -> float:
    """The lightest possible heaviest stage when ``weights`` are cut into ``stages`` contiguous
    stages (``partition.balanced``). Quiz answers use it."""
    weights = _numbers(weights)
    parts = partition.balanced(weights, int(stages))
    return max(partition.stage_loads(weights, parts))


def step_speedup(loads_before, loads_after, microbatches: int, schedule: str = "1f1b") -> float:
    """How many times faster a step gets when the stage loads change from ``loads_before`` to
    ``loads_after`` (simulated makespans, backward = 2 x forward)."""
    def makespan(loads):
        loads = _numbers(loads)
        costs = Costs(F=loads, B=[2.0 * x for x in loads])
        return simulate(build(schedule, len(loads), int(microbatches)), costs).makespan
    return makespan(loads_before) / makespan(loads_after)


# ----------------------------------------------------------------------------------------------
# What lesson 09 prints and draws.


def default_parts(spec: ModelSpec, n_stages: int) -> list[int]:
    """The cut ``pipeline.stages.cut`` makes (and so ``run_pipeline``): the GPT's embedding on the
    first stage, its head on the last, the blocks spread evenly (the first stages get one more)."""
    check_stages(spec, n_stages)
    pieces, head, tail = spec.pieces()
    return [0] + [last for _, last in bounds(len(pieces), head, tail, n_stages)]
