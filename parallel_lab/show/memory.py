"""Plots and the interactive widget of lesson 00 (lessons/00_why_split_a_model.ipynb).

    from parallel_lab.show import memory as widgets_memory
    widgets_memory.models_figure()      # stacked bars per model preset vs GPU memory (deterministic)
    widgets_memory.config_figure()      # one configuration's bytes vs one GPU
    widgets_memory.memory_widget()      # dropdowns and sliders redrawing config_figure

The arithmetic is in ``parallel_lab.planning.memory``; this module only draws it.
"""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from parallel_lab.i18n import _, _l
from parallel_lab.planning import memory
from parallel_lab.planning.memory import GB, GPUS, MODELS, PRECISIONS

PARTS = ("weights", "gradients", "optimizer", "activations")
LABELS = {"weights": _l("weights"), "gradients": _l("gradients"), "optimizer": _l("Adam state"),
          "activations": _l("activations"), "total": _l("total")}
COLORS = {"weights": "#4c78a8", "gradients": "#f58518", "optimizer": "#e45756",
          "activations": "#72b7b2", "total": "#54a24b"}
_LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=150, t=60, b=50))


def _gb(nbytes: int) -> float:
    """GB to 3 significant digits: enough for a chart, and the figure's JSON stays short and stable."""
    return float(f"{nbytes / GB:.3g}")


def _gpu_line(fig: go.Figure, gb: float, text: str) -> None:
    """A dashed line across the plot at ``gb`` on a log y axis, labelled on the right. A shape takes
    data coordinates, but an annotation on a log axis takes log10 of them (plotly's convention)."""
    fig.add_shape(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=gb, y1=gb,
                  line=dict(dash="dash", color="gray", width=1))
    fig.add_annotation(xref="x domain", x=1, xanchor="left", yref="y", y=round(math.log10(gb), 4),
                       text=text, showarrow=False, font_size=10)


def _gpu_lines(fig: go.Figure, gpus) -> None:
    """One line per distinct GPU memory size, labelled with every GPU of that size."""
    sizes: dict[int, list[str]] = {}
    for name in gpus:
        sizes.setdefault(GPUS[name], []).append(name)
    for size, names in sorted(sizes.items()):
        _gpu_line(fig, size / GB, " / ".join(names))


def models_figure(models=tuple(MODELS), micro_batch: int = 1, precision="mixed",
                  recompute: bool = False, gpus=tuple(GPUS)) -> go.Figure:
    """Training memory of each model preset on one device, stacked by component (GB, log scale),
    against the memory of each GPU preset."""
    parts = {name: memory.breakdown(name, micro_batch, None, precision, recompute) for name in models}
    fig = go.Figure([go.Bar(name=str(LABELS[part]), x=list(models), y=[_gb(parts[m][part]) for m in models],
                            marker_color=COLORS[part]) for part in PARTS])
    fig.update_layout(**_LAYOUT, barmode="stack",
                      title=(_("Training memory on one device ({precision} Adam, micro-batch {micro_batch}, "
                               "recomputation)") if recompute else
                             _("Training memory on one device ({precision} Adam, micro-batch {micro_batch})")).format(
                          precision=precision, micro_batch=micro_batch),
                      yaxis=dict(type="log", title=_("GB (log scale)")),
                      legend=dict(x=0.01, y=0.99, bgcolor="rgba(255,255,255,0.8)"))
    _gpu_lines(fig, gpus)
    return fig


