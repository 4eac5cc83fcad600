"""Pictures and tables of the advanced pipeline lessons: schedules compared, recomputation's
trade-off, and PipeDream's weight versions.

    from parallel_lab.pipeline import pipedream_figures as pf
    print(pf.schedule_table(pf.compare_schedules()))   # bubble, memory, messages per schedule
    pf.bubble_curves(stages=4)                          # bubble fraction against m, simulated
    pf.recompute_tradeoff()                             # memory against extra compute (memory model)
    out = pipedream.compare_modes(stages=4, steps=3, microbatches=4)
    pf.versions_figure(out)                             # weight version of every F and B

Lessons: lessons/06_interleaving_zero_bubble.ipynb (the first two) and
lessons/07_recompute_and_pipedream.ipynb (the last two). Everything here is computed from integers
(schedules, the simulator with unit costs, the memory model, weight-version counts), so every
figure is deterministic and nbval compares it; the Gantt charts themselves are ``figures``'.

Papers: interleaved 1F1B (Narayanan et al. 2021, SC), ZB-H1 and ZB-V (Qi et al. 2023, "Zero Bubble
Pipeline Parallelism"), activation recomputation (Chen et al. 2016; GPipe, Huang et al. 2019;
selective recomputation, Korthikanti et al. 2022), PipeDream (Narayanan et al. 2019, SOSP).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from parallel_lab import memory, memory_model
from parallel_lab.schedules import build, communication
from parallel_lab.simulate import Costs, simulate

from .figures import plain_layout
from .pipedream import MODES, forward_versions

# (schedule, virtual stages per rank) compared in lesson 06; costs per model stage F = I = W = 1
SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2))
UNIT = Costs(F=1, B=2, I=1, W=1)
_COLORS = {"1f1b": "#4c78a8", "interleaved-1f1b": "#54a24b", "zb-h1": "#f58518", "zb-v": "#b279a2"}
_DASHES = ("solid", "dash", "dot")


def label(name: str, virtual: int = 1) -> str:
    """``interleaved-1f1b`` with v = 2 -> ``interleaved-1f1b v=2``; others keep their name."""
    return f"{name} v={virtual}" if name == "interleaved-1f1b" else name


# ----------------------------------------------------------------------------------------------
# Lesson 06: schedules side by side.


def messages(schedule) -> int:
    """Point-to-point messages of one step: every activation and gradient that crosses ranks
    (``schedules.communication``'s sends). 2(p-1)m for 1F1B, 2(pv-1)m interleaved, 2(2p-2)m ZB-V."""
    return sum(1 for ops in communication(schedule).values() for op in ops
               if getattr(op, "op", None) == "send")


def message_count(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """``messages`` of the named schedule (a quiz answer: ``parallel_lab.quiz.bank`` calls it)."""
    return float(messages(build(schedule, stages, microbatches, virtual)))


def compare_schedules(cases: Iterable[tuple[int, int]] = ((4, 8), (4, 16), (8, 16)),
                      schedules: Sequence[tuple[str, int]] = SCHEDULES, costs: Costs = UNIT) -> list[dict]:
    """One row per (p, m) case and schedule, simulated with ``costs`` (per model stage; default
    F = I = W = 1, B = 2): ``schedule``, ``virtual``, ``p``, ``m``, ``bubble`` (idle share of the
    step), ``ratio`` (idle / compute time, the papers' t_bubble / t_ideal), ``peak`` (most
    activations stashed on the busiest rank, in whole-stage units: chunks / v) and ``messages``."""
    rows = []
    for p, m in cases:
        for name, v in schedules:
            schedule = build(name, p, m, v)
            timeline = simulate(schedule, costs)
            bubble = timeline.bubble_fraction
            rows.append({"schedule": name, "virtual": v, "p": p, "m": m, "bubble": bubble,
                         "ratio": bubble / (1 - bubble), "peak": max(timeline.peak_rank_activations) / v,
                         "messages": messages(schedule)})
    return rows


def schedule_table(rows: Sequence[Mapping]) -> str:
    """``compare_schedules`` rows as a text table (numbers rounded for print)."""
    head = (f"{'p':>2} {'m':>3}  {'schedule':<20} {'bubble':>7} {'idle/compute':>13} "
            f"{'peak stash (stages)':>20} {'messages':>9}")
    lines, last = [head, "-" * len(head)], None
    for row in rows:
        if last is not None and (row["p"], row["m"]) != last:
            lines.append("")
        last = (row["p"], row["m"])
        lines.append(f"{row['p']:>2} {row['m']:>3}  {label(row['schedule'], row['virtual']):<20} "
                     f"{row['bubble']:>7.1%} {row['ratio']:>13.3f} {row['peak']:>20g} {row['messages']:>9}")
    return "\n".join(lines)


def bubble_curves(stages: int = 4, microbatches: Sequence[int] = tuple(range(4, 33, 4)),
                  schedules: Sequence[tuple[str, int]] = SCHEDULES + (("interleaved-1f1b", 4),),
                  costs: Costs = UNIT):
    """Simulated bubble fraction against the number of microbatches, one line per schedule."""
    import plotly.graph_objects as go

    traces = []
    for name, v in schedules:
        ms = [m for m in microbatches if name != "interleaved-1f1b" or m % stages == 0]
        bubbles = [round(simulate(build(name, stages, m, v), costs).bubble_fraction, 4) for m in ms]
        traces.append(go.Scatter(x=list(ms), y=bubbles, mode="lines+markers", name=label(name, v),
                                 line=dict(color=_COLORS[name], dash="dot" if v == 4 else "solid")))
    fig = go.Figure(traces)
    fig.update_layout(**plain_layout(height=340, xaxis_title="microbatches m",
                                yaxis_title="bubble (idle share of the step)",
                                title=f"Bubble against microbatches on p={stages} ranks (simulated, F=I=W)"))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(tickvals=list(microbatches))
    return fig


# ----------------------------------------------------------------------------------------------
# Lesson 07: recomputation's trade-off, from the memory model.


def recompute_overhead(model: memory.ModelConfig | str, recompute: str, seq: int | None = None) -> float:
    """Extra compute of a training step with ``recompute``, as a fraction of the step without it
    (FLOPs of the transformer layers; a backward costs two forwards).

    A layer's forward is 24bsh^2 + 4bs^2h FLOPs (Narayanan et al. 2021), the step three times that.
    "full" runs every forward again: 1/3. "selective" (Korthikanti et al. 2022) recomputes only the
    attention core, QK^T and the product with V (4bs^2h): s / (3(6h + s)).
    """
    m = memory.MODELS[model] if isinstance(model, str) else model
    recompute = memory_model._check_recompute(recompute)
    s, h = (m.seq if seq is None else seq), m.hidden
    return {"none": 0.0, "full": 1 / 3, "selective": s / (3 * (6 * h + s))}[recompute]


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
    import plotly.graph_objects as go

    m = memory.MODELS[model] if isinstance(model, str) else model
    points = recompute_points(m, micro_batches, **mesh)
    names = {q["recompute"]: f"{q['recompute']}<br>+{q['overhead']:.1%} compute" for q in points}
    traces = []
    for b in micro_batches:
        mine = [q for q in points if q["micro_batch"] == b]
        traces.append(go.Bar(
            x=[names[q["recompute"]] for q in mine], y=[round(q["total_gb"], 1) for q in mine],
            text=[f"{q['total_gb']:.0f}" for q in mine], textposition="outside", name=f"micro-batch {b}",
            hovertemplate="%{x}: %{y} GB<extra></extra>"))
    fig = go.Figure(traces)
    fig.add_hline(y=gpu_gb, line=dict(color="#b00", dash="dash", width=1))
    mesh = {"pp": 8, "tp": 8, "microbatches": 64, **mesh}
    fig.update_layout(**plain_layout(
        height=360, barmode="group", xaxis_title="activation recomputation (and its extra compute per step)",
        yaxis_title="memory of the busiest GPU (GB)",
        title=f"{m.name}, TP={mesh['tp']} × PP={mesh['pp']}, 1F1B, m={mesh['microbatches']} "
              f"(dashed: a {gpu_gb:g} GB GPU)"))
    fig.update_yaxes(rangemode="tozero")
    return fig


# ----------------------------------------------------------------------------------------------
# Lesson 07: PipeDream's weight versions.


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
    from parallel_lab.schedules import one_f_one_b

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


def _versions(modes: Mapping, mode: str) -> list[list[tuple[int, int, int]]]:
    """Per stage, (microbatch, forward, backward) sorted by microbatch, from a compare_modes dict
    (``out[mode]["versions"]``) or an expected_versions dict (``out[mode]``)."""
    per_stage = modes[mode]["versions"] if isinstance(modes[mode], Mapping) else modes[mode]
    return [sorted(tuple(v) for v in stage) for stage in per_stage]


def versions_text(modes: Mapping, stage: int, modes_shown: Sequence[str] = MODES) -> str:
    """A text table for one stage: per microbatch, the forward and backward weight version of each
    mode (``f/b``; a ``*`` marks a backward that used other weights than its forward)."""
    tables = {mode: _versions(modes, mode)[stage] for mode in modes_shown}
    n = len(next(iter(tables.values())))
    lines = [f"stage {stage}, weight version of F/B per microbatch ('*': B used other weights than F)",
             f"{'microbatch':<12}" + "".join(f"{j:>6}" for j in range(n))]
    for mode, rows in tables.items():
        cells = [f"{f}/{b}{'*' if f != b else ''}" for _, f, b in rows]
        lines.append(f"{mode:<12}" + "".join(f"{c:>6}" for c in cells))
    return "\n".join(lines)


def versions_figure(modes: Mapping, modes_shown: Sequence[str] = MODES, microbatches: int | None = None):
    """One heatmap per mode: stage (rows) × microbatch (columns). A cell shows the weight version
    its forward used, with ``→b`` when the backward used version b instead; the colour is the
    staleness b - f (white: forward and backward saw the same weights). ``microbatches`` (the
    microbatches of one step) draws the step boundaries."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    data = {mode: _versions(modes, mode) for mode in modes_shown}
    p = len(next(iter(data.values())))
    top = max(1, max(b - f for rows in data.values() for stage in rows for _, f, b in stage))
    fig = make_subplots(rows=len(data), cols=1, shared_xaxes=True, vertical_spacing=0.09,
                        subplot_titles=[f"{mode}" for mode in data])
    for i, (mode, rows) in enumerate(data.items(), 1):
        z = [[b - f for _, f, b in stage] for stage in rows]
        text = [[f"{f}" if f == b else f"{f}→{b}" for _, f, b in stage] for stage in rows]
        fig.add_trace(go.Heatmap(
            z=z, text=text, texttemplate="%{text}", x=[j for j, _, _ in rows[0]], y=list(range(p)),
            coloraxis="coloraxis", xgap=2, ygap=2,
            hovertemplate="stage %{y}, microbatch %{x}: version %{text}<extra></extra>"), row=i, col=1)
        fig.update_yaxes(autorange="reversed", tickvals=list(range(p)),
                         ticktext=[f"stage {s}" for s in range(p)], row=i, col=1)
        if microbatches:
            for edge in range(microbatches, len(rows[0]), microbatches):
                fig.add_vline(x=edge - 0.5, line=dict(color="#333", width=1), row=i, col=1)
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="microbatch", dtick=1, row=len(data), col=1)
    fig.update_layout(**plain_layout(
        height=120 + 150 * len(data), title="Weight version used by each forward (→ by its backward, if different)",
        coloraxis=dict(colorscale=[[0, "#ffffff"], [1, "#d62728"]], cmin=0, cmax=top,
                       colorbar=dict(title="B − F", dtick=1, len=0.8))))
    return fig
