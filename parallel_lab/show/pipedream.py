"""PipeDream's weight versions (lesson 08, lessons/08_recompute_and_pipedream.ipynb): which weights
every forward and backward used, without stashing, with it, and with a flush.

    from parallel_lab.pipeline import pipedream
    from parallel_lab.show import pipedream as pf
    out = pipedream.compare_modes(stages=4, steps=3, microbatches=4)
    pf.versions_figure(out)                             # weight version of every F and B
    pipedream.expected_versions(4, 3, 4)                # the same, read off the schedule

Computed from the schedule (weight-version counts), so the figures are deterministic and nbval
compares them. Paper: PipeDream (Narayanan et al. 2019, SOSP).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from parallel_lab.i18n import _, pad
from parallel_lab.pipeline.pipedream import MODES
from parallel_lab.show.pipeline import plain_layout


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
    lines = [_("stage {stage}, weight version of F/B per microbatch ('*': B used other weights than F)").format(
        stage=stage), pad(_("microbatch"), 12) + "".join(f"{j:>6}" for j in range(n))]
    for mode, rows in tables.items():
        cells = [f"{f}/{b}{'*' if f != b else ''}" for _, f, b in rows]
        lines.append(f"{mode:<12}" + "".join(f"{c:>6}" for c in cells))
    return "\n".join(lines)


def versions_figure(modes: Mapping, modes_shown: Sequence[str] = MODES, microbatches: int | None = None):
    """One heatmap per mode: stage (rows) × microbatch (columns). A cell shows the weight version
    its forward used, with ``→b`` when the backward used version b instead; the colour is the
    staleness b - f (white: forward and backward saw the same weights). ``microbatches`` (the
    microbatches of one step) draws the step boundaries."""
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
            hovertemplate=_("stage %{y}, microbatch %{x}: version %{text}") + "<extra></extra>"), row=i, col=1)
        fig.update_yaxes(autorange="reversed", tickvals=list(range(p)),
                         ticktext=[_("stage {stage}").format(stage=s) for s in range(p)], row=i, col=1)
        if microbatches:
            for edge in range(microbatches, len(rows[0]), microbatches):
                fig.add_vline(x=edge - 0.5, line=dict(color="#333", width=1), row=i, col=1)
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    fig.update_xaxes(title_text=_("microbatch"), dtick=1, row=len(data), col=1)
    fig.update_layout(**plain_layout(
        height=120 + 150 * len(data), title=_("Weight version used by each forward (→ by its backward, if different)"),
        coloraxis=dict(colorscale=[[0, "#ffffff"], [1, "#d62728"]], cmin=0, cmax=top,
                       colorbar=dict(title="B − F", dtick=1, len=0.8))))
    return fig
