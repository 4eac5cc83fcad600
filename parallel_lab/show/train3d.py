"""Lesson 11's picture and lines (lessons/11_3d_parallelism.ipynb): 3D training against one process."""

from __future__ import annotations

import plotly.graph_objects as go

from parallel_lab.i18n import _


def format_result(result: dict) -> str:
    """Deterministic lines for a lesson: the checks as booleans, never raw float differences."""
    c = result["config"]
    return _("{dp}x{pp}x{tp} ({world} ranks, {schedule}): losses equal the single process: {losses}; final "
             "weights equal: {weights} (tolerance {tolerance:g})").format(
        dp=c["dp"], pp=c["pp"], tp=c["tp"], world=result["world_size"], schedule=c["schedule"],
        losses=result["losses_equal"], weights=result["weights_equal"], tolerance=result["tolerance"])


def loss_figure(results, title: str | None = None):
    """Plotly: the single-process loss curve as a line, each 3D run's losses as markers on it.
    ``results``: one ``train`` dict or a list of them (same reference). Values are rounded to 9
    digits so that the figure's JSON is the same on every run (fp64 runs agree far below that)."""
    results = [results] if isinstance(results, dict) else list(results)
    steps = list(range(1, len(results[0]["reference_losses"]) + 1))
    fig = go.Figure(go.Scatter(x=steps, y=[round(v, 9) for v in results[0]["reference_losses"]],
                               mode="lines", name=_("one process"), line=dict(color="#444444", width=3)))
    symbols = ("circle-open", "x", "diamond-open", "square-open", "cross")
    for i, r in enumerate(results):
        c = r["config"]
        fig.add_trace(go.Scatter(x=steps, y=[round(v, 9) for v in r["losses"]], mode="markers",
                                 name=f"dp {c['dp']} x pp {c['pp']} x tp {c['tp']} ({c['schedule']})",
                                 marker=dict(symbol=symbols[i % len(symbols)], size=12 + 2 * i)))
    fig.update_layout(title=title or _("3D training vs one process"), xaxis_title=_("step"),
                      yaxis_title=_("loss (mean over the batch)"),
                      width=640, height=380, margin=dict(l=60, r=20, t=50, b=50))
    fig.update_xaxes(dtick=1)
    return fig
