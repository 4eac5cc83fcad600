"""Mixture of experts on the page (lesson 13, lessons/13_mixture_of_experts.ipynb): the load of each
expert against its capacity, which assignments were dropped, who sends what to whom in the dispatch
all-to-all, load imbalance, and the all-to-all's cost against tensor parallelism's all-reduce.

    from parallel_lab.show import experts as xf
    routing = xf.dense_routing(Case(capacity_factor=1.0))   # models.MoE on the lesson's batch, one process
    xf.load_figure(routing)                                 # assignments per expert, the capacity line
    xf.drops_figure(routing)                                # token x choice: which expert, kept or dropped
    xf.dispatch_figure(xf.dispatch_counts(routing, ep=4))   # rows rank s sends rank d

Every number comes from ``models.MoE``'s ``Routing`` (one process, the same routing expert
parallelism reproduces) or from ``moe.cost`` / ``hardware``: integers and rounded floats, no
timings, so nbval compares the figures. Papers: GShard (Lepikhin et al. 2020: top-2, capacity,
first choices queued first), Switch Transformers (Fedus et al. 2021: capacity factor, the
load-balancing loss), DeepSeek-V3 (DeepSeek-AI 2024: no dropping, balance without an auxiliary loss).
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
import torch

from parallel_lab import models
from parallel_lab.hardware import LINKS, Link, ring_all_reduce_time
from parallel_lab.i18n import _, _l, pad
from parallel_lab.i18n import width as text_width
from parallel_lab.moe import cost
from parallel_lab.moe.run import Case, reference
from parallel_lab.show.pipeline import plain_layout

KEPT = ("#4c78a8", "#72b7b2", "#54a24b", "#b279a2")  # first, second, third, fourth choice kept
DROPPED = "#e45756"
_ORDINAL = (_l("1st kept"), _l("2nd kept"), _l("3rd kept"), _l("4th kept"))


def dense_routing(case: Case | None = None, shift: float = 0.0) -> models.Routing:
    """The routing ``models.MoE`` (fp64) makes of ``case``'s batch, the one ``run_moe`` checks; with
    ``shift``, every token moved by ``shift`` along one fixed direction (tokens alike: a router
    sends them to the same experts)."""
    case = Case() if case is None else case
    moe = case.build()
    x = reference(case)["x"]
    if shift:
        direction = torch.randn(case.hidden, generator=torch.Generator().manual_seed(case.seed + 7),
                                dtype=x.dtype)
        x = x + shift * direction / direction.norm() * case.hidden ** 0.5
    with torch.no_grad():
        moe(x)
    return moe.routing


def loads(routing: models.Routing) -> dict:
    """Per expert: ``routed`` (the demand, before the capacity), ``kept`` per choice ``(k, E)``,
    ``dropped``; and the ``capacity``."""
    E, k = len(routing.routed_per_expert), routing.expert.shape[1]
    kept = [[int(((routing.expert[:, s] == e) & routing.kept[:, s]).sum()) for e in range(E)] for s in range(k)]
    routed = routing.routed_per_expert.tolist()
    kept_tokens = routing.tokens_per_expert.tolist()
    return {"routed": routed, "kept": kept, "dropped": [r - t for r, t in zip(routed, kept_tokens)],
            "capacity": routing.capacity}


def load_table(routing: models.Routing) -> str:
    """``loads`` as text, one row per expert."""
    data = loads(routing)
    k = len(data["kept"])
    columns = " ".join(pad(_ORDINAL[s] if s < 4 else _("kept {n}").format(n=s + 1), 8, ">") for s in range(k))
    head = f"{pad(_('expert'), 6, '>')} {pad(_('routed'), 7, '>')} {columns} {pad(_('dropped'), 8, '>')}"
    lines = [head, "-" * text_width(head)]
    for e, routed in enumerate(data["routed"]):
        lines.append(f"{e:>6} {routed:>7} " + " ".join(f"{data['kept'][s][e]:>8}" for s in range(k)) +
                     f" {data['dropped'][e]:>8}")
    lines.append(_("capacity {capacity} per expert; {dropped} assignments dropped, {lost} tokens with every choice "
                   "dropped").format(capacity=data["capacity"], dropped=routing.dropped,
                                     lost=int(routing.dropped_tokens.sum())))
    return "\n".join(lines)


def load_figure(routing: models.Routing, title: str = "") -> go.Figure:
    """Stacked bars per expert: kept first choices, kept second choices, ..., dropped (red), with the
    capacity as a dashed line."""
    data = loads(routing)
    experts = list(range(len(data["routed"])))
    ordinal = [_("first choices kept"), _("second choices kept"), _("third choices kept"), _("fourth choices kept")]
    bars = [go.Bar(x=experts, y=row, name=ordinal[s] if s < 4 else _("{n} choices kept").format(n=s + 1),
                   marker_color=KEPT[s % len(KEPT)]) for s, row in enumerate(data["kept"])]
    bars.append(go.Bar(x=experts, y=data["dropped"], name=_("dropped (beyond the capacity)"), marker_color=DROPPED,
                       marker_pattern_shape="/"))
    fig = go.Figure(bars)
    fig.add_hline(y=data["capacity"], line=dict(color="black", dash="dash"),
                  annotation_text=_("capacity {capacity}").format(capacity=data["capacity"]),
                  annotation_position="top left")
    fig.update_layout(**plain_layout(barmode="stack", height=360, width=720,
                                     title=title or _("assignments per expert: {dropped} dropped").format(
                                         dropped=routing.dropped)))
    fig.update_xaxes(title=_("expert"), tickvals=experts)
    fig.update_yaxes(title=_("assignments (token, choice)"))
    return fig


def drops_figure(routing: models.Routing, title: str = "") -> go.Figure:
    """Choice x token: each cell names the expert chosen; coloured by the choice when kept, red when
    dropped."""
    n, k = routing.expert.shape
    z = [[(s + 1) if bool(routing.kept[t, s]) else 0 for t in range(n)] for s in range(k)]
    text = [[str(int(routing.expert[t, s])) for t in range(n)] for s in range(k)]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", zmin=-0.5, zmax=k + 0.5,
                               colorscale=_steps(k), showscale=False, xgap=1, ygap=1,
                               hovertemplate=_("token %{x}, choice %{y}: expert %{text}") + "<extra></extra>"))
    lost = [int(t) for t in routing.dropped_tokens.nonzero().flatten()]
    fig.update_layout(**plain_layout(
        height=140 + 40 * k, width=900, margin=dict(l=70, r=20, t=50, b=40),
        title=title or _("each token's choices (the number: the expert); red: dropped ({dropped}); tokens with "
                         "nothing kept: {lost}").format(dropped=routing.dropped, lost=lost or _("none"))))
    fig.update_xaxes(title=_("token"), dtick=4, showgrid=False)
    fig.update_yaxes(tickvals=list(range(k)), ticktext=[_("choice {n}").format(n=s + 1) for s in range(k)],
                     autorange="reversed",
                     showgrid=False)
    return fig


def _steps(k: int) -> list:
    """A discrete colour scale for z in 0 (dropped), 1..k (kept choice)."""
    colors = [DROPPED] + [KEPT[s % len(KEPT)] for s in range(k)]
    out = []
    for i, c in enumerate(colors):
        out += [[round(i / len(colors), 6), c], [round((i + 1) / len(colors), 6), c]]
    return out


def dispatch_counts(routing: models.Routing, ep: int) -> list[list[int]]:
    """``[s][d]``: the kept assignments of rank s's tokens (the batch split in ``ep`` equal parts, in
    order) to experts on rank d (experts split in ``ep`` equal blocks): the rows rank s sends rank d
    in the dispatch all-to-all (and d sends back in the combine). Row s includes s -> s, which stays home."""
    n, k = routing.expert.shape
    E = len(routing.routed_per_expert)
    counts = [[0] * ep for _ in range(ep)]
    for t in range(n):
        for s in range(k):
            if bool(routing.kept[t, s]):
                counts[t * ep // n][int(routing.expert[t, s]) * ep // E] += 1
    return counts


def dispatch_figure(counts: Sequence[Sequence[int]], hidden: int | None = None,
                    bytes_per_element: int = 8) -> go.Figure:
    """The dispatch all-to-all as a matrix: row s, column d, the token rows rank s sends rank d (the
    diagonal stays home); with ``hidden``, the bytes too."""
    ep = len(counts)
    text = [[f"{c}" + (f"<br>{c * hidden * bytes_per_element:,} B" if hidden else "") for c in row] for row in counts]
    fig = go.Figure(go.Heatmap(z=[list(row) for row in counts], text=text, texttemplate="%{text}",
                               colorscale="Blues", showscale=False, xgap=2, ygap=2,
                               hovertemplate=_("rank %{y} -> rank %{x}: %{z} rows") + "<extra></extra>"))
    sent = [sum(row) - row[s] for s, row in enumerate(counts)]
    fig.update_layout(**plain_layout(
        height=140 + 70 * ep, width=620, margin=dict(l=80, r=20, t=80, b=60),
        title=dict(text=_("dispatch: token rows rank s (row) sends rank d (column)<br>leaving each rank (off the "
                          "diagonal): {sent}").format(sent=sent), font=dict(size=14))))
    fig.update_xaxes(title=_("to rank (holds experts)"), tickvals=list(range(ep)), showgrid=False, side="bottom")
    fig.update_yaxes(title=_("from rank (holds tokens)"), tickvals=list(range(ep)), autorange="reversed",
                     showgrid=False)
    return fig


def imbalance_rows(case: Case | None = None, shifts: Sequence[float] = (0.0, 0.5, 1.0, 2.0)) -> list[dict]:
    """Per ``shift`` (tokens moved along one direction, ``dense_routing``): the busiest expert's demand
    over the mean (``max_over_mean``), the assignments and tokens dropped, and Switch's
    load-balancing loss (1 when uniform)."""
    rows = []
    for shift in shifts:
        r = dense_routing(case, shift)
        routed = r.routed_per_expert.tolist()
        rows.append({"shift": shift, "routed": routed,
                     "max_over_mean": round(max(routed) / (sum(routed) / len(routed)), 3),
                     "dropped": r.dropped, "dropped_tokens": int(r.dropped_tokens.sum()),
                     "aux_loss": round(float(r.aux_loss), 4), "capacity": r.capacity})
    return rows


def imbalance_table(rows: Sequence[dict]) -> str:
    head = (f"{pad(_('shift'), 5, '>')}  {pad(_('demand per expert'), 34)} {pad(_('max/mean'), 8, '>')} "
            f"{pad(_('dropped'), 8, '>')} {pad(_('lost tokens'), 11, '>')} {pad(_('aux loss'), 9, '>')}")
    lines = [head, "-" * text_width(head)]
    for r in rows:
        lines.append(f"{r['shift']:>5g}  {str(r['routed']):<34} {r['max_over_mean']:>8.2f} {r['dropped']:>8} "
                     f"{r['dropped_tokens']:>11} {r['aux_loss']:>9.3f}")
    return "\n".join(lines)


def imbalance_figure(rows: Sequence[dict]) -> go.Figure:
    """Demand per expert for each shift (grouped bars), the capacity dashed."""
    experts = list(range(len(rows[0]["routed"])))
    fig = go.Figure([go.Bar(x=experts, y=r["routed"], name=_("shift {shift:g}: {dropped} dropped").format(
        shift=r["shift"], dropped=r["dropped"]))
                     for r in rows])
    fig.add_hline(y=rows[0]["capacity"], line=dict(color="black", dash="dash"),
                  annotation_text=_("capacity {capacity}").format(capacity=rows[0]["capacity"]),
                  annotation_position="top left")
    fig.update_layout(**plain_layout(barmode="group", height=360, width=720,
                                     title=_("demand per expert as the tokens grow alike")))
    fig.update_xaxes(title=_("expert"), tickvals=experts)
    fig.update_yaxes(title=_("assignments routed"))
    return fig


def cost_rows(tokens: int = 4096, hidden: int = 4096, top_k: int = 2, ranks: int = 8, bytes_per_element: int = 2,
              links: Sequence[str] = ("nvlink4", "ndr")) -> list[dict]:
    """One layer's communication per rank and training step, ``tokens`` tokens per rank: expert
    parallelism's 4 all-to-alls of the k copies of its tokens (``moe.cost.moe_layer_time``) against a
    tensor-parallel MLP's 2 all-reduces of its activations (Megatron's f and g, lesson 02), on each link."""
    n_a2a = cost.dispatch_bytes(tokens, hidden, top_k, bytes_per_element)
    n_ar = tokens * hidden * bytes_per_element
    rows = []
    for key in links:
        link: Link = LINKS[key]
        rows.append({
            "link": link.name,
            "ep_sent_mb": round(cost.ALL_TO_ALLS_PER_LAYER * cost.all_to_all_sent_bytes(n_a2a, ranks) / 1e6, 1),
            "ep_ms": round(cost.moe_layer_time(tokens, hidden, top_k, ranks, link, bytes_per_element) * 1e3, 3),
            "tp_sent_mb": round(2 * 2 * (ranks - 1) / ranks * n_ar / 1e6, 1),
            "tp_ms": round(2 * ring_all_reduce_time(n_ar, ranks, link.latency, link.bandwidth) * 1e3, 3),
        })
    return rows


def cost_table(rows: Sequence[dict]) -> str:
    head = (f"{pad(_('link'), 52)} {pad(_('EP MB sent'), 10, '>')} {pad(_('EP ms'), 7, '>')} "
            f"{pad(_('TP MB sent'), 10, '>')} {pad(_('TP ms'), 7, '>')}")
    lines = [head, "-" * text_width(head)]
    for r in rows:
        lines.append(f"{pad(_(r['link']), 52)} {r['ep_sent_mb']:>10.1f} {r['ep_ms']:>7.3f} {r['tp_sent_mb']:>10.1f} "
                     f"{r['tp_ms']:>7.3f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The lesson's printed lines (through the catalog, so that they follow the lesson's language).

def routing_lines(probs: torch.Tensor, gate: torch.Tensor, expert: torch.Tensor) -> str:
    """Per token: the router's probabilities (rounded), its top-k experts and their gates."""
    lines = []
    for t in range(probs.shape[0]):
        lines.append(_("token {t}: probabilities {probs}").format(t=t, probs=[round(v, 2) for v in probs[t].tolist()]))
        lines.append("         " + _("top-{k} experts {experts}, gates {gates}").format(
            k=expert.shape[1], experts=expert[t].tolist(), gates=[round(v, 3) for v in gate[t].tolist()]))
    return "\n".join(lines)


