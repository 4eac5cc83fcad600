"""Tables, a figure and the widget of lessons 15 and 16 (lessons/15_cost_model.ipynb, lessons/16_planner.ipynb): the
cost model and the planner, explained.

    from parallel_lab.planning import planner
    from parallel_lab.show import planner as pw
    result = planner.plan(pw.GPT3, pw.CLUSTER, 1536)
    print(pw.plans_table(result["plans"][:5]))          # where each plan's step time goes
    print(pw.rejections_table(result))                  # why the others fail, by kind of reason
    pw.breakdown_figure({"TP 4": row4, "TP 8": row8})   # stacked step-time parts (deterministic)
    print(pw.zero_table({"best": result["plans"][0]}))  # ZeRO stage, DP traffic exposed and hidden
    pw.planner_widget()                                 # cluster, bandwidth, memory, batch -> replan

The arithmetic is ``parallel_lab.planning`` (``planner``, ``cost``, ``memory_model``; the memory
model's checks against the course GPT's real tensors are ``planning.memory_check``); this module
formats, draws and wraps it for the lesson. Every table is deterministic text, so nbval compares it.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from parallel_lab.hardware import SYSTEMS
from parallel_lab.i18n import N_, _, _l, pad
from parallel_lab.planning import memory, memory_model, planner
from parallel_lab.planning.cost import tp_layer_step

GPT3 = memory.MODELS["GPT-3 175B"]
SYSTEM = SYSTEMS["DGX H100"]
CLUSTER = SYSTEM.cluster(64)  # 64 DGX H100 nodes: 512 GPUs of 80 GB, 8 per NVLink domain
BATCH = 1536  # GPT-3's batch: 1536 sequences of 2048 tokens (Brown et al. 2020)
PARTS = ("compute_s", "tp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s")
LABELS = {"compute_s": _l("compute"), "tp_comm_s": _l("TP all-reduce"), "bubble_s": _l("bubble"),
          "pp_comm_s": _l("PP send/recv"), "dp_comm_s": _l("DP exposed"), "dp_hidden_s": _l("DP hidden")}
COLUMNS = {"compute_s": _l("compute"), "tp_comm_s": "TP", "bubble_s": _l("bubble"), "pp_comm_s": "PP",
           "dp_comm_s": "DP"}
COLORS = {"compute_s": "#4c78a8", "tp_comm_s": "#e45756", "bubble_s": "#bab0ac",
          "pp_comm_s": "#f58518", "dp_comm_s": "#54a24b"}


# ----------------------------------------------------------------------------------------------
# Memory.


def in_flight_table(pp: int = 4, microbatches: int = 8) -> str:
    """Micro-batches' activations each pipeline rank holds at its peak, per schedule, counted until W
    (from the simulator, as ``memory_model`` uses them: ZB-H1 holds M_W = 32/34 of a micro-batch's
    activations from I until W, Qi et al. 2023, Table 1)."""
    lines = [pad(_("schedule"), 31) + "".join(pad(_("rank {rank}").format(rank=r), 8, ">") for r in range(pp))]
    for name, v in (("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)):
        label = name + (_(" (v={v}, chunks)").format(v=v) if v > 1 else "")
        lines.append(pad(label, 31) + "".join(f"{x:>8.3g}" for x in memory_model.in_flight(name, pp, microbatches, v)))
    return "\n".join(lines)


def param_check_table(rows: list[dict]) -> str:
    """Lesson 15: each pipeline stage's parameters, memory model against the real modules
    (``memory_check.param_check`` rows), and whether every stage agrees."""
    lines = [f"{'pp':>3} {pad(_('stage'), 6, '>')} {'memory_model':>13} {pad(_('real modules'), 13, '>')}"]
    lines += [f"{r['pp']:>3} {r['stage']:>6} {r['model']:>13,} {r['real']:>13,}" for r in rows]
    lines.append(_("every stage equal: {equal}").format(equal=all(r["model"] == r["real"] for r in rows)))
    return "\n".join(lines)


def activation_check_table(rows: list[dict]) -> str:
    """Lesson 15: one block's saved bytes per recomputation mode, formula against autograd's count
    (``memory_check.activation_check`` rows), and whether the difference is the per-token statistics."""
    lines = [f"{pad(_('recompute'), 10)} {pad(_('formula'), 9, '>')} {pad(_('measured'), 9, '>')} "
             f"{pad(_('difference'), 10, '>')}  {_('difference = per-token statistics?')}"]
    for r in rows:
        diff = r["measured"] - r["formula"]
        lines.append(f"{r['recompute']:<10} {r['formula']:>9,} {r['measured']:>9,} {diff:>10,}  {diff == r['stats']}")
    return "\n".join(lines)


def device_memory_line(mine: dict) -> str:
    """Lesson 15's try-it line: the parameters and the GB of each entry of a ``my_device_memory`` answer."""
    names = {"weights": _("weights"), "gradients": _("gradients"), "optimizer": _("optimizer"),
             "activations": _("activations")}
    parts = _(", ").join(f"{names[key]} {mine[key] / 1e9:.1f} GB" for key in names)
    return _("{billions:.2f} billion parameters; {parts}").format(billions=mine["params"] / 1e9, parts=parts)


