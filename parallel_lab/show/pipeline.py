"""Pictures of pipeline schedules: Gantt charts per rank, activation memory, predicted vs measured.

    from parallel_lab.pipeline.schedules import build
    from parallel_lab.pipeline.simulate import simulate
    from parallel_lab.show import pipeline as figures
    from parallel_lab.pipeline import run_pipeline
    figures.gantt(simulate(build("1f1b", 4, 8)))             # simulated, unit costs
    result = run_pipeline("1f1b", ranks=4, microbatches=8)
    figures.gantt(result, clock="wall")                       # measured, this machine's wall clock
    figures.compare(result)                                   # predicted (outlined) vs measured (filled)
    figures.memory(result)                                    # stashed microbatches per stage over time
    figures.schedule_panel()                                  # widgets: pick, simulate, run for real

Every figure takes either a simulated ``simulate.Timeline`` or a ``run_pipeline`` result and says
on its time axis which clock it shows (simulator units, the virtual clock, or the wall clock: see
``executor``). Figures of simulated timelines are deterministic and their JSON short (one bar trace
per kind of action, rounded numbers), so nbval can compare them.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.pipeline.schedules import SCHEDULES, Action, ScheduleError, build
from parallel_lab.pipeline.simulate import Costs, Timeline, simulate

COLORS = {"F": "#4c78a8", "B": "#54a24b", "I": "#f58518", "W": "#b279a2"}
NAMES = {"F": _l("F forward"), "B": _l("B backward"), "I": _l("I input grad"), "W": _l("W weight grad")}
AXIS = {"sim": _l("time (simulator cost units)"),
        "virtual": _l("virtual clock, ms (thread CPU time + modelled link: p dedicated devices)"),
        "wall": _l("wall clock, ms (this machine: ranks share its cores)"),
        "predicted": _l("virtual clock, ms (simulator fed the measured costs)")}
CLOCKS = {"virtual": _l("virtual clock"), "wall": _l("wall clock"), "predicted": _l("predicted clock")}
# "none" + a few explicit colours instead of plotly_white: the template alone would be 7 kB of
# every figure's JSON (what nbval stores and compares)
_GRID = dict(gridcolor="#e5e5e5", zeroline=False)
LAYOUT = dict(template="none", plot_bgcolor="white", barmode="overlay", bargap=0.25,
              margin=dict(l=70, r=20, t=80, b=50), title_x=0.01,
              legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
              xaxis=_GRID, yaxis=_GRID, font=dict(family="sans-serif", size=12))


EXACT = 1e-10  # fp64: a pipeline run's loss and gradients against one process's


def equals_one_process(result) -> bool:
    """Whether a pipeline run's loss and gradients equal one process's (``run_pipeline``'s diffs, fp64)."""
    return result["max_grad_diff"] < EXACT and result["loss_diff"] < EXACT


def yes_no(value: bool) -> str:
    """``yes`` or ``no`` in the lesson's language."""
    return _("yes") if value else _("no")


def plain_layout(**changes) -> dict:
    """LAYOUT without the bar-chart settings, for line and scatter figures (``changes`` on top)."""
    keep = ("template", "plot_bgcolor", "margin", "title_x", "legend", "font")
    return {**{k: LAYOUT[k] for k in keep}, "xaxis": dict(LAYOUT["xaxis"]), "yaxis": dict(LAYOUT["yaxis"]),
            **changes}


def _timed(source, clock: str) -> tuple[list[list], str]:
    """Per rank ``[[action, start, end], ...]`` and the axis key, from a Timeline or a result."""
    if isinstance(source, Timeline):
        return [[[str(a), s, e] for a, s, e in timed] for timed in source.ranks], "sim"
    if clock not in ("virtual", "wall", "predicted"):
        raise ValueError(f"clock must be 'virtual', 'wall' or 'predicted', got {clock!r}")
    scale = 1e3  # seconds -> ms
    return [[[a, round(s * scale, 4), round(e * scale, 4)] for a, s, e in timed]
            for timed in source["timeline"][clock]], clock


def _num(x: float):
    """Whole numbers as ints: the JSON of unit-cost charts stays short and stable."""
    return int(x) if float(x).is_integer() else round(float(x), 4)


def _bars(timed: list[list], outline: bool = False, width: float = 0.6, legend: bool = True,
          group: str | None = None) -> list:
    """One horizontal bar trace per kind of action: bar from start to end on the rank's row, the
    microbatch number written inside. Idle time is simply where no bar is. Where a rank holds
    several stages (interleaved, ZB-V), its later stages are drawn lighter. ``group`` gathers the
    traces under that title in the legend."""
    parsed = [(r, Action.parse(a), s, e) for r, actions in enumerate(timed) for a, s, e in actions]
    chunks: dict = {}
    for r, a, _start, _end in parsed:
        chunks.setdefault(r, set()).add(a.stage)
    chunk = {(r, st): i for r, stages in chunks.items() for i, st in enumerate(sorted(stages))}
    shaded = any(len(stages) > 1 for stages in chunks.values())
    traces = []
    for kind in "FBIW":
        rows = [row for row in parsed if row[1].kind == kind]
        if not rows:
            continue
        color = COLORS[kind]
        marker = dict(color="rgba(0,0,0,0)", line=dict(color=color, width=2)) if outline else \
            dict(color=color, line=dict(color="white", width=1))
        if shaded and not outline:
            marker["opacity"] = [round(1.0 - 0.45 * chunk[r, a.stage], 2) for r, a, _, _ in rows]
        traces.append(go.Bar(
            orientation="h", name=_("{kind} (predicted)").format(kind=NAMES[kind]) if outline else str(NAMES[kind]),
            y=[r for r, _, _, _ in rows], base=[_num(s) for _, _, s, _ in rows],
            x=[_num(e - s) for _, _, s, e in rows], width=width, marker=marker,
            text=None if outline else [str(a.microbatch) for _, a, _, _ in rows],
            customdata=[str(a) for _, a, _, _ in rows], textposition="inside", insidetextanchor="middle",
            hovertemplate=_("%{customdata}: start %{base}, lasts %{x}") + "<extra></extra>", showlegend=legend,
        ))
    if group and traces:
        for trace in traces:
            trace.legendgroup = group
        traces[0].legendgrouptitle.text = group
    return traces


def _rank_axis(fig, n_ranks: int) -> None:
    fig.update_yaxes(autorange="reversed", tickvals=list(range(n_ranks)),
                     ticktext=[_("rank {rank}").format(rank=r) for r in range(n_ranks)])


def gantt(source, clock: str = "virtual", title: str | None = None):
    """Gantt chart: one row per rank, F/B/I/W bars coloured by kind with their microbatch number."""
    timed, axis = _timed(source, clock)
    fig = go.Figure(_bars(timed))
    fig.update_layout(**LAYOUT, height=150 + 40 * len(timed), title=title or _title(source, axis),
                      xaxis_title=str(AXIS[axis]))
    _rank_axis(fig, len(timed))
    return fig


def _title(source, axis: str) -> str:
    if isinstance(source, Timeline):
        s = source.schedule
        return _("{schedule}: p={p}, m={m}, bubble {bubble:.1%}").format(
            schedule=s.name, p=s.n_ranks, m=s.n_microbatches, bubble=source.bubble_fraction)
    bubble = source["bubble_wall"] if axis == "wall" else source["bubble_predicted"] \
        if axis == "predicted" else source["bubble_measured"]
    return _("{schedule} on {p} ranks, m={m} ({clock}): bubble {bubble:.1%}").format(
        schedule=source["schedule"], p=source["stages"], m=source["microbatches"], clock=CLOCKS[axis], bubble=bubble)


def compare(result: dict, title: str | None = None):
    """Predicted (outlined bars: the simulator fed the measured per-stage costs) over measured
    (filled bars), both on the virtual clock."""
    measured, predicted = _timed(result, "virtual")[0], _timed(result, "predicted")[0]
    fig = go.Figure(_bars(measured, width=0.5, group=_("measured (filled)"))
                    + _bars(predicted, outline=True, width=0.8, group=_("predicted (outlined)")))
    # two legend groups: beside the chart, where they cannot cover the title
    layout = dict(LAYOUT, legend=dict(x=1.02, xanchor="left", y=1, yanchor="top", groupclick="toggleitem"),
                  margin=dict(LAYOUT["margin"], r=170))
    fig.update_layout(**layout, height=150 + 50 * len(measured), xaxis_title=str(AXIS["virtual"]),
                      title=title or _("{schedule}, p={p}, m={m}: bubble measured {measured:.1%} (filled) vs "
                                       "predicted {predicted:.1%} (outlined)").format(
                          schedule=result["schedule"], p=result["stages"], m=result["microbatches"],
                          measured=result["bubble_measured"], predicted=result["bubble_predicted"]))
    _rank_axis(fig, len(measured))
    return fig


def memory(source, title: str | None = None):
    """Stashed microbatches per model stage over time (a microbatch is stashed from the start of its
    F to the end of its B or I), simulated or measured on the virtual clock."""
    if isinstance(source, Timeline):
        series, axis = [[(t, c) for t, c in curve] for curve in source.memory], "sim"
        end = source.makespan
    else:
        series = [[(round(t * 1e3, 4), c) for t, c, _ in curve] for curve in source["timeline"]["memory"]]
        axis, end = "virtual", round(source["makespan_measured"] * 1e3, 4)
    traces = [go.Scatter(x=[_num(t) for t, _ in curve] + [_num(end)],
                         y=[c for _, c in curve] + [curve[-1][1]], mode="lines", line_shape="hv",
                         name=_("stage {stage}").format(stage=s)) for s, curve in enumerate(series)]
    fig = go.Figure(traces)
    fig.update_layout(**{k: LAYOUT[k] for k in ("template", "plot_bgcolor", "margin", "xaxis", "yaxis", "font")},
                      height=320, xaxis_title=str(AXIS[axis]), yaxis_title=_("activations held (micro-batches)"),
                      title=title or _("Activation memory per stage"))
    return fig


# ----------------------------------------------------------------------------------------------
# The interactive panel.


def _costs(f: float, b: float, w: float) -> Costs:
    """F:B:W ratios -> Costs; I = B - W when 0 < W < B (split schedules), else I = W = B/2."""
    return Costs(F=f, B=b, I=b - w, W=w) if 0 < w < b else Costs(F=f, B=b)


def _numbers(timeline: Timeline, v: dict) -> str:
    return _("<b>simulated bubble {bubble:.1%}</b> with the sliders' costs F:B:W = {F:g}:{B:g}:{W:g} &nbsp; "
             "makespan {makespan:g} &nbsp; peak activations per stage {peak} (micro-batches, counted until W)").format(
        bubble=timeline.bubble_fraction, F=v["F"], B=v["B"], W=v["W"], makespan=timeline.makespan,
        peak=timeline.peak_activations)


def schedule_panel(schedule: str = "1f1b", ranks: int = 4, microbatches: int = 8, virtual: int = 1,
                   ratios=(1.0, 2.0, 1.0)):
    """Widgets to explore schedules: pick one, set p, m, v and the F:B:W cost ratios; the Gantt chart
    (a FigureWidget, updated in place) and the numbers follow. "Run on real ranks" runs the same
    schedule with ``run_pipeline`` and overlays what was measured on the prediction.

    Returns the panel (an ipywidgets VBox) with ``.controls``, ``.figure``, ``.numbers``,
    ``.button``, ``.progress`` and ``.result`` (the last real run) for scripting and tests."""
    style = dict(description_width="90px")
    controls = dict(
        schedule=w.Dropdown(options=list(SCHEDULES), value=schedule, description=_("schedule"), style=style),
        ranks=w.IntSlider(value=ranks, min=1, max=8, description=_("ranks p"), style=style),
        microbatches=w.IntSlider(value=microbatches, min=1, max=16, description=_("microbatches"), style=style),
        virtual=w.IntSlider(value=virtual, min=1, max=4, description=_("virtual v"), style=style),
        F=w.FloatSlider(value=ratios[0], min=0.5, max=4, step=0.5, description=_("F cost"), style=style),
        B=w.FloatSlider(value=ratios[1], min=0.5, max=8, step=0.5, description=_("B cost"), style=style),
        W=w.FloatSlider(value=ratios[2], min=0, max=4, step=0.5, description=_("W of B"), style=style),
    )
    panel = w.VBox()
    panel.controls, panel.result = controls, None
    panel.figure = go.FigureWidget(layout=dict(LAYOUT, height=300))
    panel.numbers = w.HTML()
    panel.button = w.Button(description=_("run on real ranks"), icon="play")
    panel.progress = w.IntProgress(value=0, min=0, max=3, description=_("idle"), style=style)

    def values():
        return {key: c.value for key, c in controls.items()}

    def redraw(fig) -> None:
        with panel.figure.batch_update():
            panel.figure.data = ()
            panel.figure.add_traces(list(fig.data))
            panel.figure.layout = fig.layout

    def update(change=None) -> None:
        v = values()
        try:
            sched = build(v["schedule"], v["ranks"], v["microbatches"], v["virtual"])
            timeline = simulate(sched, _costs(v["F"], v["B"], v["W"]))
        except ScheduleError as exc:  # no chart of another setting under the error
            reason = exc.args[0].splitlines()[0]
            with panel.figure.batch_update():
                panel.figure.data = ()
                panel.figure.layout.title = _("no schedule for these settings: {reason}").format(reason=reason)
            panel.numbers.value = f"<span style='color:#b00'>{reason}</span>"
            return
        redraw(gantt(timeline))
        panel.numbers.value = _numbers(timeline, v)

    def run(button=None) -> None:
        v = values()
        panel.progress.value, panel.progress.description = 1, _("running")
        try:
            result = run_pipeline(v["schedule"], v["ranks"], v["microbatches"], virtual=v["virtual"])
        except Exception as exc:  # shown in the panel: a notebook user sees why, the panel stays usable
            panel.progress.value, panel.progress.description = 0, _("failed")
            panel.numbers.value = f"<span style='color:#b00'>{type(exc).__name__}: {str(exc).splitlines()[0]}</span>"
            return
        panel.progress.value, panel.progress.description = 2, _("drawing")
        panel.result = result
        redraw(compare(result))
        panel.numbers.value = _(
            "<b>measured on {p} ranks</b>: bubble {measured:.1%} on the virtual clock, predicted {predicted:.1%} "
            "from this run's measured costs (not the sliders'; wall clock {wall:.1%}); peak activations {peak}, "
            "max gradient difference {diff:.1e}").format(
            p=v["ranks"], measured=result["bubble_measured"], predicted=result["bubble_predicted"],
            wall=result["bubble_wall"], peak=result["peak_activations"], diff=result["max_grad_diff"])
        panel.progress.value, panel.progress.description = 3, _("done")

    for c in controls.values():
        c.observe(update, "value")
    panel.button.on_click(run)
    update()
    boxes = list(controls.values())
    controls_box = w.HBox([w.VBox(boxes[:4]), w.VBox(boxes[4:])])
    # CSS classes the browser test finds them by (tests/browser_support.py, HOOKS).
    controls_box.add_class("pl-pipeline-controls")
    panel.button.add_class("pl-run-real")
    panel.children = [controls_box, panel.numbers, panel.figure, w.HBox([panel.button, panel.progress])]
    return panel