def demand_lines(case: Case, routing: models.Routing) -> str:
    """The batch's sizes and the assignments routed to each expert before any capacity."""
    n = case.batch * case.seq
    return "\n".join([
        _("n = {n} tokens, E = {E}, k = {k}, C = {C}: {assignments} assignments").format(
            n=n, E=case.experts, k=case.top_k, C=case.capacity_factor, assignments=n * case.top_k),
        _("assignments routed to each expert (the demand): {demand}").format(
            demand=routing.routed_per_expert.tolist())])


def queue_lines(expert: torch.Tensor, position: torch.Tensor, capacity: int) -> str:
    """Per token: each choice's expert and its place in that expert's queue, marked when dropped."""
    lines = []
    for t in range(expert.shape[0]):
        cells = [_("expert {e} at place {place}").format(e=int(expert[t, s]), place=int(position[t, s]))
                 + ("" if position[t, s] < capacity else " " + _("(dropped)")) for s in range(expert.shape[1])]
        lines.append(_("token {t}: ").format(t=t) + ";  ".join(cells))
    return "\n".join(lines)


def run_summary(result: dict) -> str:
    """``moe.run.run_moe``'s report against one process, as the lesson prints it."""
    yes = {True: _("yes"), False: _("NO")}
    return "\n".join([
        _("EP = {ep}, {tokens} tokens, capacity {capacity}, {dtype}").format(
            ep=result["ep"], tokens=result["tokens"], capacity=result["capacity"], dtype=result["dtype"]),
        "  " + _("max |output − dense| < 1e-12: {ok}").format(ok=yes[result["max_output_diff"] < 1e-12]),
        "  " + _("max |gradient − dense| < 1e-12: {ok} (router, experts, input)").format(
            ok=yes[result["max_grad_diff"] < 1e-12]),
        "  " + _("|loss − dense| < 1e-12: {ok} (with the load-balancing loss)").format(
            ok=yes[result["loss_diff"] < 1e-12]),
        "  " + _("the same assignments kept: {ok}; dropped {dropped}, one process {reference}").format(
            ok=yes[bool(result["routing_equal"])], dropped=result["dropped"], reference=result["reference_dropped"]),
        "  " + _("rows each expert ran on (measured on its rank): {rows}").format(rows=result["tokens_per_expert"]),
        "  " + _("rank 0's collectives, forward + backward: {calls}").format(calls=result["collectives"])])


