"""Schedules side by side (lessons 06 and 07, lessons/07_zero_bubble.ipynb): bubble, memory and
messages per schedule, and the bubble against the number of micro-batches; and a student's own
schedule as the validator sees it (``your_schedule``, before an exercise's check).

    from parallel_lab.show import schedules as sf
    print(sf.schedule_table(sf.compare_schedules()))   # bubble, memory, messages per schedule
    sf.bubble_curves(ranks=4)                          # bubble fraction against m, simulated

Computed from integers (the schedules, the simulator with unit costs), so every figure is
deterministic and nbval compares it. Papers: interleaved 1F1B (Narayanan et al. 2021, SC), ZB-H1 and
ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"), DualPipeV (DeepSeek-V3 technical report
2024, section 3.2.1), which lesson 07 passes in: ``SCHEDULES + (("dualpipe-v", 2),)``.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _, pad, width
from parallel_lab.pipeline.actions import ScheduleError, as_schedule
from parallel_lab.pipeline.communication import messages
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.show.pipeline import plain_layout

# (schedule, virtual stages per rank) compared in lesson 07; costs per model stage F = I = W = 1
SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2))
UNIT = Costs(F=1, B=2, I=1, W=1)
_COLORS = {"1f1b": "#4c78a8", "interleaved-1f1b": "#54a24b", "zb-h1": "#f58518", "zb-v": "#b279a2",
           "dualpipe-v": "#e45756"}  # dualpipe-v: not in lesson 07's SCHEDULES, pass it to compare


def label(name: str, virtual: int = 1) -> str:
    """``interleaved-1f1b`` with v = 2 -> ``interleaved-1f1b v=2``; others keep their name."""
    return f"{name} v={virtual}" if name == "interleaved-1f1b" else name


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
    head = (f"{'p':>2} {'m':>3}  {pad(_('schedule'), 20)} {pad(_('bubble'), 7, '>')} "
            f"{pad(_('idle/compute'), 13, '>')} {pad(_('peak stash (stages)'), 20, '>')} {pad(_('messages'), 9, '>')}")
    lines, last = [head, "-" * width(head)], None
    for row in rows:
        if last is not None and (row["p"], row["m"]) != last:
            lines.append("")
        last = (row["p"], row["m"])
        lines.append(f"{row['p']:>2} {row['m']:>3}  {label(row['schedule'], row['virtual']):<20} "
                     f"{row['bubble']:>7.1%} {row['ratio']:>13.3f} {row['peak']:>20g} {row['messages']:>9}")
    return "\n".join(lines)


def _fits(name: str, ranks: int, m: int) -> bool:
    """Whether ``build`` takes m: interleaving needs m % p == 0, DualPipeV m >= 2p."""
    return {"interleaved-1f1b": m % ranks == 0, "dualpipe-v": m >= 2 * ranks}.get(name, True)


def bubble_curves(ranks: int = 4, microbatches: Sequence[int] = tuple(range(4, 33, 4)),
                  schedules: Sequence[tuple[str, int]] = SCHEDULES + (("interleaved-1f1b", 4),),
                  costs: Costs = UNIT):
    """Simulated bubble fraction against the number of microbatches, one line per schedule (each
    at the m its schedule takes: interleaving m % p == 0, DualPipeV m >= 2p)."""
    traces = []
    for name, v in schedules:
        ms = [m for m in microbatches if _fits(name, ranks, m)]
        bubbles = [round(simulate(build(name, ranks, m, v), costs).bubble_fraction, 4) for m in ms]
        # dualpipe-v's bubble is zb-v's at these costs: dashed, so that both lines show
        dash = "dot" if v == 4 else "dash" if name == "dualpipe-v" else "solid"
        traces.append(go.Scatter(x=list(ms), y=bubbles, mode="lines+markers", name=label(name, v),
                                 line=dict(color=_COLORS[name], dash=dash)))
    fig = go.Figure(traces)
    fig.update_layout(**plain_layout(height=340, xaxis_title=_("microbatches m"),
                                yaxis_title=_("bubble (idle share of the step)"),
                                title=_("Bubble against microbatches on p={p} ranks (simulated, F=I=W)").format(
                                    p=ranks)))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(tickvals=list(microbatches))
    return fig


def your_schedule(fn, p: int, m: int, name: str | None = None) -> None:
    """Print what an exercise's ``fn(p, m)`` returns (``fn()`` for a function of no arguments, written
    for this ``p`` and ``m``) as the validator sees it:
    the step x rank grid of the valid schedule, the validator's message for a broken one, or, for the
    stub, how to go on. Lessons 03, 05 and 07 call it before an exercise's check."""
    name = name or getattr(fn, "__name__", "my_schedule")
    try:
        ranks = fn(p, m) if fn.__code__.co_argcount else fn()
        print(validate(as_schedule(ranks, p=p, m=m, name=name)))
    except NotImplementedError:
        print(_("{name} is not written yet: fill it in above, run its cell, then this one").format(name=name))
    except ScheduleError as err:
        print(err)
