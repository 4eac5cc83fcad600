"""Figures and tables of lesson 12, sharding the model state (lessons/12_zero_sharding.ipynb).

    from parallel_lab.show import zero as zf
    zf.stage_memory_figure()                   # ZeRO's Figure 1: bytes per GPU by stage (formula)
    reports = {s: run_zero(stage=s, dp=4) for s in range(4)}
    print(zf.equality_table(reports))          # every stage against one process
    print(zf.memory_table(reports)); zf.memory_figure(reports)     # measured vs predicted bytes
    print(zf.traffic_table(reports)); zf.traffic_figure(reports)   # bytes per step, in units of Ψ
    zf.overlap_gantt(report)                   # compute and collectives per rank, virtual clock
    print(zf.link_table())                     # one step's traffic on NVLink and between nodes

The arithmetic is the engine's (``parallel_lab.zero.memory``, ``zero.traffic``, ``zero.overlap``);
the measured numbers are a ``run_zero`` report's. Memory and traffic are byte counts, deterministic,
so nbval compares those figures; the Gantt chart shows thread CPU time (the virtual clock) and is
not deterministic. Sources: Rajbhandari et al. 2020 ("ZeRO", Figure 1 and section 7), Zhao et al.
2023 ("PyTorch FSDP"), Li et al. 2020 ("PyTorch Distributed", buckets and overlap).
"""

from __future__ import annotations

from typing import Mapping

import plotly.graph_objects as go

from parallel_lab.hardware import SYSTEMS
from parallel_lab.i18n import _, _l, ngettext, pad, pgettext
from parallel_lab.i18n import width as text_width
from parallel_lab.planning import memory as planning_memory
from parallel_lab.show.pipeline import plain_layout
from parallel_lab.zero import memory, traffic

PARTS = ("parameters", "gradients", "optimizer", "buffers")
LABELS = {"parameters": _l("parameters"), "gradients": _l("gradients"), "optimizer": _l("Adam state"),
          "buffers": _l("full units in use (transient)"), "activations": _l("activations")}
SHORT = {"parameters": _l("parameters"), "gradients": _l("gradients"), "optimizer": _l("Adam state"),
         "buffers": _l("full units in use")}
COLORS = {"parameters": "#4c78a8", "gradients": "#f58518", "optimizer": "#e45756", "buffers": "#b279a2",
          "activations": "#72b7b2", "compute": "#4c78a8", "all_reduce": "#e45756",
          "reduce_scatter_single": "#f58518", "all_gather_single": "#54a24b"}
STAGE_NAMES = {0: _l("stage 0 (DP)"), 1: _l("stage 1 (P_os)"), 2: _l("stage 2 (P_os+g)"), 3: _l("stage 3 (P_os+g+p)")}
OP_NAMES = {"all_reduce": "all-reduce", "reduce_scatter_single": "reduce-scatter",
            "all_gather_single": "all-gather"}


def _bar_layout(title: str, yaxis: str, **changes) -> dict:
    return plain_layout(**{"title": title, "barmode": "stack", "height": 400,
                           "yaxis": dict(title=yaxis, gridcolor="#e5e5e5"), **changes})


# ----------------------------------------------------------------------------------------------
# The formula.


def stage_memory(params: float = 7.5e9, dp: int = 64, value_bytes: float = 2, adam_bytes: float = 12,
                 activations: float = 0) -> list[dict]:
    """Per stage, bytes on one of ``dp`` GPUs (``zero.memory.per_rank``, no transient units):
    ``parameters``, ``gradients``, ``optimizer``, ``activations`` (the same at every stage: each GPU
    runs its own slice of the batch) and ``total``. Defaults: ZeRO's Figure 1, Ψ = 7.5B, N = 64, K = 12."""
    rows = []
    for stage in memory.STAGES:
        row = memory.per_rank(params, dp, stage, value_bytes, adam_bytes=adam_bytes)
        out = {"stage": stage, **{k: row[k] for k in ("parameters", "gradients", "optimizer")}}
        out["activations"] = activations
        out["total"] = row["total"] + activations
        rows.append(out)
    return rows


