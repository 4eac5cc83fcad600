"""Picture of a device mesh: nodes as boxes, devices coloured by pipeline stage, labelled with their
tensor- and data-parallel coordinates (lesson on 3D parallelism). Deterministic: same dims, same JSON."""

from __future__ import annotations

import plotly.graph_objects as go

from parallel_lab.i18n import _
from parallel_lab.runtime.mesh import ParallelDims

# Fixed palette (plotly's "Plotly" qualitative colours), cycled for more stages than colours.
STAGE_COLOURS = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A",
                 "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")


def mesh_figure(dims: ParallelDims, title: str | None = None) -> go.Figure:
    """One row per node (a grey box), one square per device inside it, in rank order. A device's
    colour is its pipeline stage; its label reads ``r{rank}`` over ``tp{t} dp{d}``. Hovering shows
    the full coordinate and the node."""
    dpn = dims.devices_per_node
    fig = go.Figure()
    for node in range(dims.nodes):
        fig.add_shape(type="rect", x0=-0.55, x1=dpn - 0.45, y0=node - 0.45, y1=node + 0.45,
                      line=dict(color="#555555", width=2), fillcolor="#F2F2F2", layer="below")
        fig.add_annotation(x=-0.6, y=node, text=_("node {node}").format(node=node), showarrow=False, xanchor="right")
    rows = dims.table()
    for stage in range(dims.pp):
        mine = [row for row in rows if row["pp"] == stage]
        fig.add_trace(go.Scatter(
            x=[row["rank"] % dpn for row in mine], y=[row["node"] for row in mine],
            mode="markers+text", name=_("pp stage {stage}").format(stage=stage),
            marker=dict(symbol="square", size=46, color=STAGE_COLOURS[stage % len(STAGE_COLOURS)],
                        line=dict(color="white", width=1)),
            text=[f"r{row['rank']}<br>tp{row['tp']} dp{row['dp']}" for row in mine],
            textfont=dict(color="white", size=10),
            customdata=[[row["rank"], row["dp"], row["pp"], row["tp"], row["node"]] for row in mine],
            hovertemplate=_("rank %{customdata[0]}: dp %{customdata[1]}, pp %{customdata[2]}, "
                            "tp %{customdata[3]} (node %{customdata[4]})") + "<extra></extra>",
        ))
    fig.update_xaxes(visible=False, range=[-1.6, dpn - 0.3])
    fig.update_yaxes(visible=False, range=[dims.nodes - 0.4, -0.6])  # node 0 on top
    fig.update_layout(title=title or f"{dims}<br><sup>" + _("rank grid arange({world}).view(dp, pp, tp)").format(
                          world=dims.world_size) + "</sup>",
                      width=max(420, 110 + 62 * dpn), height=150 + 80 * dims.nodes,
                      plot_bgcolor="white", margin=dict(l=20, r=20, t=80, b=20),
                      legend=dict(orientation="h", y=-0.05))
    return fig


def layer_traffic(system, b: int, s: int, h: int, t: int, bytes_per_value: int = 2) -> list[tuple[str, float, float]]:
    """The three kinds of traffic of one transformer layer per micro-batch against its compute, inside
    the node (``system.nvlink``) and across it (``system.network``), in seconds: rows ``(name, fast,
    slow)``. Compute and TP's four all-reduces are ``planning.cost.tp_layer_step``; PP sends the
    activation forward and its gradient back, the whole (b, s, h) tensor, or ``1/t`` of it per TP rank
    with Megatron-LM's scatter/gather (Narayanan et al. 2021, section 4.1: each rank of a TP group sends
    its slice over its own link and the next stage all-gathers it over NVLink)."""
    from parallel_lab.planning.cost import tp_layer_step

    activation = b * s * h * bytes_per_value
    compute, tp_fast = tp_layer_step(b * s, h, t, system.nvlink, system.tflops * 1e12, bytes_per_value)
    tp_slow = tp_layer_step(b * s, h, t, system.network, system.tflops * 1e12, bytes_per_value)[1]
    return [
        (_("compute of one layer, forward + backward"), compute, compute),
        (_("TP: 4 all-reduces of the activation"), tp_fast, tp_slow),
        (_("PP: activation + gradient, whole"), 2 * system.nvlink.cost(activation),
         2 * system.network.cost(activation)),
        (_("PP: the same, 1/t per rank (scatter/gather)"), 2 * system.nvlink.cost(activation / t),
         2 * system.network.cost(activation / t)),
    ]


def layer_traffic_table(system, b: int, s: int, h: int, t: int, model: str = "GPT-3 175B") -> str:
    """``layer_traffic`` as the text table lesson 11 prints (ms), with TP's share of the compute."""
    from parallel_lab.i18n import pad

    rows = layer_traffic(system, b, s, h, t)
    lines = [_("per micro-batch, one layer of {model} (b={b}, s={s}, h={h}) on {t} GPUs; ms").format(
        model=model, b=b, s=s, h=h, t=t), pad("", 46) + pad("NVLink", 9, ">") + pad("InfiniBand", 12, ">")]
    lines += [pad(name, 46) + f"{fast * 1e3:>9.2f}{slow * 1e3:>12.2f}" for name, fast, slow in rows]
    compute, (fast, slow) = rows[0][1], rows[1][1:]
    lines.append(_("TP against compute: {fast:.0%} over NVLink, {slow:.0%} over InfiniBand").format(
        fast=fast / compute, slow=slow / compute))
    lines.append(_("(PP pays its message once per stage boundary, not per layer: a stage of 12 layers sends it "
                   "once)"))
    return "\n".join(lines)


def groups_text(dims: ParallelDims) -> str:
    """Each family of groups of ``dims`` and whether it crosses nodes."""
    return "\n".join(_("{dim} groups: {groups}   cross nodes: {cross}").format(
        dim=dim, groups=dims.groups(dim), cross=dims.crosses_nodes(dim)) for dim in ("tp", "pp", "dp"))


def coords_text(dims: ParallelDims, ranks) -> str:
    """For each of ``ranks``: its coordinate, its node, its TP group, pipeline neighbours and DP group."""
    lines = []
    for rank in ranks:
        c = dims.coords(rank)
        prev, nxt = dims.pp_neighbours(rank)
        lines.append(_("rank {rank}: dp {dp}, pp {pp}, tp {tp} on node {node}; tp group {tp_group}, pipeline prev "
                       "{prev} next {next}, dp group {dp_group}").format(
            rank=rank, dp=c.dp, pp=c.pp, tp=c.tp, node=dims.node_of(rank), tp_group=dims.group_of("tp", rank),
            prev=prev, next=nxt, dp_group=dims.group_of("dp", rank)))
    return "\n".join(lines)


def pipelines_text(dims: ParallelDims) -> str:
    """Each pipeline of the mesh (one per replica and tensor shard): which rank holds which stage."""
    lines = []
    for group in dims.pp_groups():
        c = dims.coords(group[0])
        stages = _(", ").join(_("stage {stage} on rank {rank}").format(stage=stage, rank=rank)
                              for stage, rank in enumerate(group))
        lines.append(_("pipeline of replica {dp}, tensor shard {tp}: {stages}").format(dp=c.dp, tp=c.tp, stages=stages))
    return "\n".join(lines)
