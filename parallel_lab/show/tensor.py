"""Pictures for lesson 02 (lessons/02_tensor_parallelism.ipynb): who holds which block.

    split_figure("column", tp=2)   # X · W_r = Y_r on each rank, then the (optional) all-gather
    split_figure("row", tp=2)      # X_r · W_r = partial Y on each rank, then the all-reduce
    heads_figure(heads=24, tp=4)   # attention heads -> ranks, and the matching slices of W_q,k,v,o

Deterministic (same arguments, same JSON) and small: shapes and a few labels, no data arrays.
Colours follow ``mesh_figures``: one colour per rank; grey means "every rank holds the same".
"""

from __future__ import annotations

import plotly.graph_objects as go

from parallel_lab.i18n import _

RANK_COLOURS = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A",
                "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")
REPLICATED = "#9E9E9E"  # the same on every rank
OUTLINE = "#BBBBBB"
SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")

# Matrix sizes in drawing units: X is N x K, W is K x M, Y is N x M (K and M divisible by 1, 2, 4, 8).
N, K, M = 2, 4, 4
ROW_HEIGHT = K + 1.6
X0, W0, Y0, C0, R0 = 0.0, 5.2, 10.4, 15.2, 20.0  # left edges: X, W, Y_r, collective, result


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _sub(i: int) -> str:
    return str(i).translate(SUBSCRIPTS)


def _rect(fig, x0, y0, w, h, fill, opacity=1.0, line=OUTLINE, text=None, font_colour="white", size=11):
    """A rectangle with its top-left corner at ``(x0, y0)`` (y grows upwards), optionally labelled."""
    fig.add_shape(type="rect", x0=round(x0, 3), x1=round(x0 + w, 3), y0=round(y0 - h, 3), y1=round(y0, 3),
                  fillcolor=fill, opacity=opacity, line=dict(color=line, width=1))
    if text:
        _text(fig, x0 + w / 2, y0 - h / 2, text, colour=font_colour, size=size)


def _text(fig, x, y, text, colour="#333333", size=12, **kw):
    fig.add_annotation(x=round(x, 3), y=round(y, 3), text=text, showarrow=False,
                       font=dict(color=colour, size=size), **kw)


