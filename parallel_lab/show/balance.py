"""Lesson 09's table and picture (lessons/09_balancing_stages.ipynb): unbalanced against balanced
cuts, measured on real ranks, and the bubble against the number of micro-batches."""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _, pad
from parallel_lab.i18n import width as text_width


def measured_table(results: Mapping[str, dict]) -> str:
    """One line per run of ``run_cut``: its cut, each stage's measured F + B per micro-batch (ms,
    thread CPU time), the slowest stage over the mean, and the bubble and makespan measured on the
    virtual clock (with the simulator's prediction from the same measured costs)."""
    width = max(text_width(name) for name in [*results, _("cut")])
    lines = [f"{pad(_('cut'), width)}  {pad(_('parts'), 17)} {pad(_('F+B per stage, ms'), 26)} "
             f"{pad(_('max/mean'), 8, '>')} {pad(_('bubble'), 7, '>')} {pad(_('(pred.)'), 7, '>')} "
             f"{pad(_('step, ms'), 8, '>')}"]
    for name, r in results.items():
        loads = [f + b for f, b in zip(r["costs"]["F"], r["costs"]["B"])]
        ratio = max(loads) / (sum(loads) / len(loads))
        text = " ".join(f"{x * 1e3:5.2f}" for x in loads)
        lines.append(f"{pad(name, width)}  {str(r['parts']):<17} {text:<26} {ratio:>8.2f} "
                     f"{r['bubble_measured']:>7.1%} {r['bubble_predicted']:>7.1%} "
                     f"{r['makespan_measured'] * 1e3:>8.1f}")
    return "\n".join(lines)


def bubble_figure(microbatches: Sequence[int], curves: Mapping[str, Sequence[float]],
                  limits: Mapping[str, float] | None = None, title: str | None = None):
    """Bubble fraction against the number of micro-batches (log axis), one line per cut, with the
    limit ``1 - mean/max`` of each as a dotted line of the same colour. Deterministic: simulated
    numbers rounded to 4 digits, so nbval can compare the figure."""
    colors = ["#e45756", "#54a24b", "#4c78a8", "#f58518", "#b279a2"]
    fig = go.Figure()
    for i, (name, ys) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        fig.add_trace(go.Scatter(x=list(microbatches), y=[round(y, 4) for y in ys], name=name,
                                 mode="lines+markers", line=dict(color=color)))
        if limits and name in limits:
            fig.add_trace(go.Scatter(x=[microbatches[0], microbatches[-1]], y=[round(limits[name], 4)] * 2,
                                     mode="lines", line=dict(color=color, dash="dot", width=1),
                                     name=_("limit {limit:.1%}").format(limit=limits[name]), showlegend=True))
    fig.update_layout(template="none", plot_bgcolor="white", height=380,
                      margin=dict(l=70, r=20, t=60, b=50), font=dict(family="sans-serif", size=12),
                      title=title or _("Bubble against micro-batches"), title_x=0.01,
                      xaxis=dict(type="log", title=_("micro-batches m (log scale)"), gridcolor="#e5e5e5",
                                 tickvals=list(microbatches)),
                      yaxis=dict(title=_("bubble fraction"), tickformat=".0%", range=[0, 0.8], gridcolor="#e5e5e5"))
    return fig
