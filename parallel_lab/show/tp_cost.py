"""Why tensor parallelism stays inside the fast NVLink domain: a layer's compute time against its
communication time, from the α–β model of lesson 01 (lessons/02_tensor_parallelism.ipynb, FAQ 6).

The arithmetic is ``parallel_lab.planning.cost.tp_layer_step`` (per layer, forward and backward: the
matmuls' 3·24·b·s·h² FLOPs shared by t devices, against Megatron's four ring all-reduces of the
b·s·h activation), the same one lessons 11 and 15 print; the GPUs and links are
``parallel_lab.hardware``'s 2026 presets with their sources. Tensor-parallel all-reduces sit on the
critical path (the next matmul needs their result), so they add to the step time.

    default_summary()      # the defaults on each preset (text)
    cost_figure(...)       # compute and communication per layer against t (plotly)
    cost_widget(machine)   # sliders and editable link numbers
                           # (``machine`` from ``planning.calibration.measure_machine()``)
"""

from __future__ import annotations

import math

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from parallel_lab.hardware import LINKS, SYSTEMS, Link
from parallel_lab.i18n import _
from parallel_lab.planning.cost import tp_layer_step

H100, GB200, GB300 = SYSTEMS["DGX H100"], SYSTEMS["GB200 NVL72"], SYSTEMS["GB300 NVL72"]
# (link, achieved FLOP/s of the GPUs at its ends): the fast domain and the network of each generation
PRESETS = {
    "nvlink4": (LINKS["nvlink4"], H100.tflops * 1e12),
    "ndr": (LINKS["ndr"], H100.tflops * 1e12),
    "nvlink5": (LINKS["nvlink5"], GB200.tflops * 1e12),
    "xdr": (LINKS["xdr"], GB300.tflops * 1e12),
}
DEVICE_FLOPS = H100.tflops * 1e12
DEFAULTS = dict(hidden=12288, tp=8, tokens=2048, bytes_per_value=2)  # GPT-3 175B's width, one 2048-token sequence
TPS = (1, 2, 4, 8, 16, 32, 64)
GPUS_PER_NODE = H100.domain  # a DGX/HGX node; a GB200 NVL72 rack keeps 72 GPUs in one NVLink domain


def _time(seconds: float) -> str:
    """3 significant digits in µs, ms or s (never an exponent)."""
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3)):
        if seconds < 1000 * scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s" if seconds < 1000 else f"{seconds:,.0f} s"


def summary(link: Link, hidden: int, tp: int, tokens: int, flops: float, bytes_per_value: int = 2) -> str:
    """One line: compute and communication of a layer's forward and backward on ``link``, their ratio."""
    c, m = tp_layer_step(tokens, hidden, tp, link, flops, bytes_per_value)
    return _("{link}, {bandwidth:.3g} GB/s, α {alpha}, {tflops:.0f} TFLOP/s: compute {compute}, communication "
             "{communication} per layer (forward + backward) -> comm/compute = {ratio:.2g}").format(
        link=_(link.name), bandwidth=link.bandwidth / 1e9, alpha=_time(link.latency), tflops=flops / 1e12,
        compute=_time(c), communication=_time(m), ratio=m / c)


def default_summary() -> str:
    """The widget's starting point on every preset (pure arithmetic: deterministic)."""
    d = DEFAULTS
    head = _("h = {h}, t = {t}, {tokens} tokens (b·s), {bits}-bit activations; each of the 4 all-reduces sums "
             "{mb:.1f} MB").format(h=d["hidden"], t=d["tp"], tokens=d["tokens"], bits=8 * d["bytes_per_value"],
                                   mb=d["tokens"] * d["hidden"] * d["bytes_per_value"] / 1e6)
    return "\n".join([head] + [summary(link, d["hidden"], d["tp"], d["tokens"], flops, d["bytes_per_value"])
                               for link, flops in PRESETS.values()])


def cost_figure(link: Link, hidden: int, tp: int, tokens: int, flops: float, bytes_per_value: int = 2,
                tps=TPS, others=()) -> go.Figure:
    """Compute and communication time of one layer's forward and backward against the TP degree t
    (log axes), the chosen t marked; dotted: the communication on ``others`` (links) for comparison.
    Communication starts at t = 2 (one device does not talk)."""
    compute, comm = zip(*(tp_layer_step(tokens, hidden, t, link, flops, bytes_per_value) for t in tps))
    compute, comm = [c * 1e3 for c in compute], [m * 1e3 for m in comm]
    talking = [i for i, t in enumerate(tps) if t > 1]
    fig = go.Figure([
        go.Scatter(x=list(tps), y=[float(f"{v:.4g}") for v in compute], mode="lines+markers",
                   name=_("compute (3 × 24·b·s·h² / t FLOPs)"), line=dict(color="#4c78a8")),
        go.Scatter(x=[tps[i] for i in talking], y=[float(f"{comm[i]:.4g}") for i in talking],
                   mode="lines+markers", name=_("communication (4 all-reduces)"), line=dict(color="#e45756")),
    ])
    for other in others:  # the other links, for comparison
        fig.add_trace(go.Scatter(
            x=[tps[i] for i in talking], mode="lines", opacity=0.6, line=dict(color="#e45756", dash="dot"),
            y=[float(f"{tp_layer_step(tokens, hidden, tps[i], other, flops, bytes_per_value)[1] * 1e3:.4g}")
               for i in talking], name=_("communication on {link}").format(link=other.name.split(" (")[0])))
    c, m = tp_layer_step(tokens, hidden, tp, link, flops, bytes_per_value)
    fig.add_vline(x=tp, line=dict(color="gray", dash="dot"))
    if tps[-1] > GPUS_PER_NODE:  # a TP group this large spans nodes: its links are the slow ones
        fig.add_vrect(x0=GPUS_PER_NODE, x1=tps[-1] * 1.4, fillcolor="gray", opacity=0.08, line_width=0)
        fig.add_annotation(x=round(math.log10(GPUS_PER_NODE * 2.8), 4), y=1, yref="paper", yanchor="bottom",
                           text=_("beyond an {n}-GPU NVLink node (an NVL72 rack: 72)").format(n=GPUS_PER_NODE),
                           showarrow=False,
                           font_size=10)
    fig.update_xaxes(type="log", title=_("tensor-parallel degree t"), tickvals=list(tps))
    fig.update_yaxes(type="log", title=_("ms per layer, forward + backward"))
    fig.update_layout(
        title=dict(text=_("{link}: at t = {t}, compute {compute}, communication {communication} "
                          "(ratio {ratio:.2g})").format(link=_(link.name), t=tp, compute=_time(c),
                                                        communication=_time(m), ratio=m / c), font=dict(size=13)),
        template="plotly_white", height=420, width=720, margin=dict(l=60, r=20, t=60, b=100),
        legend=dict(orientation="h", x=0, y=-0.22, yanchor="top"))
    return fig