def config_figure(model="GPT-3 175B", micro_batch: int = 1, seq: int = 2048, precision="mixed",
                  recompute: bool = False, gpu="H100 80GB") -> go.Figure:
    """One configuration's bytes per component and in total (GB, log scale) against one GPU."""
    parts = memory.breakdown(model, micro_batch, seq, precision, recompute)
    names = [*PARTS, "total"]
    values = [_gb(parts[p]) for p in names]
    fig = go.Figure(go.Bar(x=[str(LABELS[p]) for p in names], y=values, texttemplate="%{y:,.1f} GB",
                           textposition="outside", marker_color=[COLORS[p] for p in names]))
    low, high = min(values), max(*values, GPUS[gpu] / GB)  # the GPU's line must stay in view
    fig.update_layout(**_LAYOUT, title=_("Where the bytes go: {model} on one {gpu}").format(model=model, gpu=gpu),
                      yaxis=dict(type="log", title=_("GB (log scale)"),
                                 range=[round(math.log10(low) - 0.5, 2), round(math.log10(high) + 0.5, 2)]))
    _gpu_line(fig, GPUS[gpu] / GB, gpu)
    return fig


def memory_widget(model="GPT-3 175B", micro_batch=1, seq=2048, precision="mixed",
                  recompute=False, gpu="H100 80GB"):
    """Dropdowns and sliders for one configuration; below them ``config_figure`` and the one-line
    ``memory.summary``, redrawn in place when a control changes.

    The chart is a plain figure in an Output widget rather than a FigureWidget: a FigureWidget saves
    plotly's whole JavaScript bundle (5 MB) into the executed notebook's widget state."""
    style = dict(description_width="110px")
    controls = dict(
        model=w.Dropdown(options=list(MODELS), value=model, description=_("model"), style=style),
        precision=w.Dropdown(options=[(p.name, key) for key, p in PRECISIONS.items()], value=precision,
                             description=_("precision"), style=style),
        micro_batch=w.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=micro_batch,
                                      description=_("micro-batch"), style=style),
        seq=w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192], value=seq,
                              description=_("sequence length"), style=style),
        recompute=w.Checkbox(value=recompute, description=_("full recomputation"), style=style),
        gpu=w.Dropdown(options=list(GPUS), value=gpu, description="GPU", style=style),
    )
    chart, text = w.Output(), w.HTML()

    def update(change=None):
        values = {key: c.value for key, c in controls.items()}
        with chart:
            chart.clear_output(wait=True)
            display(config_figure(**values))
        text.value = f"<b>{memory.summary(**values)}</b>"

    for c in controls.values():
        c.observe(update, "value")
    update()
    boxes = list(controls.values())
    return w.VBox([w.HBox([w.VBox(boxes[:3]), w.VBox(boxes[3:])]), chart, text])


# ----------------------------------------------------------------------------------------------
# What lesson 00's cells print, in the lesson's language.


def precisions_text() -> str:
    """Each precision's bytes per parameter: weights + gradients + optimizer state."""
    return "\n".join(_("{name}: {weights} + {gradients} + {optimizer} = {total} bytes per parameter").format(
        name=p.name, weights=p.weights, gradients=p.gradients, optimizer=p.optimizer, total=p.per_param)
        for p in PRECISIONS.values())


def params_text(model) -> str:
    """A model preset and its parameter count by ``12·L·h² + (V + s)·h``."""
    return str(model) + "\n" + _("parameters: 12·L·h² + (V+s)·h = {n:,} (≈ {billions:.1f} billion)").format(
        n=model.params, billions=model.params / 1e9)


def split_state_text(model, tp: int, pp: int, gpu_gb: float = 80) -> str:
    """The model state of ``model`` and what tp × pp GPUs each hold of it, against a GPU of ``gpu_gb``."""
    state = sum(memory.model_state(model.params).values())
    each = state / (tp * pp) / GB
    return "\n".join([
        _("{model} model state: {tb:.2f} TB").format(model=model.name, tb=state / 1e12),
        _("TP {tp} x PP {pp} = {n} GPUs: {each:.1f} GB each, leaving {left:.1f} GB of an {gpu:g} GB GPU for "
          "activations and buffers").format(tp=tp, pp=pp, n=tp * pp, each=each, left=gpu_gb - each, gpu=gpu_gb)])
