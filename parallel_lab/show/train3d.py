"""Lesson 09's picture and lines (lessons/09_3d_parallelism.ipynb): 3D training against one process."""

from __future__ import annotations

import plotly.graph_objects as go


def format_result(result: dict) -> str:
    """Deterministic lines for a lesson: the checks as booleans, never raw float differences."""
    c = result["config"]
    return (f"{c['dp']}x{c['pp']}x{c['tp']} ({result['world_size']} ranks, {c['schedule']}): "
            f"losses equal the single process: {result['losses_equal']}; "
            f"final weights equal: {result['weights_equal']} (tolerance {result['tolerance']:g})")


def loss_figure(results, title: str = "3D training vs one process"):
    """Plotly: the single-process loss curve as a line, each 3D run's losses as markers on it.
    ``results``: one ``train`` dict or a list of them (same reference). Values are rounded to 9
    digits so that the figure's JSON is the same on every run (fp64 runs agree far below that)."""
    results = [results] if isinstance(results, dict) else list(results)
    steps = list(range(1, len(results[0]["reference_losses"]) + 1))
    fig = go.Figure(go.Scatter(x=steps, y=[round(v, 9) for v in results[0]["reference_losses"]],
                               mode="lines", name="one process", line=dict(color="#444444", width=3)))
    symbols = ("circle-open", "x", "diamond-open", "square-open", "cross")
    for i, r in enumerate(results):
        c = r["config"]
        fig.add_trace(go.Scatter(x=steps, y=[round(v, 9) for v in r["losses"]], mode="markers",
                                 name=f"dp {c['dp']} x pp {c['pp']} x tp {c['tp']} ({c['schedule']})",
                                 marker=dict(symbol=symbols[i % len(symbols)], size=12 + 2 * i)))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="loss (mean over the batch)",
                      width=640, height=380, margin=dict(l=60, r=20, t=50, b=50))
    fig.update_xaxes(dtick=1)
    return fig