def four_way(model: str = "GPT-3 6.7B", dp: int = 64, micro_batch: int = 1) -> list[dict]:
    """``stage_memory`` for one of lesson 00's models (``planning.memory.MODELS``) in mixed precision,
    with the activations of one micro-batch of ``micro_batch`` sequences (Korthikanti et al. 2022's
    count, ``planning.memory.activations``): the four ways training memory splits."""
    m = planning_memory.MODELS[model]
    acts = planning_memory.activations(m, micro_batch)
    return stage_memory(m.params, dp, 2, 12, acts)


def four_way_figure(model: str = "GPT-3 6.7B", dp: int = 64, micro_batch: int = 1) -> go.Figure:
    """``stage_memory_figure`` of ``four_way``'s rows, titled with the model, the GPUs and the sequences
    each GPU holds, in the lesson's language."""
    seq = planning_memory.MODELS[model].seq
    sequences = ngettext("one {seq}-token sequence each", "{n} {seq}-token sequences each", micro_batch).format(
        n=micro_batch, seq=seq)
    return stage_memory_figure(four_way(model, dp, micro_batch), title=_(
        "{model} on {dp} GPUs, {sequences}: bytes per GPU").format(model=model, dp=dp, sequences=sequences))


def stage_memory_figure(rows=None, title: str | None = None) -> go.Figure:
    """Stacked bars, GB per GPU by stage, from ``stage_memory`` or ``four_way`` rows (default:
    ZeRO's Figure 1, Ψ = 7.5B, N = 64, mixed precision: 120, 31.4, 16.6, 1.9 GB)."""
    rows = stage_memory() if rows is None else rows
    fig = go.Figure()
    stages = [str(STAGE_NAMES[r["stage"]]) for r in rows]
    for part in ("parameters", "gradients", "optimizer", "activations"):
        values = [round(r[part] / 1e9, 3) for r in rows]
        if any(values):
            fig.add_bar(name=str(LABELS[part]), x=stages, y=values, marker_color=COLORS[part])
    for stage, r in zip(stages, rows):
        fig.add_annotation(x=stage, y=round(r["total"] / 1e9, 3), text=f"{r['total'] / 1e9:.1f} GB",
                           showarrow=False, yshift=10)
    return fig.update_layout(**_bar_layout(title or _("Bytes per GPU by ZeRO stage (Rajbhandari et al. 2020, "
                                                      "Figure 1)"), _("GB per GPU")))


# ----------------------------------------------------------------------------------------------
# Real runs: ``run_zero`` reports keyed by stage.


QUESTIONS = {"zero3-share": _l("stage 3's bytes per rank as a share of stage 0's, dp = 4"),
             "zero3-traffic": _l("values moved per rank and step at ZeRO stage 3")}


def question(prediction_id: str) -> str:
    """The question of one of the lesson's ungraded predictions, in the lesson's language."""
    return str(QUESTIONS[prediction_id])


def equality_table(reports: Mapping[int, dict]) -> str:
    """Per report: stage, dp, max parameter difference and loss difference against one process."""
    lines = [f"{pad(_('stage'), 5)}  dp  {pad(_('steps'), 5)}  {pad(_('max |param - one process|'), 25)}  "
             f"{pad(_('max |loss - one process|'), 24)}  {_('same to 1e-10')}", "-" * 84]
    for stage, r in reports.items():
        same = r["max_param_diff"] < 1e-10 and r["loss_diff"] < 1e-10
        lines.append(f"{stage:>5} {r['dp']:>3} {r['steps']:>6} {_tiny(r['max_param_diff']):>26} "
                     f"{_tiny(r['loss_diff']):>25}  {_('yes') if same else _('NO')}")
    return "\n".join(lines)


def _tiny(x: float) -> str:
    """A difference near rounding, as a deterministic bound (its exact last bits vary with the sum order)."""
    return "< 1e-10" if x < 1e-10 else f"{x:.1e}"


def memory_rows(reports: Mapping[int, dict]) -> list[dict]:
    """Per stage and category (``PARTS`` and ``total``): measured peak and predicted bytes per rank."""
    rows = []
    for stage, r in reports.items():
        for part in (*PARTS, "total"):
            cell = r["memory_per_rank"][part]
            rows.append({"stage": stage, "dp": r["dp"], "part": part, "measured": int(cell["measured"]),
                         "predicted": int(round(cell["predicted"]))})
    return rows


