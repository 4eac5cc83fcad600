"""Lesson 09's table and picture (lessons/09_balancing_stages.ipynb): unbalanced against balanced
cuts, measured on real ranks, and the bubble against the number of micro-batches."""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import LANGUAGES, _, _l, pad, using
from parallel_lab.i18n import width as text_width

# The names lesson 09 gives its cuts (the keys of its dicts of runs and curves, what its prediction
# orders): shown in the lesson's language; any other name is shown as it is.
CUT_NAMES = {"even blocks": _l("even blocks"), "balanced": _l("balanced"), "time-balanced": _l("time-balanced"),
             "DeepSpeed parameters": _l("DeepSpeed parameters")}


def cut_name(name: str) -> str:
    """A cut's name in the lesson's language (``CUT_NAMES``), or ``name`` itself."""
    return str(CUT_NAMES.get(name, name))


def cut_choices(*names: str) -> tuple[dict, ...]:
    """The cuts as a prediction's choices, one text per language (``{"en": ..., "zh-Hant": ...}``):
    the prediction asks for them, and accepts them, in either language, and shows them in the lesson's."""
    choices = []
    for name in names:
        text = {}
        for lang in LANGUAGES:
            with using(lang):
                text[lang] = cut_name(name)
        choices.append(text)
    return tuple(choices)


