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


def recorded_text(modes: Mapping, expected: Mapping) -> str:
    """Per mode, whether the versions the ranks recorded (``compare_modes``) are those read off the
    schedule (``pipedream.expected_versions``)."""
    lines = []
    for mode in MODES:
        measured = _versions(modes, mode)
        lines.append(_("{mode}: versions recorded on the ranks == read off the schedule: {same}").format(
            mode=pad(mode, 8), same=measured == _versions(expected, mode)))
    return "\n".join(lines)


def stream_text(flushed, stream, steps: int, microbatches: int) -> str:
    """Flushed 1F1B against one stream of ``steps`` x ``microbatches`` micro-batches (two timelines)."""
    return "\n".join([
        _("flushed 1F1B: {steps} steps of {step:g} units = {total:g}, bubble {bubble:.1%} in every step").format(
            steps=steps, step=flushed.makespan, total=steps * flushed.makespan, bubble=flushed.bubble_fraction),
        _("PipeDream, one stream of {n} micro-batches: {total:g} units, bubble {bubble:.1%}, shrinking towards "
          "0 as training goes on").format(n=steps * microbatches, total=stream.makespan,
                                          bubble=stream.bubble_fraction)])


def stream_title(n: int) -> str:
    return _("Asynchronous 1F1B (PipeDream): {n} micro-batches without a flush").format(n=n)


def checks_text(modes: Mapping, stages: int, tol: float = 1e-12) -> str:
    """The three modes' runs against the schedule and the single-process references: staleness and
    weight versions (``pipedream.staleness``, ``stashed_versions``), the weight-stashing replay and
    synchronous SGD."""
    from parallel_lab.pipeline import pipedream

    no_stash, stash, flush = modes["no-stash"], modes["stash"], modes["flush"]
    stale = [row[-1] for row in no_stash["staleness"]]

    def same_weights(run):
        return all(f == b for stage in run["versions"] for _, f, b in stage)

    return "\n".join([
        _("no-stash: steady-state staleness per stage {stale}; == p-1-s from the schedule: {same}").format(
            stale=stale, same=stale == [pipedream.staleness(stages, s) for s in range(stages)]),
        _("no-stash: every backward used its forward's weights: {same}; equals the weight-stashing replay: "
          "{replay}").format(same=same_weights(no_stash), replay=no_stash["diff_vs_replay"] < tol),
        _("stash:    every backward used its forward's weights: {same}; equals the weight-stashing replay: "
          "{replay}").format(same=same_weights(stash), replay=stash["diff_vs_replay"] < tol),
        _("stash:    weight versions held at once per stage {held}; == p-s from the schedule: {same}").format(
            held=stash["peak_versions"],
            same=stash["peak_versions"] == [pipedream.stashed_versions(stages, s) for s in range(stages)]),
        _("flush:    equals synchronous SGD: {flush}; no-stash and stash equal synchronous SGD: {others}").format(
            flush=flush["diff_vs_sync_sgd"] < tol,
            others=no_stash["diff_vs_sync_sgd"] < tol or stash["diff_vs_sync_sgd"] < tol)])
