"""Lesson 11's picture and lines (lessons/11_3d_parallelism.ipynb): 3D training against one process."""

from __future__ import annotations

import plotly.graph_objects as go

from parallel_lab.i18n import _, _l


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


# Lesson 11's plans that cannot work: (what is wrong, the changes to its base plan, the world size).
BAD_PLANS = (
    (_l("a mesh that is not the machine"), dict(dp=3), 8),
    (_l("more pipeline stages than layers"), dict(pp=4, tp=1, layers=2, microbatches=4), None),
    (_l("micro-batches that do not divide the batch"), dict(microbatches=3), None),
    (_l("heads not divisible by tp"), dict(tp=4, pp=1, heads=6, hidden=24), None),
    (_l("vocabulary not divisible by tp"), dict(vocab=33), None),
    (_l("interleaving needs m % pp == 0"), dict(schedule="interleaved-1f1b", virtual=2, microbatches=1, batch=4),
     None),
    (_l("does not fit in memory"), dict(hidden=64, batch=64), None),
)


def check_plans(base, plans=BAD_PLANS, memory_limit_gb: float = 0.001) -> str:
    """Each plan (``base`` with its changes) through ``train3d.check``: accepted, or the error it raises."""
    from parallel_lab.parallel3d import train3d
    from parallel_lab.pipeline.schedules import ScheduleError

    lines = []
    for what, changes, world in plans:
        try:
            train3d.check(base.replace(**changes), world_size=world, memory_limit_gb=memory_limit_gb)
            lines.append(_("{what} {changes}: accepted").format(what=what, changes=changes))
        except (ValueError, ScheduleError) as err:
            lines.append(f"{what} {changes}:\n    {type(err).__name__}: {err}")
    return "\n".join(lines)