def measured_table(results: Mapping[str, dict]) -> str:
    """One line per run of ``run_cut``: its cut, each stage's measured F + B per micro-batch (ms,
    thread CPU time), the slowest stage over the mean, and the bubble and makespan measured on the
    virtual clock (with the simulator's prediction from the same measured costs)."""
    width = max(text_width(cut_name(name)) for name in [*results, _("cut")])
    lines = [f"{pad(_('cut'), width)}  {pad(_('parts'), 17)} {pad(_('F+B per stage, ms'), 26)} "
             f"{pad(_('max/mean'), 8, '>')} {pad(_('bubble'), 7, '>')} {pad(_('(pred.)'), 7, '>')} "
             f"{pad(_('step, ms'), 8, '>')}"]
    for name, r in results.items():
        loads = [f + b for f, b in zip(r["costs"]["F"], r["costs"]["B"])]
        ratio = max(loads) / (sum(loads) / len(loads))
        text = " ".join(f"{x * 1e3:5.2f}" for x in loads)
        lines.append(f"{pad(cut_name(name), width)}  {str(r['parts']):<17} {text:<26} {ratio:>8.2f} "
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
        fig.add_trace(go.Scatter(x=list(microbatches), y=[round(y, 4) for y in ys], name=cut_name(name),
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


def try_cut(my_cut, spec, weights: Sequence[float], names: Sequence[str], stages: int = 4,
            microbatches: int = 8) -> dict | None:
    """Lesson 09's "try it on ranks": call the student's ``my_cut(weights, stages)``, refuse a cut that
    is not ``stages + 1`` increasing boundaries (the reason, before anything starts), then run it with
    1F1B on ``stages`` real ranks (``balance.run_cut``, one recorded step) and print whether it equals
    one process, its stages' loads by ``weights`` against the exact optimum's, and its step on the
    virtual clock. Returns the run (None when there is none)."""
    import traceback

    from parallel_lab.pipeline import balance, partition
    from parallel_lab.pipeline.stages import check_parts

    name = getattr(my_cut, "__name__", "my_cut")
    try:
        parts = my_cut(list(weights), stages)
    except NotImplementedError:
        print(_("NOT YET: {name} still raises NotImplementedError: write your code where it says # YOUR CODE HERE "
                "(and remove that raise), run its cell, then this one").format(name=name))
        return None
    except Exception:  # the student's own error, with the lines of their cell
        print(_("NOT YET: {name} raised:").format(name=name))
        traceback.print_exc(limit=-3)
        return None
    try:
        parts = check_parts(parts, len(weights))
    except ValueError as err:
        print(_("NOT YET: {err}").format(err=err))
        return None
    if len(parts) != stages + 1:
        print(_("NOT YET: {n} stages, not {stages}: parts {parts}").format(n=len(parts) - 1, stages=stages,
                                                                           parts=parts))
        return None
    print(partition.describe(parts, names, weights))
    heaviest = max(partition.stage_loads(weights, parts))
    best = max(partition.stage_loads(weights, partition.balanced(weights, stages)))
    run = balance.run_cut(spec, parts, "1f1b", microbatches=microbatches, steps=1)
    print(_("on {stages} real ranks: loss and gradients equal one process: {same}; heaviest stage {heaviest:.4g} "
            "(the exact optimum's {best:.4g}); step {step:.1f} ms on the virtual clock").format(
        stages=stages, same=run["loss_diff"] < 1e-12 and run["max_grad_diff"] < 1e-12, heaviest=heaviest,
        best=best, step=run["makespan_measured"] * 1e3))
    return run


def speedup_text(runs: Mapping[str, dict], fast: str, others: Sequence[str]) -> str:
    """How many times faster the run ``fast`` is than each of ``others`` (step time on the virtual clock)."""
    step = {name: r["makespan_measured"] for name, r in runs.items()}
    return _("in this run, {fast} is {ratios} on this model").format(
        fast=cut_name(fast), ratios=_(", ").join(_("{x:.2f}x faster than {other}").format(
            x=step[o] / step[fast], other=cut_name(o)) for o in others))


def profile_text(records, names: Sequence[str], block_s: float) -> str:
    """Each piece's measured forward + backward time, in ms and in blocks (``block_s``: a block's time)."""
    return "\n".join(_("{name} forward + backward {ms:6.2f} ms = {blocks:4.2f} blocks").format(
        name=pad(name, 8), ms=r.time_s * 1e3, blocks=r.time_s / block_s) for r, name in zip(records, names))


def costs_text(costs) -> str:
    return _("per-stage costs for the simulator: F = {F}  B = {B}").format(F=costs.F, B=costs.B)


def gantt_title(name: str, timeline) -> str:
    return _("1F1B, {name}: stage loads {loads}, bubble {bubble:.1%}").format(
        name=cut_name(name), loads=timeline.costs.F, bubble=timeline.bubble_fraction)


def step_compare_text(unbalanced, balanced) -> str:
    return _("step time: even blocks {a:g}, balanced {b:g} ({x:.2f}x faster); bubble {u:.1%} -> {v:.1%}").format(
        a=unbalanced.makespan, b=balanced.makespan, x=unbalanced.makespan / balanced.makespan,
        u=unbalanced.bubble_fraction, v=balanced.bubble_fraction)


def curves_text(microbatches, curves, limits) -> str:
    lines = ["m:          " + " ".join(f"{m:>6}" for m in microbatches)]
    for name, ys in curves.items():
        lines.append(pad(cut_name(name), 12) + " ".join(f"{y:>6.1%}" for y in ys)
                     + "   " + _("limit {limit:.1%}").format(limit=limits[name]))
    return "\n".join(lines)


def facts_table(records, names) -> str:
    lines = [pad(_("layer"), 8) + " " + pad(_("type"), 11) + " " + pad(_("parameters"), 10, ">") + " "
             + pad(_("activation bytes"), 17, ">")]
    lines += [f"{pad(name, 8)} {r.type:<11} {r.params:>10,} {r.activation_bytes:>17,}"
              for r, name in zip(records, names)]
    return "\n".join(lines)


def times_table(records, names) -> str:
    lines = [pad(_("layer"), 8) + " " + pad(_("forward ms"), 10, ">") + " " + pad(_("backward ms"), 11, ">") + " "
             + pad(_("backward/forward"), 16, ">")]
    lines += [f"{pad(name, 8)} {r.fwd_s * 1e3:>10.2f} {r.bwd_s * 1e3:>11.2f} {r.bwd_s / r.fwd_s:>16.1f}"
              for r, name in zip(records, names)]
    return "\n".join(lines)


def match_text(runs: Mapping[str, dict]) -> str:
    return "\n".join(_("{name}: loss and all {n} gradients match one process: {ok}").format(
        name=pad(cut_name(name), 20), n=len(r["grad_diffs"]), ok=r["loss_diff"] < 1e-12 and r["max_grad_diff"] < 1e-12)
        for name, r in runs.items())


def run_title(name: str, run: dict) -> str:
    return _("{name} {parts}: bubble {bubble:.1%} (virtual clock)").format(
        name=cut_name(name), parts=run["parts"], bubble=run["bubble_measured"])


def buckets_text(tensors: int, buckets: int, bucket_bytes: int) -> str:
    return _("{tensors} parameter tensors -> {buckets} buckets of at most {size} bytes").format(
        tensors=tensors, buckets=buckets, size=bucket_bytes)


def replicas_text(ranks) -> str:
    return "\n".join(_("rank {rank}: {buckets} buckets = {calls} all-reduces; gradients equal the whole-batch "
                       "reference: {ok}").format(rank=r["rank"], buckets=r["buckets"], calls=r["all_reduce_calls"],
                                                 ok=r["max_grad_diff"] < 1e-12) for r in ranks)
