"""Cutting a model's layers into pipeline stages: DeepSpeed's methods and an exact time balance.

    from parallel_lab import models
    from parallel_lab.pipeline import partition
    layers = models.GPT(models.GPTConfig(layers=6)).as_sequential()   # embed, 6 blocks, head
    partition.partition(layers, 4, "uniform")       # [0, 2, 4, 6, 8]: stage s holds layers b[s]..b[s+1]-1
    partition.partition(layers, 4, "parameters")    # balanced by trainable parameter count
    partition.partition(layers, 4, "type:block")    # balanced by count of layers whose class matches
    partition.by_time(profile_records, 4)           # balanced by measured fwd + bwd time

A partition is DeepSpeed's ``parts`` list: ``stages + 1`` increasing boundaries from 0 to the number
of layers; stage ``s`` holds layers ``parts[s]`` up to ``parts[s+1] - 1``.

The methods are those of DeepSpeed's ``PipelineModule(partition_method=...)``
(``deepspeed/runtime/pipe/module.py``, ``_partition_layers``):

- ``uniform``: the same number of layers per stage; the first ``layers % stages`` stages get one
  more (``ds_utils.partition_uniform``).
- ``parameters``: weight each layer by its trainable parameters (``requires_grad``; a layer without
  parameters, or a plain function, weighs 0), then balance the weights.
- ``type:REGEX``: weight 1 for each layer whose class name matches ``REGEX`` (``re.search``, case
  insensitive), 0 otherwise, then balance -- ``type:transformer`` spreads the transformer blocks.

Two deliberate differences, both for a clearer lesson: DeepSpeed gives empty stages when there are
more stages than layers, and we refuse (a stage without layers is a configuration error); and
DeepSpeed's current ``partition_balanced`` minimises (heaviest - lightest stage) with a heuristic
dynamic programme, whereas ``balanced`` here minimises the heaviest stage exactly -- the quantity
that paces a pipeline (every stage waits for the slowest, so step time is m x the bottleneck plus
the bubble). DeepSpeed's earlier releases searched for the same bottleneck by bisection.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from torch import nn

from parallel_lab.checks import positive_int

METHODS = ("uniform", "parameters", "type:<regex>", "time")


def _check_stages(n_layers: int, stages) -> int:
    positive_int("stages", stages)
    if n_layers < 1:
        raise ValueError("cannot partition an empty list of layers")
    if stages > n_layers:
        raise ValueError(f"stages {stages} > layers {n_layers}: every stage needs at least one layer")
    return int(stages)


def uniform(n_layers: int, stages: int) -> list[int]:
    """Boundaries giving ``n_layers // stages`` layers per stage, one more for the first
    ``n_layers % stages`` stages (DeepSpeed's ``partition_uniform``)."""
    stages = _check_stages(n_layers, stages)
    size, extra = divmod(n_layers, stages)
    parts = [0]
    for s in range(stages):
        parts.append(parts[-1] + size + (s < extra))
    return parts


def stage_loads(weights: Sequence[float], parts: Sequence[int]) -> list[float]:
    """Total weight of each stage of partition ``parts``."""
    return [float(sum(weights[a:b])) for a, b in zip(parts[:-1], parts[1:])]


def _check_weights(weights) -> np.ndarray:
    w = np.asarray(list(weights), dtype=float)
    if w.ndim != 1 or not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be a list of finite numbers, got {list(weights)!r}")
    if np.any(w < 0):
        raise ValueError(f"weights must be >= 0, got weight {w[w < 0][0]:g} at layer {int(np.argmax(w < 0))}")
    return w


def _stages_needed(prefix: np.ndarray, bottleneck: float) -> int:
    """Fewest contiguous stages whose loads are all <= bottleneck (greedy: each stage as long as it
    can be). ``prefix`` is the exclusive prefix sum; assumes every single weight fits."""
    n, start, count = len(prefix) - 1, 0, 0
    while start < n:
        start, count = max(_furthest(prefix, start, bottleneck), start + 1), count + 1
    return count


def _furthest(prefix: np.ndarray, start: int, bottleneck: float) -> int:
    """The largest ``end`` with ``prefix[end] - prefix[start] <= bottleneck``. Loads are computed as
    that same difference everywhere (candidates too), so comparisons are exact in floating point."""
    loads = prefix[start:] - prefix[start]  # non-decreasing: weights are >= 0
    return start + int(np.searchsorted(loads, bottleneck, side="right")) - 1


def balanced(weights: Sequence[float], stages: int) -> list[int]:
    """The contiguous partition of ``weights`` into ``stages`` non-empty stages whose heaviest stage is
    as light as possible (exact: the linear partition problem's min-max form).

    The optimal bottleneck is one of the O(n^2) contiguous segment sums; bisect over them with a
    greedy feasibility test (fewest stages of load <= B), O(n^2 log n). Among optimal partitions the
    one returned makes each stage, from the first, as long as possible.
    """
    w = _check_weights(weights)
    n = len(w)
    stages = _check_stages(n, stages)
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    i, j = np.triu_indices(n + 1, k=1)
    candidates = np.unique(prefix[j] - prefix[i])
    candidates = candidates[candidates >= np.diff(prefix).max()]  # every single layer must fit
    lo, hi = 0, len(candidates) - 1  # the largest candidate (the total) always fits in one stage
    while lo < hi:
        mid = (lo + hi) // 2
        if _stages_needed(prefix, candidates[mid]) <= stages:
            hi = mid
        else:
            lo = mid + 1
    return _cut(prefix, candidates[lo], stages)


def _cut(prefix: np.ndarray, bottleneck: float, stages: int) -> list[int]:
    """Greedy cut with loads <= bottleneck, each stage as long as possible while leaving one layer
    for each later stage (a suffix of a feasible sequence stays feasible, so this never fails)."""
    n, parts = len(prefix) - 1, [0]
    for s in range(stages - 1):
        start = parts[-1]
        end = _furthest(prefix, start, bottleneck)
        parts.append(max(start + 1, min(end, n - (stages - 1 - s))))
    parts.append(n)
    return parts


# ----------------------------------------------------------------------------------------------
# DeepSpeed's weights.


def _layer_list(layers) -> list:
    if hasattr(layers, "as_sequential"):
        layers = layers.as_sequential()
    return list(layers)


def parameter_counts(layers) -> list[int]:
    """Trainable parameters per layer; a layer that is not an nn.Module (a function) weighs 0."""
    return [sum(p.numel() for p in layer.parameters() if p.requires_grad) if isinstance(layer, nn.Module) else 0
            for layer in _layer_list(layers)]


def type_matches(layers, regex: str) -> list[int]:
    """1 for each layer whose class name matches ``regex`` (re.search, ignoring case), else 0."""
    pattern = re.compile(regex, re.IGNORECASE)
    names = [type(layer).__name__ if isinstance(layer, nn.Module) else getattr(layer, "__name__", str(layer))
             for layer in _layer_list(layers)]
    return [1 if pattern.search(name) else 0 for name in names]


def by_parameters(layers, stages: int) -> list[int]:
    return balanced(parameter_counts(layers), stages)


def by_type(layers, stages: int, regex: str) -> list[int]:
    weights = type_matches(layers, regex)
    matched = sum(weights)
    if matched < stages:
        classes = sorted({type(layer).__name__ for layer in _layer_list(layers)})
        raise ValueError(f"type:{regex} matches {matched} layer{'s' * (matched != 1)} < stages {stages}: "
                         f"some stage would hold none (layer classes: {', '.join(classes)})")
    return balanced(weights, stages)


def by_time(records, stages: int) -> list[int]:
    """Balance measured time: ``records`` from ``parallel_lab.pipeline.profile.profile_layers`` (forward +
    backward seconds each), or a plain list of per-layer costs."""
    costs = [r.fwd_s + r.bwd_s if hasattr(r, "fwd_s") else r for r in records]
    return balanced(costs, stages)


def partition(layers, stages: int, method: str = "uniform", profile=None) -> list[int]:
    """DeepSpeed's ``partition_method`` by name: ``uniform``, ``parameters``, ``type:REGEX``; plus
    ``time`` (needs ``profile``: the records of ``profile_layers`` for these layers)."""
    layer_list = _layer_list(layers)
    key = method.lower()
    if key == "uniform":
        return uniform(len(layer_list), stages)
    if key == "parameters":
        return by_parameters(layer_list, stages)
    if key.startswith("type:"):
        return by_type(layer_list, stages, method.split(":", 1)[1])
    if key == "time":
        if profile is None:
            raise ValueError("method 'time' needs profile= (records from parallel_lab.pipeline.profile.profile_layers)")
        if len(profile) != len(layer_list):
            raise ValueError(f"profile has {len(profile)} records, the model has {len(layer_list)} layers")
        return by_time(profile, stages)
    raise ValueError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")


def describe(parts: Sequence[int], names: Sequence[str], weights: Sequence[float] | None = None) -> str:
    """One line per stage: its layers by name (and its load when ``weights`` are given)."""
    from parallel_lab.i18n import _

    lines = []
    for s, (a, b) in enumerate(zip(parts[:-1], parts[1:])):
        load = "  " + _("load {load:.4g}").format(load=sum(weights[a:b])) if weights is not None else ""
        lines.append(_("stage {s}: layers {a}..{b} ({names}){load}").format(
            s=s, a=a, b=b - 1, names=", ".join(names[a:b]), load=load))
    return "\n".join(lines)