def memory_table(rows: dict) -> str:
    """GB per device of the most loaded stage for each labelled configuration: ``rows`` maps a label
    to the keyword arguments of ``memory_model.max_device_memory`` (model included)."""
    lines = [f"{pad(_('configuration'), 40)} {pad(_('weights'), 8, '>')} {pad(_('grads'), 6, '>')} {'Adam':>6} "
             f"{pad(_('buffers'), 7, '>')} {pad(_('activ.'), 7, '>')} {pad(_('total'), 7, '>')}  "
             f"{_('stage, in flight')}"]
    for label, kwargs in rows.items():
        m = memory_model.max_device_memory(**kwargs)
        gb = {k: m[k] / memory.GB for k in ("weights", "gradients", "optimizer", "buffers", "activations", "total")}
        lines.append(f"{pad(label, 40)} {gb['weights']:>8.1f} {gb['gradients']:>6.1f} {gb['optimizer']:>6.1f} "
                     f"{gb['buffers']:>7.1f} {gb['activations']:>7.1f} {gb['total']:>7.1f}  "
                     f"{m['stage']}, {m['in_flight']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Plans.


def plan_name(p: dict) -> str:
    """``dp 8 x pp 16 x tp 4, zb-h1, m 192, selective`` (and ``, ZeRO-1`` where it shards)."""
    schedule = p["schedule"] + (f" v={p['virtual']}" if p.get("virtual", 1) > 1 else "")
    zero = f", ZeRO-{p['zero']}" if p.get("zero") else ""
    return f"dp {p['dp']} x pp {p['pp']} x tp {p['tp']}, {schedule}, m {p['microbatches']}, {p['recompute']}{zero}"


def plans_table(plans: list[dict]) -> str:
    """The plans with their ZeRO stage (``Z``), their step time split into the planner's parts
    (seconds; ``DP`` is the exposed data-parallel communication, ``hidden`` what the backward hid of
    it, not in the step) and their memory."""
    lines = [f"{'dp':>3} {'pp':>3} {'tp':>3} {'Z':>1} {pad(_('schedule'), 20)} {pad(_('recompute'), 9)} {'m':>4} "
             + " ".join(pad(COLUMNS[k], 7, ">") for k in PARTS)
             + f" {pad(_('hidden'), 7, '>')} {pad(_('step s'), 7, '>')} {'GB':>5}"]
    for p in plans:
        schedule = p["schedule"] + (f" v={p['virtual']}" if p["virtual"] > 1 else "")
        parts = " ".join(f"{p['breakdown'][k]:>7.2f}" for k in PARTS)
        lines.append(f"{p['dp']:>3} {p['pp']:>3} {p['tp']:>3} {p.get('zero', 0):>1} {schedule:<20} {p['recompute']:<9} "
                     f"{p['microbatches']:>4} {parts} {p['breakdown'].get('dp_hidden_s', 0.0):>7.2f} "
                     f"{p['step_s']:>7.2f} {p['memory_gb']:>5.1f}")
    return "\n".join(lines)


def best_plan(plans: list[dict], **match) -> dict | None:
    """The fastest plan whose fields equal ``match`` (``tp=8, schedule="1f1b"``), or None."""
    found = [p for p in plans if all(p.get(k) == v for k, v in match.items())]
    return min(found, key=lambda p: p["step_s"]) if found else None


def rejections_table(result: dict) -> str:
    """The planner's rejections grouped by kind (``planner.reason_group``): count, and one example
    (the first) with its reason in the lesson's language (``planner.reason_text``, from the row's kind
    and values). A layout that cannot work at all counts once; a memory rejection once per schedule and
    recomputation tried, with the nearest miss (the least memory needed) beside the first."""
    groups: dict[str, list[dict]] = {}
    for r in result["rejected"]:
        groups.setdefault(planner.reason_group(r), []).append(r)
    lines = [_("{considered} candidates considered: {feasible} fit, {rejected} rejected").format(
        considered=result["considered"], feasible=result["feasible"], rejected=len(result["rejected"]))]
    for group, rows in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"{len(rows):>4} x {_(group)}")
        examples = [(_("e.g."), rows[0])]
        memory_rows = [r for r in rows if r["kind"] == "memory"]
        if len(memory_rows) > 1:  # the largest and the nearest miss
            examples.append((_("nearest miss:"), min(memory_rows, key=lambda r: r["values"]["need_gb"])))
        for label, r in examples:
            layout = "dp {dp} x pp {pp} x tp {tp}".format(**r["plan"])
            extra = "".join(f", {r['plan'][k]}" for k in ("schedule", "recompute") if k in r["plan"])
            extra += f", ZeRO-{r['plan']['zero']}" if "zero" in r["plan"] else ""
            lines.append(f"       {label} {layout}{extra}: {planner.reason_text(r)}")
    return "\n".join(lines)