def split_figure(kind: str, tp: int = 2) -> go.Figure:
    """``Y = X·W`` split over ``tp`` ranks, one row per rank: the blocks of X, W and Y it holds (in
    the outline of the whole matrix), what it computes, and the collective that recombines them.

    ``kind="column"``: W split by columns; rank r computes whole columns ``Y_r = X·W_r`` from all of
    X; an all-gather gives every rank all of Y (optional: Megatron feeds Y_r to a row split instead).
    ``kind="row"``: W split by rows and X by columns; rank r computes a full-size partial sum
    ``X_r·W_r``; an all-reduce adds them.
    """
    if kind not in ("column", "row"):
        raise ValueError(f"kind must be 'column' or 'row', got {kind!r}")
    if tp < 1 or K % tp:
        raise ValueError(f"tp must divide {K} to draw, got {tp}")
    fig = go.Figure()
    top = 1.4
    for x, title in ((X0 + K / 2, _("input X")), (W0 + M / 2, _("weights W")), (Y0 + M / 2, _("computed on the rank")),
                     (R0 + M / 2, _("after the collective"))):
        _text(fig, x, top, f"<b>{title}</b>")
    for r in range(tp):
        yc = -r * ROW_HEIGHT - K / 2  # the row's vertical centre
        colour, s = _colour(r), _sub(r)
        _text(fig, X0 - 0.4, yc, "<b>" + _("rank {rank}").format(rank=r) + "</b>", colour=colour, xanchor="right")
        for x0, w, h in ((X0, K, N), (W0, M, K), (Y0, M, N), (R0, M, N)):  # outlines of whole matrices
            _rect(fig, x0, yc + h / 2, w, h, "white")
        if kind == "column":
            m = M / tp
            _rect(fig, X0, yc + N / 2, K, N, REPLICATED, text=_("X (all)"))
            _rect(fig, W0 + r * m, yc + K / 2, m, K, colour, text=f"W{s}")
            _rect(fig, Y0 + r * m, yc + N / 2, m, N, colour, text=f"Y{s}")
            for q in range(tp):  # after the all-gather: every rank holds every Y_q
                _rect(fig, R0 + q * m, yc + N / 2, m, N, _colour(q), text=f"Y{_sub(q)}")
        else:
            k = K / tp
            _rect(fig, X0 + r * k, yc + N / 2, k, N, colour, text=f"X{s}")
            _rect(fig, W0, yc + K / 2 - r * k, M, k, colour, text=f"W{s}")
            _rect(fig, Y0, yc + N / 2, M, N, colour, opacity=0.45, text=_("X{r}·W{r} (partial)").format(r=s),
                  font_colour="#222222", size=10)
            _rect(fig, R0, yc + N / 2, M, N, REPLICATED, text=_("Y = Σ partials"))
        _text(fig, W0 - 0.6, yc, "·", size=20)
        _text(fig, Y0 - 0.6, yc, "=", size=16)
    bottom = -(tp - 1) * ROW_HEIGHT - K
    label = _("<b>all-gather</b><br>(optional)") if kind == "column" else _("<b>all-reduce</b><br>(sum)")
    fig.add_shape(type="rect", x0=C0 + 0.3, x1=C0 + 4.1, y0=round(bottom, 3), y1=0.2,
                  fillcolor="#FFF4D6", line=dict(color="#E0B000", width=1))
    over = "" if tp == 1 else "<br>" + _("over {p} ranks").format(p=tp)
    _text(fig, C0 + 2.2, bottom / 2 + 0.1, label + over, size=12)
    if kind == "column":
        title = _("Column split on {p} ranks: rank r holds columns W<sub>r</sub> and computes Y<sub>r</sub> = "
                  "X·W<sub>r</sub>, no communication").format(p=tp)
    else:
        title = _("Row split on {p} ranks: rank r holds X<sub>r</sub> and rows W<sub>r</sub>; Y = Σ<sub>r</sub> "
                  "X<sub>r</sub>·W<sub>r</sub> needs an all-reduce").format(p=tp)
    return _finish(fig, title, x_range=(-3.2, R0 + M + 0.3), y_range=(bottom - 0.6, top + 0.8))


def _finish(fig: go.Figure, title: str, x_range, y_range, px_per_unit: float = 27.0) -> go.Figure:
    width = round((x_range[1] - x_range[0]) * px_per_unit) + 40
    height = round((y_range[1] - y_range[0]) * px_per_unit) + 80
    fig.update_xaxes(visible=False, range=list(x_range), fixedrange=True)
    fig.update_yaxes(visible=False, range=list(y_range), scaleanchor="x", fixedrange=True)
    fig.update_layout(title=dict(text=title, font=dict(size=14)), width=width, height=height,
                      plot_bgcolor="white", margin=dict(l=20, r=20, t=60, b=20), showlegend=False)
    return fig


def heads_figure(heads: int = 24, tp: int = 4, head_dim: int = 8) -> go.Figure:
    """Which rank holds which attention head, and the matching slices of the weights: the columns
    of W_q, W_k, W_v (column split) and the rows of W_o (row split), one cell per head."""
    if heads % tp:
        raise ValueError(f"heads {heads} is not divisible by tp {tp}")
    per = heads // tp
    rows = [_("W_q columns"), _("W_k columns"), _("W_v columns"), _("attention head"), _("W_o rows")]
    head_row = rows[3]
    owner = [h // per for h in range(heads)]
    scale = []  # discrete colours: rank r fills [r, r+1) / tp of the scale
    for r in range(tp):
        scale += [[r / tp, _colour(r)], [(r + 1) / tp, _colour(r)]]
    text = [[f"h{h}" for h in range(heads)] if name == head_row else [""] * heads for name in rows]
    hover = [[f"{name} {h * head_dim}–{(h + 1) * head_dim - 1}" if name != head_row else
              _("head {head}").format(head=h) for h in range(heads)] for name in rows]
    fig = go.Figure(go.Heatmap(
        z=[owner] * len(rows), x=list(range(heads)), y=rows, zmin=-0.5, zmax=tp - 0.5, colorscale=scale,
        showscale=False, text=text, texttemplate="%{text}", textfont=dict(color="white", size=9),
        customdata=hover, hovertemplate=_("%{customdata}: rank %{z}") + "<extra></extra>", xgap=2, ygap=4))
    for r in range(tp):
        first, last = r * per, (r + 1) * per - 1
        fig.add_annotation(x=(first + last) / 2, y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                           text=_("<b>rank {rank}</b>: heads {first}–{last}").format(rank=r, first=first, last=last),
                           font=dict(color=_colour(r), size=11))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title=dict(text=_("Attention split by heads: {heads} heads on {p} ranks, {per} each<br><sup>head_dim "
                          "{head_dim}: each rank holds {columns} columns of W_q, W_k, W_v and the same {columns} rows "
                          "of W_o</sup>").format(heads=heads, p=tp, per=per, head_dim=head_dim, columns=per * head_dim),
                   font=dict(size=14)),
        width=760, height=320, plot_bgcolor="white", margin=dict(l=110, r=20, t=100, b=20))
    return fig