def cost_widget(machine: dict | None = None):
    """Sliders for h, t and b·s; a preset (``PRESETS``: H100 over NVLink 4 and over InfiniBand NDR,
    GB200 over NVLink 5, GB300 over ConnectX-8 between NVLink domains, and "this machine" when ``machine`` from
    ``planning.calibration.measure_machine()`` is given) whose bandwidth, α and device FLOP/s stay
    editable; below, ``cost_figure`` and ``summary`` redrawn in place.

    A plain figure in an Output widget rather than a FigureWidget, as in lesson 00 (a FigureWidget
    saves plotly's whole JavaScript bundle into the notebook)."""
    presets = dict(PRESETS)
    if machine is not None:
        presets["machine"] = (machine["link"], machine["flops"])
    style = dict(description_width="150px")
    layout = w.Layout(width="420px")
    d = DEFAULTS
    hidden = w.SelectionSlider(options=[1024, 2048, 4096, 8192, 12288, 16384, 20480, 25600], value=d["hidden"],
                               description=_("model width h"), style=style, layout=layout)
    tp = w.SelectionSlider(options=list(TPS), value=d["tp"], description=_("TP degree t"), style=style, layout=layout)
    tokens = w.SelectionSlider(options=[2**k for k in range(9, 17)], value=d["tokens"],
                               description=_("tokens b·s"), style=style, layout=layout)
    value_bytes = w.Dropdown(options=[(_("bf16 / fp16 (2 bytes)"), 2), (_("fp32 (4 bytes)"), 4)],
                             value=d["bytes_per_value"], description=_("activations"), style=style, layout=layout)
    preset = w.Dropdown(options=[(_(chosen.name), key) for key, (chosen, _flops) in presets.items()], value="nvlink4",
                        description=_("link"), style=style, layout=layout)
    bandwidth = w.BoundedFloatText(min=1e-3, max=1e5, description=_("bandwidth (GB/s)"), style=style, layout=layout)
    alpha = w.BoundedFloatText(min=0.0, max=1e6, description=_("latency α (µs)"), style=style, layout=layout)
    tflops = w.BoundedFloatText(min=1e-4, max=1e5, description=_("device (TFLOP/s)"), style=style, layout=layout)
    chart, text = w.Output(), w.HTML()
    busy = []  # set while a preset fills the three fields, so that they redraw once

    def link():
        return Link(presets[preset.value][0].name, bandwidth.value * 1e9, alpha.value * 1e-6)

    def update(change=None):
        if busy:
            return
        values = dict(hidden=hidden.value, tp=tp.value, tokens=tokens.value, flops=tflops.value * 1e12,
                      bytes_per_value=value_bytes.value)
        with chart:
            chart.clear_output(wait=True)
            # the other GPU link for comparison (this machine's link goes with a CPU's compute)
            others = [PRESETS[key][0] for key in PRESETS if key != preset.value] if preset.value in PRESETS else []
            display(cost_figure(link(), **values, others=others))
        n = tokens.value * hidden.value * value_bytes.value  # bytes each all-reduce sums
        text.value = f"<b>{summary(link(), **values)}</b><br>" + _(
            "each all-reduce sums {mb:.3g} MB; a ring sends {sent:.3g} MB per device, four times per layer (two in "
            "the forward, two in the backward)").format(mb=n / 1e6, sent=2 * (tp.value - 1) / tp.value * n / 1e6)

    def choose(change=None):
        chosen, flops = presets[preset.value]
        busy.append(True)
        bandwidth.value = round(chosen.bandwidth / 1e9, 3)
        alpha.value = round(chosen.latency * 1e6, 2)
        tflops.value = round(flops / 1e12, 4)
        busy.clear()
        update()

    for control in (hidden, tp, tokens, value_bytes, bandwidth, alpha, tflops):
        control.observe(update, "value")
    preset.observe(choose, "value")
    choose()
    return w.VBox([w.HBox([w.VBox([hidden, tp, tokens, value_bytes]), w.VBox([preset, bandwidth, alpha, tflops])]),
                   chart, text])