def memory_table(reports: Mapping[int, dict]) -> str:
    """Measured / predicted bytes per rank, per stage and category, and the total against stage 0's."""
    rows = memory_rows(reports)
    head = f"{pad(_('stage'), 5, '>')} {'dp':>3}  " + "  ".join(pad(SHORT[p], 21, ">") for p in PARTS) + \
        f"  {pad(_('total'), 21, '>')}  {pad(_('of stage 0'), 10, '>')}"
    lines = [head, _("measured / predicted bytes per rank (peak of each category)"), "-" * text_width(head)]
    first = None
    for stage in reports:
        cells = {row["part"]: row for row in rows if row["stage"] == stage}
        total = cells["total"]["measured"]
        first = total if first is None else first
        text = "  ".join(f"{cells[p]['measured']:>10,}/{cells[p]['predicted']:<10,}" for p in (*PARTS, "total"))
        lines.append(f"{stage:>5} {reports[stage]['dp']:>3}  {text}  {total / first:>10.0%}")
    return "\n".join(lines)


def memory_figure(reports: Mapping[int, dict], title: str | None = None) -> go.Figure:
    """Stacked bars of the measured peak bytes per rank by stage and category, with the formula's
    total as a marker on each bar."""
    rows = memory_rows(reports)
    stages = [str(STAGE_NAMES[s]) for s in reports]
    fig = go.Figure()
    for part in PARTS:
        fig.add_bar(name=_("{part} (measured)").format(part=LABELS[part]), x=stages,
                    y=[row["measured"] / 1e6 for row in rows if row["part"] == part], marker_color=COLORS[part])
    fig.add_scatter(name=_("formula (zero.memory)"), x=stages, mode="markers",
                    y=[row["predicted"] / 1e6 for row in rows if row["part"] == "total"],
                    marker=dict(symbol="line-ew-open", size=40, line=dict(width=3, color="black")))
    dp = {r["dp"] for r in reports.values()}
    title = title or _("Model state per rank, measured on dp = {dp} ranks").format(dp=", ".join(map(str, sorted(dp))))
    return fig.update_layout(**_bar_layout(title, _("MB per rank (fp64)")))


def traffic_rows(reports: Mapping[int, dict]) -> list[dict]:
    """Per stage: the collectives of one step (commlog, rank 0) and the volume measured and predicted
    (``zero.traffic``), in bytes and in units of Ψ (values of 8 bytes)."""
    rows = []
    for stage, r in reports.items():
        psi_bytes = r["params"] * {"float64": 8, "float32": 4}[r["dtype"]]
        t = r["traffic_per_step"]
        rows.append({"stage": stage, "dp": r["dp"], "collectives": {op: dict(v) for op, v in r["collectives"].items()},
                     "measured": t["measured"], "predicted": t["predicted"],
                     "measured_psi": round(t["measured"] / psi_bytes, 3),
                     "predicted_psi": round(t["predicted"] / psi_bytes, 3)})
    return rows


def traffic_table(reports: Mapping[int, dict]) -> str:
    """One step's collectives per stage and the volume per rank, measured and predicted, in Ψ."""
    lines = [f"{pad(_('stage'), 5, '>')} {'dp':>3}  "
             f"{pad(_('collectives in one step (calls, bytes this rank passed in)'), 62)} "
             f"{pad(_('measured'), 9, '>')} {pad(_('predicted'), 9, '>')}", "-" * 92]
    for row in traffic_rows(reports):
        calls = ", ".join(f"{OP_NAMES.get(op, op)} {v['count']}x {v['bytes']:,} B"
                          for op, v in sorted(row["collectives"].items()))
        lines.append(f"{row['stage']:>5} {row['dp']:>3}  {calls:<62} {row['measured_psi']:>8g}Ψ "
                     f"{row['predicted_psi']:>8g}Ψ")
    return "\n".join(lines)