def breakdown_figure(plans: dict, title: str | None = None, parts=PARTS):
    """Horizontal stacked bars: for each labelled plan, its step time split into the planner's
    ``parts`` (all five by default; leave out ``compute_s`` to see the overheads). Deterministic
    (values rounded to 3 decimals) and compact, so nbval compares it."""
    labels = list(plans)
    fig = go.Figure([go.Bar(name=str(LABELS[k]), y=labels, x=[round(plans[n]["breakdown"][k], 3) for n in labels],
                            orientation="h", marker_color=COLORS[k]) for k in parts])
    fig.update_layout(template="none", plot_bgcolor="white", barmode="stack", height=170 + 45 * len(labels),
                      margin=dict(l=200, r=20, t=50, b=110), font=dict(family="sans-serif", size=12),
                      title=title or _("Where a training step goes (predicted, seconds)"), title_x=0.01,
                      xaxis=dict(title=_("seconds per step"), gridcolor="#e5e5e5"),
                      yaxis=dict(autorange="reversed"),
                      legend=dict(orientation="h", x=0, y=-0.45, yanchor="top", traceorder="normal"))
    return fig


def zero_table(plans: dict) -> str:
    """Labelled plans side by side for ZeRO (lesson 16, section 6): layout, stage, GB per GPU, the
    DP/ZeRO communication of a step (all of it, and the part the backward could not hide) and the
    step (``planner.plan`` rows, or ``None`` for "no plan")."""
    lines = [f"{pad(_('plan'), 34)} {pad(_('layout'), 22)} {'ZeRO':>4} {'GB':>5} {pad(_('DP comm s'), 10, '>')} "
             f"{pad(_('exposed s'), 10, '>')} {pad(_('step s'), 7, '>')}"]
    for label, p in plans.items():
        if p is None:
            lines.append(f"{pad(label, 34)} {pad(_('no plan fits'), 22)}")
            continue
        b = p["breakdown"]
        layout = f"dp {p['dp']} x pp {p['pp']} x tp {p['tp']}"
        lines.append(f"{pad(label, 34)} {layout:<22} {p['zero']:>4} {p['memory_gb']:>5.1f} "
                     f"{b['dp_comm_s'] + b['dp_hidden_s']:>10.2f} {b['dp_comm_s']:>10.2f} {p['step_s']:>7.2f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Why TP stays inside a node, in the planner's own model.


def tp_link_table(model=GPT3, system=SYSTEM, micro_batch: int = 1, tps=(2, 4, 8, 16)) -> str:
    """Per transformer layer and micro-batch, on one device: the compute time of the forward and
    backward against tensor parallelism's four all-reduces inside the NVLink domain and over the
    network (``planning.cost.tp_layer_step`` on ``system``'s links and achieved FLOP/s: the same
    computation and numbers as lessons 02 and 11)."""
    tokens, flops = model.seq * micro_batch, system.tflops * 1e12
    lines = [f"{'tp':>3} {pad(_('compute ms'), 10, '>')} {pad(_('4 all-reduces, NVLink ms'), 25, '>')} "
             f"{pad(_('(share)'), 8, '>')} {pad(_('4 all-reduces, network ms'), 26, '>')} {pad(_('(share)'), 8, '>')}"]
    for tp in tps:
        compute, intra = tp_layer_step(tokens, model.hidden, tp, system.nvlink, flops)
        inter = tp_layer_step(tokens, model.hidden, tp, system.network, flops)[1]
        lines.append(f"{tp:>3} {compute * 1e3:>10.2f} {intra * 1e3:>25.2f} {intra / (compute + intra):>8.0%} "
                     f"{inter * 1e3:>26.2f} {inter / (compute + inter):>8.0%}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Cost.


def cost_table(plan: dict, prices=(1.0, 2.0, 4.0), tokens: float = planner.GPT3_TOKENS) -> str:
    """GPU-hours, days and price of training on ``tokens`` tokens with ``plan``, for each price in $
    per GPU-hour (``planner.training_cost``)."""
    base = planner.training_cost(plan, tokens, 1.0)
    lines = [_("{plan}: {steps:,.0f} steps of {step:.2f} s on {gpus} GPUs = {days:.1f} days, {hours:,.0f} "
               "GPU-hours").format(plan=plan_name(plan), steps=base["steps"], step=plan["step_s"],
                                   gpus=plan["world_size"], days=base["days"], hours=base["gpu_hours"])]
    for price in prices:
        lines.append("  " + _("at ${price:.2f} per GPU-hour: ${cost:,.0f}").format(
            price=price, cost=planner.training_cost(plan, tokens, price)["cost"]))
    return "\n".join(lines)


def plan_cost_line(dp: int, pp: int, tp: int, microbatches: int, schedule: str, step_s: float, cost: dict) -> str:
    """One plan's step, days, GPU-hours and price (``planner.training_cost``'s ``cost``), as lesson 18
    compares two plans."""
    return _("dp {dp:>2} x pp {pp:>2} x tp {tp}, {schedule:<6} m={m:<3}: {step:6.1f} s per step, {days:5.1f} days, "
             "{hours:,.0f}k GPU-hours, ${cost:,.2f}M").format(
        dp=dp, pp=pp, tp=tp, schedule=schedule, m=microbatches, step=step_s, days=cost["days"],
        hours=cost["gpu_hours"] / 1e3, cost=cost["cost"] / 1e6)


# ----------------------------------------------------------------------------------------------
# The widget.


def planner_widget(layers: int = 96, hidden: int = 12288, heads: int = 96, vocab: int = 50257, seq: int = 2048,
                   batch: int = BATCH, nodes: int = 64, gpus_per_node: int = 8, gpu_mem_gb: float = 80,
                   intra_gbps: float = 450, inter_gbps: float = 50, tflops: float = SYSTEM.tflops,
                   price: float = 2.0):
    """Controls for the cluster (nodes, GPUs per node, memory, links, throughput), the batch and the
    price; *Plan* runs ``planner.plan_from_args`` (a second or two for 512 GPUs) and shows the five
    fastest plans with their breakdown, the cost of the best one and the rejections by kind."""
    style, layout = dict(description_width="150px"), w.Layout(width="420px")

    def slider(kind, value, options, description):
        return kind(options=options, value=value, description=description, style=style, layout=layout)

    controls = dict(
        nodes=slider(w.SelectionSlider, nodes, [1, 2, 4, 8, 16, 32, 64, 128, 256], _("nodes")),
        gpus_per_node=slider(w.SelectionSlider, gpus_per_node, [4, 8, 16, 36, 72], _("GPUs per NVLink domain")),
        gpu_mem_gb=slider(w.SelectionSlider, gpu_mem_gb, [16, 24, 40, 48, 80, 96, 141, 180, 186],
                          _("GPU memory, GB")),
        intra_gbps=slider(w.SelectionSlider, intra_gbps, [50, 100, 150, 300, 450, 900], _("NVLink GB/s per GPU")),
        inter_gbps=slider(w.SelectionSlider, inter_gbps, [3, 6, 12.5, 25, 50, 100], _("network GB/s per GPU")),
        tflops=slider(w.SelectionSlider, tflops, [50, 100, 150, 300, SYSTEM.tflops, 900.0, 1000.0],
                      _("achieved TFLOP/s")),
        batch=slider(w.SelectionSlider, batch, [128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096],
                     _("batch (sequences)")),
        price=w.BoundedFloatText(value=price, min=0, max=100, step=0.25, description=_("$ per GPU-hour"),
                                 style=style, layout=layout),
    )
    button = w.Button(description=_("Plan"), button_style="primary")
    out = w.Output()

    def run(button=None):
        values = {k: c.value for k, c in controls.items()}
        with out:
            out.clear_output(wait=True)
            print(_("planning ..."))
            try:
                result = planner.plan_from_args(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq,
                                                top=5, **values)
            except ValueError as exc:
                out.clear_output(wait=True)
                print(_("cannot plan: {reason}").format(reason=exc))
                return
            out.clear_output(wait=True)
            if result["plans"]:
                print(plans_table(result["plans"]))
                print()
                print(cost_table(result["plans"][0], prices=(values["price"],)))
            else:
                print(_("no plan fits: more GPUs, more memory per GPU, or a smaller batch"))
            print()
            print(rejections_table(result))

    button.on_click(run)
    run()
    boxes = list(controls.values())
    return w.VBox([w.HBox([w.VBox(boxes[:4]), w.VBox(boxes[4:])]), button, out])


# What lesson 16's own cells print around the tables, in the lesson's language (the values are the run's).
LINES = {
    "planning": N_("planning {gpus} GPUs (a few seconds) ..."),
    "fastest": N_("{feasible} plans fit; the ten fastest (seconds per step, GB on the fullest GPU):"),
    "h100-1f1b": N_("DGX H100, 1F1B only, the five fastest:"),
    "a100-1f1b": N_("DGX A100 (312 TFLOP/s peak, NVLink 3 at 300 GB/s, HDR at 25 GB/s), 1F1B only, "
                    "the three fastest:"),
    "tp-ratio": N_("TP 8 × PP 8's all-reduce time per step over TP 4 × PP 16's, dp 8, 192 micro-batches"),
    "planner-model": N_("the planner's model"),
    "tp4-zbh1": N_("TP 4, ZB-H1 (best)"),
    "tp8-zbh1": N_("TP 8, ZB-H1"),
    "tp4-1f1b": N_("TP 4, 1F1B"),
    "tp8-1f1b": N_("TP 8, 1F1B (Megatron-style)"),
    "compare-header": N_("seconds per step"),
    "step": N_("step"),
    "tp-figure": N_("GPT-3 175B on 512 GPUs: the step beyond compute (seconds)"),
    "ends": N_("TP 2 x PP 32 x DP 8, ZB-H1, ZeRO-1, ends={ends!s:<5}: step {step:.2f} s"),
    "section-1": N_("result['plans'][0] (section 1)       : step {step:.2f} s"),
    "inside": N_("TP 8 inside nodes  : step {step:6.1f} s, TP all-reduces {tp:5.1f} s"),
    "across": N_("TP 16 across nodes : step {step:6.1f} s, TP all-reduces {tp:5.1f} s"),
    "extra-cost": N_("the best TP 8 + 1F1B plan would cost ${extra:,.0f} more ({slower:.1%} slower)"),
    "smaller": N_("{nodes} x {system} (8 GPUs of {gb:g} GB): {feasible} plans fit; the three fastest:"),
    "running": N_("running parallel-lab {args} ... (a few seconds)"),
    "exit": N_("exit status {code}"),
    "pure-dp": N_("pure DP, ZeRO-{zero}"),
    "best-3d": N_("best plan (3D + ZeRO)"),
    "pure-zero3": N_("pure DP + ZeRO-3"),
    "flat-zero3": N_("pure DP + ZeRO-3, 450 GB/s network"),
    "zero3-slower": N_("ZeRO-3 is {slower:.0%} slower than the best plan"),
    "zero3-figure": N_("GPT-3 175B on 512 H100s: 3D parallelism against ZeRO-3 (seconds)"),
}


def line(key: str, **values) -> str:
    """One of ``LINES`` in the lesson's language, filled with ``values``."""
    return _(LINES[key]).format(**values)
