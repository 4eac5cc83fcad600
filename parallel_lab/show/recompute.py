"""Activation recomputation's trade-off (lesson 08, lessons/08_recompute_and_pipedream.ipynb): the
extra compute of each mode (``planning.cost.recompute_overhead``) and the memory it saves, from the
memory model.

    from parallel_lab.show import recompute as rf
    rf.recompute_tradeoff()                              # memory of the busiest GPU per mode

Papers: activation recomputation (Chen et al. 2016; GPipe, Huang et al. 2019), selective
recomputation (Korthikanti et al. 2022).
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _
from parallel_lab.planning import memory, memory_model
from parallel_lab.planning.cost import recompute_overhead
from parallel_lab.show.pipeline import plain_layout


def recompute_points(model: memory.ModelConfig | str = "GPT-3 175B", micro_batches: Sequence[int] = (1, 2, 4),
                     **mesh) -> list[dict]:
    """Per micro-batch size and recompute mode: ``micro_batch``, ``recompute``, ``overhead``
    (fraction), ``activations_gb`` and ``total_gb`` on the busiest GPU
    (``memory_model.max_device_memory`` with ``mesh``: pp, tp, schedule, microbatches, ...)."""
    m = memory.MODELS[model] if isinstance(model, str) else model
    mesh = {"pp": 8, "tp": 8, "schedule": "1f1b", "microbatches": 64, **mesh}
    points = []
    for b in micro_batches:
        for mode in memory_model.RECOMPUTE:
            row = memory_model.max_device_memory(m, micro_batch=b, recompute=mode, **mesh)
            points.append({"micro_batch": b, "recompute": mode, "overhead": recompute_overhead(m, mode),
                           "activations_gb": row["activations"] / memory.GB, "total_gb": row["total"] / memory.GB})
    return points


def recompute_tradeoff(model: memory.ModelConfig | str = "GPT-3 175B", micro_batches: Sequence[int] = (1, 2, 4),
                       gpu_gb: float = 80, **mesh):
    """Memory of the busiest GPU for each recompute mode (none, selective, full; the axis says the
    extra compute each costs), one bar per micro-batch size; the dashed line is the GPU's memory."""
    m = memory.MODELS[model] if isinstance(model, str) else model
    points = recompute_points(m, micro_batches, **mesh)
    names = {q["recompute"]: _("{mode}<br>+{overhead:.1%} compute").format(mode=q["recompute"], overhead=q["overhead"])
             for q in points}
    traces = []
    for b in micro_batches:
        mine = [q for q in points if q["micro_batch"] == b]
        traces.append(go.Bar(
            x=[names[q["recompute"]] for q in mine], y=[round(q["total_gb"], 1) for q in mine],
            text=[f"{q['total_gb']:.0f}" for q in mine], textposition="outside",
            name=_("micro-batch {b}").format(b=b), hovertemplate="%{x}: %{y} GB<extra></extra>"))
    fig = go.Figure(traces)
    fig.add_hline(y=gpu_gb, line=dict(color="#b00", dash="dash", width=1))
    mesh = {"pp": 8, "tp": 8, "microbatches": 64, **mesh}
    fig.update_layout(**plain_layout(
        height=360, barmode="group", xaxis_title=_("activation recomputation (and its extra compute per step)"),
        yaxis_title=_("memory of the busiest GPU (GB)"),
        title=_("{model}, TP={tp} × PP={pp}, 1F1B, m={m} (dashed: a {gpu:g} GB GPU)").format(
            model=m.name, tp=mesh["tp"], pp=mesh["pp"], m=mesh["microbatches"], gpu=gpu_gb)))
    fig.update_yaxes(rangemode="tozero")
    return fig