def traffic_figure(reports: Mapping[int, dict]) -> go.Figure:
    """Bars: values moved per rank and step by stage, in units of Ψ, measured and predicted."""
    rows = traffic_rows(reports)
    stages = [str(STAGE_NAMES[row["stage"]]) for row in rows]
    fig = go.Figure()
    fig.add_bar(name=_("measured (commlog)"), x=stages, y=[row["measured_psi"] for row in rows],
                marker_color="#4c78a8")
    fig.add_bar(name=_("ZeRO section 7 (2Ψ, 3Ψ)"), x=stages, y=[row["predicted_psi"] for row in rows],
                marker_color="#bab0ac")
    return fig.update_layout(**_bar_layout(_("Communication per rank and step"), _("values moved, in units of Ψ"),
                                           barmode="group"))


# ----------------------------------------------------------------------------------------------
# Overlap on the virtual clock.


def comm_order(report: dict, rank: int = 0) -> list[str]:
    """The collectives of the last step in the order the network ran them: ``"all-gather blocks.0"``
    (deterministic: the engine's order, not their times)."""
    return [f"{OP_NAMES.get(op, op)} {unit}" for op, unit, _, _ in report["timeline"]["virtual"]["comm"][rank]]


def comm_orders(reports: Mapping[int, dict]) -> str:
    """Per stage, the collectives of the last step in the order the network ran them (``comm_order``)."""
    return "\n".join(_("stage {stage}, in the order the network ran them:").format(stage=stage) + "\n  "
                      + ", ".join(comm_order(r)) for stage, r in reports.items())


def overlap_summary(reports: Mapping[int, dict]) -> str:
    """Per stage, the step with and without overlap on the virtual clock, the time the compute waited
    for the network in each, and the difference: the communication that ran under compute."""
    lines = []
    for stage, r in reports.items():
        v = r["virtual"]
        lines.append(_("stage {stage}: step {step:.1f} ms with overlap, {serial:.1f} ms serial; the compute waited "
                       "{waited:.1f} ms against {serial_waited:.1f} ms: {hidden:.1f} ms of communication ran under "
                       "compute").format(stage=stage, step=v["step_s"] * 1e3, serial=v["serial_step_s"] * 1e3,
                                         waited=v["waiting_s"] * 1e3, serial_waited=v["serial_waiting_s"] * 1e3,
                                         hidden=(v["serial_waiting_s"] - v["waiting_s"]) * 1e3))
    return "\n".join(lines)


def units_in_use(reports: Mapping[int, dict]) -> str:
    """Per stage, the bytes of full units in use (measured and ``zero.memory``'s prediction)."""
    return "\n".join(_("stage {stage}, overlap: full units in use {measured:,} bytes measured, {predicted:,} "
                        "predicted").format(stage=stage, measured=r["memory_per_rank"]["buffers"]["measured"],
                                            predicted=int(r["memory_per_rank"]["buffers"]["predicted"]))
                      for stage, r in reports.items())


