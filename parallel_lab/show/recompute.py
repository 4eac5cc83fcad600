"""Activation recomputation's trade-off (lesson 08, lessons/08_recompute_and_pipedream.ipynb): the
extra compute of each mode (``planning.cost.recompute_overhead``) and the memory it saves, from the
memory model.

    from parallel_lab.show import recompute as rf
    rf.recompute_tradeoff()                              # memory of the busiest GPU per mode

Papers: activation recomputation (Chen et al. 2016; GPipe, Huang et al. 2019), selective
recomputation (Korthikanti et al. 2022).
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _, pad
from parallel_lab.planning import memory, memory_model
from parallel_lab.planning.cost import recompute_overhead
from parallel_lab.show.pipeline import equals_one_process, plain_layout


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


# ----------------------------------------------------------------------------------------------
# Lesson 08's runs on ranks: what recomputation stashes and what it costs.


def stash_table(runs: Mapping) -> str:
    """The table of ``runs`` ({(schedule, recompute): run_pipeline dict}): whether the gradients match
    one process, the peak stash per stage, the peak bytes of the middle stages 1 and 2 (two blocks
    each, nothing else) and the bytes of one stashed micro-batch there."""
    lines = [pad(_("schedule"), 9) + pad(_("recompute"), 11) + pad(_("gradients match"), 17)
             + pad(_("peak stash per stage"), 23) + pad(_("peak bytes, stages 1-2"), 24)
             + _("bytes per stashed micro-batch")]
    for (name, recompute), r in runs.items():
        middle = r["peak_bytes"][1:3]
        per_mb = sorted({b // n for b, n in zip(middle, r["peak_activations"][1:3])})
        exact = equals_one_process(r)
        lines.append(f"{name:<8} {str(recompute):<10} {str(exact):<16} {str(r['peak_activations']):<22} "
                     f"{str(middle):<23} {per_mb}")
    return "\n".join(lines)


def stash_change(plain: Mapping, recomputed: Mapping) -> str:
    """"smaller" when recomputation kept the number of stashed micro-batches and shrank their bytes
    (two run_pipeline dicts of one schedule), "fewer" when it stashed fewer micro-batches."""
    if recomputed["peak_activations"] != plain["peak_activations"]:
        return "fewer"
    return "smaller" if max(recomputed["peak_bytes"]) < max(plain["peak_bytes"]) else "neither"


def step_text(plain, recomputed) -> str:
    """Two simulated timelines of one schedule, without and with recomputation: the step, its ratio
    and the bubble of each."""
    return _("step {a:g} time units without recomputation, {b:g} with it: {ratio:.3g} times as long; "
             "bubble {x:.1%} and {y:.1%}").format(a=plain.makespan, b=recomputed.makespan,
                                                  ratio=recomputed.makespan / plain.makespan,
                                                  x=plain.bubble_fraction, y=recomputed.bubble_fraction)


def measured_costs(plain: Mapping, recomputed: Mapping) -> dict:
    """Medians over the stages of the measured per-stage costs (seconds) of two run_pipeline dicts of
    one schedule: ``F``, ``B`` without recomputation, ``B_recompute``, and ``extra_in_F``, what
    recomputation added to B in units of F."""
    f, b, b_rc = (statistics.median(c) for c in (plain["costs"]["F"], plain["costs"]["B"],
                                                  recomputed["costs"]["B"]))
    return {"F": f, "B": b, "B_recompute": b_rc, "extra_in_F": (b_rc - b) / f}


def measured_text(name: str, plain: Mapping, recomputed: Mapping) -> str:
    """One schedule's measured costs (medians over the stages) with and without recomputation."""
    c = measured_costs(plain, recomputed)
    return _("{name}: median F {f:.0f} µs, B {b:.0f} µs; B with recomputation {rc:.0f} µs: {extra:.2f} F "
             "more").format(name=name, f=1e6 * c["F"], b=1e6 * c["B"], rc=1e6 * c["B_recompute"],
                            extra=c["extra_in_F"])


def overhead_text(model: memory.ModelConfig | str = "GPT-3 175B") -> str:
    """The extra compute per step of each recompute mode (``planning.cost.recompute_overhead``)."""
    m = memory.MODELS[model] if isinstance(model, str) else model
    return "\n".join(_("{mode} extra compute per step: {overhead:6.1%}").format(
        mode=pad(mode, 9), overhead=recompute_overhead(m, mode)) for mode in ("none", "selective", "full"))