# ----------------------------------------------------------------------------------------------
# What lesson 02's runs print, in the lesson's language (the rank functions are parallel_lab.tensor.demos').


def _shape(dims) -> str:
    return "×".join(map(str, dims))


def collectives_text(report: dict) -> str:
    """One line per phase (``forward``, ``backward``): each collective, how often, its bytes."""
    lines = []
    for phase, name in (("forward", _("forward")), ("backward", _("backward"))):
        ops = ", ".join(_("{op} x{count} ({bytes:,} bytes)").format(op=op, count=row["count"], bytes=row["bytes"])
                        for op, row in report[phase].items())
        lines.append(f"  {name}: {ops or _('none')}")
    return "\n".join(lines)


def splits_text(per_rank: list, tolerance: float) -> str:
    """``demos.column_and_row`` on every rank: per split, the shapes on rank 0, its collectives and
    whether every rank matches the dense layer."""
    names = {"column": _("column split"), "column + all-gather": _("column split + all-gather"),
             "row": _("row split")}
    lines = [_("on {n} ranks:").format(n=len(per_rank))]
    for split, mine in per_rank[0].items():
        ops = ", ".join(f"{op} x{row['count']}" for op, row in mine["collectives"].items()) or _("none")
        same = all(r[split]["max_diff"] < tolerance for r in per_rank)
        lines.append("  " + _("{split}: W {w}, rank 0 holds W_r {w_r} and computes {y_r}; collectives: {ops}; "
                              "matches the dense layer: {same}").format(
            split=names.get(split, split), w=_shape(mine["W"]), w_r=_shape(mine["W_r"]), y_r=_shape(mine["Y_r"]),
            ops=ops, same=same))
    return "\n".join(lines)


def check_text(name: str, tp: int, matches: bool, report: dict) -> str:
    """A parallel module against the dense one: whether output and every gradient match, then its
    collectives."""
    head = _("{name} on {tp} ranks: output and every gradient match the dense module (< 1e-12): "
             "{matches}").format(name=name, tp=tp, matches=matches)
    return head + "\n" + collectives_text(report)


def sequence_parallel_text(run: dict, tp: int, sent: dict, model_bytes: float) -> str:
    """One block with or without sequence parallelism (``demos.block_runs``): output shape, whether it
    matches, the collectives, the bytes a ring sends per rank (``sent``: forward, backward), and what
    autograd kept for the backward against the memory model's count."""
    name = _("sequence parallel") if run["sequence_parallel"] else _("tensor parallel")
    return "\n".join([
        _("{name}, t = {tp}: block output on a rank {shape}, matches the dense block: {matches}").format(
            name=name, tp=tp, shape=tuple(run["output_shape"]), matches=run["matches"]),
        collectives_text(run),
        "  " + _("a ring sends {forward:,.0f} bytes per rank forward and {backward:,.0f} backward").format(**sent),
        "  " + _("kept for the backward on a rank: {kept:,} bytes; the memory model: {model:,.0f} bytes + "
                 "{rest:,.0f} of per-token statistics").format(kept=run["saved_bytes"], model=model_bytes,
                                                              rest=run["saved_bytes"] - model_bytes),
    ])