def overlap_gantt(report: dict, which: str = "virtual", title: str | None = None) -> go.Figure:
    """Per rank two lanes, compute (thread CPU time) and network (collectives at their α–β cost on
    ``report["link"]``), of the last step as ``zero.overlap.place`` laid it out; ``which``:
    ``"virtual"`` (as run: with ``--overlap`` collectives in flight during compute) or ``"serial"``
    (every wait right after its issue). Milliseconds on the virtual clock: not deterministic."""
    timeline = report["timeline"][which]
    ranks = len(timeline["compute"])
    lane = {kind: _("rank {rank} compute") if kind == "compute" else _("rank {rank} network")
            for kind in ("compute", "network")}
    lanes = [lane[kind].format(rank=r) for r in range(ranks) for kind in ("compute", "network")]
    fig = go.Figure()
    kinds: dict[str, list] = {}
    for r in range(ranks):
        for label, start, end in timeline["compute"][r]:
            kind = "adam" if label.startswith("adam") else label.split(" ")[0]
            kinds.setdefault(("compute", kind), []).append((lane["compute"].format(rank=r), start, end, label))
        for op, unit, start, end in timeline["comm"][r]:
            label = f"{OP_NAMES.get(op, op)} {unit}"
            kinds.setdefault(("comm", op), []).append((lane["network"].format(rank=r), start, end, label))
    shades = {"F": "#4c78a8", "B": "#72b7b2", "adam": "#9d755d", "start": "#bab0ac", "step": "#bab0ac"}
    for (where, kind), bars in kinds.items():
        name = {"F": _("forward"), "B": _("backward"), "adam": "Adam", "start": pgettext("zero timeline", "start"),
                "step": pgettext("zero timeline", "step"), "end": pgettext("zero timeline", "end")}.get(
            kind, OP_NAMES.get(kind, kind))
        color = COLORS.get(kind) if where == "comm" else shades.get(kind, "#bab0ac")
        fig.add_bar(name=name, orientation="h", y=[b[0] for b in bars],
                    x=[round((b[2] - b[1]) * 1e3, 4) for b in bars], base=[round(b[1] * 1e3, 4) for b in bars],
                    text=[b[3] for b in bars], hovertemplate="%{text}<br>%{base:.3f}–%{x:.3f} ms<extra></extra>",
                    marker_color=color, marker_line_width=0)
    span = timeline["makespan"] * 1e3
    kind = _("with overlap") if report["overlap"] and which == "virtual" else _("serial (no overlap)")
    return fig.update_layout(**plain_layout(
        title=title or _("ZeRO stage {stage}, dp = {dp}, {kind}: step {span:.2f} ms").format(
            stage=report["stage"], dp=report["dp"], kind=kind, span=span),
        barmode="overlay", height=120 + 45 * len(lanes),
        xaxis=dict(title=_("virtual clock, ms (thread CPU time + {link} modelled)").format(link=report["link"]["name"]),
                   gridcolor="#e5e5e5", range=[0, span * 1.02]),
        yaxis=dict(categoryorder="array", categoryarray=lanes[::-1], gridcolor="#e5e5e5")))


# ----------------------------------------------------------------------------------------------
# Where ZeRO-3 loses.


def link_rows(params: float = 7.5e9, dp: int = 64, value_bytes: float = 2, tokens_per_gpu: int = 2048,
              system: str = "DGX H100") -> list[dict]:
    """Per stage, one step's communication on a ring (``zero.traffic.per_step``'s ``ring_sent`` over
    a link's bandwidth, latency left out) inside a node (NVLink) and between nodes, and the step's
    compute, 6·Ψ·tokens FLOPs (forward 2, backward 4) at ``system``'s achieved rate."""
    s = SYSTEMS[system]
    compute = 6 * params * tokens_per_gpu / (s.tflops * 1e12)
    rows = []
    for stage in memory.STAGES:
        sent = traffic.per_step(params, dp, stage, value_bytes)["ring_sent"]
        rows.append({"stage": stage, "gb_sent": sent / 1e9, "nvlink_s": sent / s.nvlink.bandwidth,
                     "network_s": sent / s.network.bandwidth, "compute_s": compute})
    return rows


def link_table(params: float = 7.5e9, dp: int = 64, value_bytes: float = 2, tokens_per_gpu: int = 2048,
               system: str = "DGX H100") -> str:
    """``link_rows`` as text."""
    s = SYSTEMS[system]
    on = _("on {link}")
    lines = [_("Ψ = {psi:g}B, N = {dp}, {bytes:g}-byte values, {tokens} tokens per GPU per step, {system}").format(
        psi=params / 1e9, dp=dp, bytes=value_bytes, tokens=tokens_per_gpu, system=system),
             f"{pad(_('stage'), 5, '>')} {pad(_('GB sent per GPU'), 16, '>')} "
             f"{pad(on.format(link=s.nvlink.name.split(' (')[0]), 18, '>')} "
             f"{pad(on.format(link=s.network.name.split(' (')[0]), 26, '>')} "
             f"{pad(_('compute (6Ψ·tokens)'), 21, '>')}", "-" * 92]
    for row in link_rows(params, dp, value_bytes, tokens_per_gpu, system):
        lines.append(f"{row['stage']:>5} {row['gb_sent']:>16.1f} {row['nvlink_s']:>16.3f} s "
                     f"{row['network_s']:>24.3f} s {row['compute_s']:>19.3f} s")
    return "\n".join(lines)

