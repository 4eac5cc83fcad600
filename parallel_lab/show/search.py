"""Lesson 10's pictures and tables (lessons/10_schedule_search.ipynb): what the schedule search finds
under a falling memory cap, beside the course's fixed schedules, and what the optimizer's global
synchronisation does to a zero-bubble schedule.

    from parallel_lab.pipeline.search.api import fixed, front, search
    from parallel_lab.show import search as sf
    print(sf.found_text(search(4, 8, 3)))                       # the grid and its numbers
    sf.front_figure({"wave": front(4, 8, caps), "v": front(4, 8, caps, "v")}, fixed(4, 8))
    sf.two_steps(search(4, 12, 8), synchronised=True)           # two steps, the all-reduce between
    print(sf.costs_table(profile_stages(4)))                    # costs measured on ranks, in µs
    print(sf.ran_text(run_pipeline(found.schedule), cap=3))     # a found schedule on real ranks

Everything drawn from a search or a simulation with the costs given is deterministic (the search
counts its work in actions, not seconds), rounded for print, so nbval compares it; only the tables
of measured costs vary from run to run.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _, _l, pad, width
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.search.problem import back_to_back, costs_for_simulation
from parallel_lab.pipeline.simulate import Costs, simulate, unit_grid
from parallel_lab.show.pipeline import LAYOUT, _bars, _num, _rank_axis, equals_one_process, plain_layout
from parallel_lab.show.schedules import _COLORS as SCHEDULE_COLORS
from parallel_lab.show.schedules import label

PLACEMENTS = {"wave": _l("search, one stage per rank"), "v": _l("search, V placement")}
_LINE = {"wave": "#f58518", "v": "#b279a2"}
_SYMBOLS = {"gpipe": "square", "1f1b": "circle", "interleaved-1f1b": "diamond", "zb-h1": "triangle-up",
            "zb-v": "star", "dualpipe-v": "x"}
_COLORS = {**SCHEDULE_COLORS, "gpipe": "#9d755d"}
STATUS = {"optimal": _l("optimal, proved"), "feasible": _l("the best found in the time, not proved optimal"),
          "infeasible": _l("nothing fits the cap"), "unknown": _l("nothing found in the time")}


def found_text(found, grid: bool = True) -> str:
    """A search's result as text: the step x rank grid (unit costs only: one slot per time unit),
    where it came from, its step and bubble, the bound, the longest span and the peak per rank."""
    j = found.judged
    lines = []
    if grid:
        unit = all(x == 1 for k in ("F", "I", "W") for x in found.problem.table[k]) and found.problem.link == 0
        shown = unit_grid(simulate(found.schedule, costs_for_simulation(found.problem))) if unit else found.schedule
        lines += [format_grid(shown), ""]
    lines += [
        _("found by: {origin}").format(origin=found.origin),
        _("step {makespan:g} (lower bound {bound:g}), bubble {bubble:.1%}; longest span of a rank {span:g}").format(
            makespan=round(j.makespan, 6), bound=round(found.lower_bound, 6), bubble=found.bubble_fraction,
            span=round(j.longest_span, 6)),
        _("span of each rank (first action to last) {spans}, busy {busy}").format(
            spans=[round(x, 6) for x in j.spans], busy=[round(x, 6) for x in j.busy]),
        _("peak activations per rank {peaks} (cap {cap})").format(
            peaks=[round(x, 3) for x in j.peaks], cap=[round(x, 3) for x in found.problem.max_activations]),
    ]
    if found.exact is not None:
        lines.append(_("exact solver (CP-SAT): {status}").format(status=STATUS.get(found.exact, found.exact)))
    return "\n".join(lines)


def clipped_text(result: Mapping) -> str:
    """``post_validation.run_clipped``'s result as text: per threshold, whether clipping was needed,
    whether both optimizer steps equal one process, and which ranks stepped at once and rolled back."""
    lines = [_("global gradient norm {norm:.4f}").format(norm=result["norm"])]
    for case in result["cases"]:
        late = case["post-validated"]
        equal = all(case[mode]["max_param_diff"] < 1e-12 for mode in ("synchronised", "post-validated"))
        lines.append(_("clip at {max_norm:g}: clipping needed: {clipped}; both steps equal one process: {equal}; "
                       "post-validated: ranks {early} stepped at once, ranks {back} rolled back").format(
            max_norm=case["max_norm"], clipped=_("yes") if case["clipped"] else _("no"),
            equal=_("yes") if equal else _("no"), early=late["stepped_early"], back=late["rolled_back"]))
    return "\n".join(lines)


def costs_table(costs: Costs, ranks: int, scale: float = 1e6, unit: str = "µs") -> str:
    """Per-stage costs of F, I, W (and B = I + W when both are given) as a text table, in ``unit``
    (``scale`` per second: measured costs are in seconds)."""
    table = costs.per_stage(ranks)
    kinds = [k for k in ("F", "I", "W", "B") if table.get(k) is not None]
    head = pad(_("stage"), 6) + "".join(pad(f"{k} ({unit})", 11, ">") for k in kinds)
    lines = [head, "-" * width(head)]
    for s in range(ranks):
        lines.append(pad(str(s), 6) + "".join(f"{table[k][s] * scale:>11.1f}" for k in kinds))
    return "\n".join(lines)


def front_table(fronts: Mapping[str, Sequence[Mapping]], fixed_rows: Sequence[Mapping] = (),
                steady: bool = True) -> str:
    """The fronts and the fixed schedules as text: per row its memory (the cap, or a fixed schedule's
    peak per rank), one step's bubble (what every step costs with the optimizer's synchronisation)
    and, with ``steady``, the bubble of back-to-back steps without it."""
    head = pad(_("schedule"), 30) + pad(_("memory"), 8, ">") + pad(_("bubble, one step"), 22, ">")
    head += pad(_("steps not synchronised"), 28, ">") if steady else ""
    lines = [head, "-" * width(head)]

    def row(name: str, memory: float, point: Mapping) -> str:
        text = pad(name, 30) + f"{round(memory, 3):>8g}"
        if point["bubble_fraction"] is None:
            return text + pad(_("nothing fits"), 22, ">")
        return text + f"{point['bubble_fraction']:>22.1%}" + (f"{point['steady_bubble']:>28.1%}" if steady else "")

    for placement, points in fronts.items():
        lines += [row(str(PLACEMENTS[placement]), pt["cap"], pt) for pt in points]
    lines += [row(label(r["schedule"], r["virtual"]), r["peak"], r) for r in fixed_rows]
    return "\n".join(lines)


def front_figure(fronts: Mapping[str, Sequence[Mapping]], fixed_rows: Sequence[Mapping] = (),
                 title: str | None = None):
    """Bubble against the memory cap per rank: for each placement the search's front, one step with
    the optimizer's synchronisation (solid) and back-to-back steps without it (dashed), and the fixed
    schedules as markers at their peak memory (filled: synchronised; open: not)."""
    traces = []
    for placement, points in fronts.items():
        pts = [pt for pt in points if pt["makespan"] is not None]
        caps = [_num(pt["cap"]) for pt in pts]
        for key, dash, name in (("bubble_fraction", "solid", _("{search}: one step, synchronised")),
                                ("steady_bubble", "dash", _("{search}: steady, no synchronisation"))):
            traces.append(go.Scatter(
                x=caps, y=[round(pt[key], 4) for pt in pts], mode="lines+markers", line_shape="hv",
                name=name.format(search=PLACEMENTS[placement]), line=dict(color=_LINE[placement], dash=dash),
                marker=dict(size=6), hovertemplate=_("cap %{x}: bubble %{y:.1%}") + "<extra></extra>"))
    for row in fixed_rows:
        color = _COLORS.get(row["schedule"], "#333333")
        for key, symbol, suffix in (("bubble_fraction", "", ""), ("steady_bubble", "-open", " ")):
            traces.append(go.Scatter(
                x=[_num(round(row["peak"], 4))], y=[round(row[key], 4)], mode="markers",
                name=label(row["schedule"], row["virtual"]) + suffix, showlegend=not suffix,
                legendgroup=row["schedule"],
                marker=dict(color=color, size=11, symbol=_SYMBOLS[row["schedule"]] + symbol),
                hovertemplate=_("{schedule}: peak %{{x}}, bubble %{{y:.1%}}").format(
                    schedule=label(row["schedule"], row["virtual"])) + "<extra></extra>"))
    fig = go.Figure(traces)
    fig.update_layout(**plain_layout(
        height=420, title=title or _("Bubble against the memory cap (simulated, F = I = W)"),
        xaxis_title=_("memory cap per rank (micro-batches of its layers, counted until W)"),
        yaxis_title=_("bubble (idle share of the device time)"),
        legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"), margin=dict(LAYOUT["margin"], r=290)))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    return fig


def two_steps(found, synchronised: bool = True, sync: float = 0.0, title: str | None = None):
    """Two training steps of a found schedule, one after the other: with the optimizer's global
    synchronisation (``sync``: the all-reduce's time) the second starts when every rank is done;
    without it each rank starts its second step as soon as its own first is done (simulated with
    ``problem.back_to_back``: the steps overlap, a longest span apart)."""
    j, costs = found.judged, costs_for_simulation(found.problem)
    m = found.problem.microbatches
    if synchronised:
        shift = j.step(True, sync)
        timed = [[[str(a), s, e] for a, s, e in row] + [[str(a), s + shift, e + shift] for a, s, e in row]
                 for row in simulate(found.schedule, costs).ranks]
    else:
        timed = [[[str(a), s, e] for a, s, e in row] for row in simulate(back_to_back(found.schedule, 2), costs).ranks]
    fig = go.Figure(_bars(timed))
    for trace in fig.data:  # the second step's micro-batches keep their numbers: j + m -> j
        trace.text = [str(int(t) % m) for t in trace.text]
    end = max(e for row in timed for _, _, e in row)
    period = j.step(synchronised, sync)
    fig.update_layout(**LAYOUT, height=150 + 40 * len(timed), xaxis_title=_("time (simulator cost units)"),
                      title=title or (_("Two steps with the optimizer's all-reduce: one every {period:g} units, "
                                        "bubble {bubble:.1%}") if synchronised else
                                      _("Two steps without it: one every {period:g} units, bubble {bubble:.1%}"))
                      .format(period=_num(period), bubble=j.steady_bubble(synchronised, sync)))
    fig.add_vline(x=_num(period), line=dict(color="#888888", dash="dot"))
    fig.update_xaxes(range=[0, _num(end) + 1])
    _rank_axis(fig, len(timed))
    return fig


def uneven_text(loads: Sequence[float], found) -> str:
    """A search's step and bubble for stages of the given costs."""
    return _("stage costs {loads}: step {step:g}, bubble {bubble:.1%}").format(
        loads=list(loads), step=found.makespan, bubble=found.bubble_fraction)


def ran_text(result: Mapping, cap: int) -> str:
    """A searched schedule's run on real ranks: loss and gradients against one process, the measured
    peak activations against the simulated ones and the cap (True/False as Python says them)."""
    return "\n".join([
        _("loss and gradients equal one process (< 1e-10): {equal}").format(equal=equals_one_process(result)),
        _("measured peak activations equal the simulated ones: {equal}").format(
            equal=result["peak_activations"] == result["peak_activations_predicted"]),
        _("under the cap of {cap} on every rank: {fits}").format(cap=cap, fits=max(result["peak_activations"]) <= cap)])


def measured_text(result: Mapping, longest_span: float) -> str:
    """A run's bubble measured and predicted, and its step with the optimizer's synchronisation and
    without it (the longest span of one rank's actions, in seconds). Measured: for a cell nbval does
    not compare."""
    return "\n".join([
        _("bubble measured {measured:.1%}, predicted {predicted:.1%}").format(
            measured=result["bubble_measured"], predicted=result["bubble_predicted"]),
        _("step {step:.3f} ms with the synchronisation, {span:.3f} ms without it (the longest span)").format(
            step=1e3 * result["makespan_measured"], span=1e3 * longest_span)])


def read_back_text(equal: bool) -> str:
    """Whether a schedule written as PyTorch's CSV reads back as the same schedule."""
    return _("read back equal: {equal}").format(equal=equal)


def pytorch_ran_text(result: Mapping) -> str:
    """A schedule's step in PyTorch's pipelining runtime against one process."""
    return _("PyTorch's runtime, loss and gradients equal one process: {equal}").format(
        equal=equals_one_process(result))


def designed_text(mine, cap: int) -> str:
    """The exercise's schedule evaluated under its cap: step, steady-state bubble, peaks, and whether it
    fits."""
    return _("cap {cap}: step {step:g}, bubble {bubble:.1%}, peak per rank {peaks}, fits: {fits}").format(
        cap=cap, step=mine.makespan, bubble=mine.steady_bubble(),
        peaks=[round(x, 3) for x in mine.peaks], fits=mine.fits)


def designed_ran_text(result: Mapping, p: int) -> str:
    """The exercise's schedule on real ranks against one process."""
    return _("on {p} real ranks, loss and gradients equal one process: {equal}").format(
        p=p, equal=equals_one_process(result))


def not_written_text(name: str = "my_schedule") -> str:
    """What the try-it cell says while the exercise is still a stub."""
    return _("{name} is not written yet: fill it in above, run its cell, then this one").format(name=name)
