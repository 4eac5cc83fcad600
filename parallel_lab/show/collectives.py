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


# ----------------------------------------------------------------------------------------------
# What lessons 00 and 01 print from their runs, in the lesson's language.


def hello_text(results: list[dict]) -> str:
    """``demos.hello`` on every rank: one line per rank with its all-reduced sum."""
    return "\n".join(_("rank {rank} of {world}: all-reduced sum = {total:g}").format(
        rank=r["rank"], world=r["world_size"], total=r["sum"]) for r in results)


def failed_rank_text(err) -> str:
    """A ``launcher.RankError``'s first line (which rank raised what), then ``err.rank``."""
    return str(err).splitlines()[0] + "\n" + _("the failing rank: {rank}").format(rank=err.rank)


def hung_text(err) -> str:
    """A ``launcher.RanksHung``: its first line, then the operation each rank was blocked in."""
    return "\n".join([str(err).splitlines()[0]] + ["  " + _("rank {rank} was blocked in {operation}").format(
        rank=rank, operation=operation) for rank, operation in err.blocked.items()])


def fit_text(fit: dict) -> str:
    """The α–β fit (``calibration.fit_alpha_beta``): α, β as the inverse bandwidth, and the bandwidth."""
    bandwidth = fit["bandwidth_bytes_per_s"]
    return _("α ≈ {alpha:.0f} µs per step, β ≈ {beta:.2f} ns per byte (bandwidth 1/β ≈ {bandwidth:.2f} GB/s)").format(
        alpha=fit["alpha_s"] * 1e6, beta=1e9 / bandwidth, bandwidth=bandwidth / 1e9)


def ring_versus_text(n_bytes: int, world_size: int, gloo_s: float, ring_s: float, model_s: float) -> str:
    """gloo's all-reduce against the Python ring on the same message, and the α–β model's time."""
    return "\n".join([
        _("{mb:g} MB on {world} ranks: gloo {gloo:.1f} ms, our ring {ring:.1f} ms, ratio {ratio:.2f}").format(
            mb=n_bytes / 2**20, world=world_size, gloo=gloo_s * 1e3, ring=ring_s * 1e3, ratio=ring_s / gloo_s),
        _("the α–β model with your fit: {model:.1f} ms").format(model=model_s * 1e3)])