def all_to_all_bytes_lines(sent_to: Sequence[Sequence[int]], result: dict, row_bytes: int) -> str:
    """Per rank: rows sent and received in the dispatch, the bytes its four all-to-alls carry by
    that count (each row twice each way), and the bytes measured by commlog."""
    lines = []
    for r in range(len(sent_to)):
        out_rows, in_rows = sum(sent_to[r]), sum(row[r] for row in sent_to)
        lines.append(_("rank {r}: sends {out} rows, receives {inn}: 2·({out} + {inn})·{row} B = {total:,} B; "
                       "measured {measured:,} B").format(r=r, out=out_rows, inn=in_rows, row=row_bytes,
                                                          total=2 * (out_rows + in_rows) * row_bytes,
                                                          measured=result["all_to_all_bytes"][r]))
    return "\n".join(lines)


def rows_per_rank(result: dict) -> list[int]:
    """Rows computed per rank: the sum over its experts (E/N consecutive experts per rank)."""
    per_expert = result["tokens_per_expert"]
    local = len(per_expert) // result["ep"]
    return [sum(per_expert[local * r:local * (r + 1)]) for r in range(result["ep"])]


def busiest_line(result: dict) -> str:
    """Rows per rank, the busiest and the mean."""
    rows = rows_per_rank(result)
    return _("rows computed per rank {rows}: the busiest {busiest}, the mean {mean:g}").format(
        rows=rows, busiest=max(rows), mean=sum(rows) / len(rows))


def no_drop_line(result: dict) -> str:
    """A run without capacity: what it dropped, rows per rank, and whether it equals one process."""
    same = result["max_output_diff"] < 1e-12 and result["max_grad_diff"] < 1e-12
    return _("no capacity: dropped {dropped}, rows per rank {rows}, equal to one process: {same}").format(
        dropped=result["dropped"], rows=rows_per_rank(result), same=_("yes") if same else _("NO"))
