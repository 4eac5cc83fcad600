"""Pictures for lesson 01: who holds what before and after a collective, and the α–β fit."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from parallel_lab.hardware import ring_all_reduce_time
from parallel_lab.i18n import _


def holdings_figure(name: str, per_rank: list[dict]) -> go.Figure:
    """Two grids (rows: ranks, columns: slots of each rank's tensor), before and after ``name``;
    an empty cell is a slot the rank does not hold. ``per_rank`` is what ``holdings`` returned."""
    p = len(per_rank)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(_("before"), _("after")), horizontal_spacing=0.08)
    for col, key in enumerate(("before", "after"), start=1):
        z = [row[key] for row in per_rank]
        text = [["" if v is None else f"{v:g}" for v in row] for row in z]
        fig.add_trace(go.Heatmap(
            z=z, text=text, texttemplate="%{text}", colorscale="Blues", showscale=False,
            zmin=0, zmax=max(v for row in per_rank for k in ("before", "after") for v in row[k] if v is not None),
            x=[_("slot {slot}").format(slot=j) for j in range(len(z[0]))],
            y=[_("rank {rank}").format(rank=r) for r in range(p)],
            hovertemplate="%{y}, %{x}: %{text}<extra></extra>", xgap=3, ygap=3,
        ), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=_("{collective} on {p} ranks").format(collective=name, p=p), height=120 + 45 * p, width=720,
                      margin=dict(l=60, r=20, t=70, b=30))
    return fig


def alpha_beta_figure(sizes, measured: dict, fit: dict, world_size: int) -> go.Figure:
    """Measured all-reduce times (one series per algorithm) against the fitted α–β line, log-log."""
    fig = go.Figure()
    for label, seconds in measured.items():
        fig.add_trace(go.Scatter(x=list(sizes), y=[s * 1e3 for s in seconds], mode="markers+lines",
                                 name=_("measured: {label}").format(label=label)))
    model = [ring_all_reduce_time(n, world_size, fit["alpha_s"], fit["bandwidth_bytes_per_s"]) * 1e3 for n in sizes]
    fig.add_trace(go.Scatter(x=list(sizes), y=model, mode="lines", line=dict(dash="dash"),
                             name=_("α–β fit: α={alpha:.0f} µs, bandwidth={bandwidth:.2f} GB/s").format(
                                 alpha=fit["alpha_s"] * 1e6, bandwidth=fit["bandwidth_bytes_per_s"] / 1e9)))
    fig.update_xaxes(type="log", title=_("message size (bytes)"))
    fig.update_yaxes(type="log", title=_("all-reduce time (ms)"))
    fig.update_layout(title=_("all-reduce on {p} ranks of this machine").format(p=world_size), height=420, width=720)
    return fig
