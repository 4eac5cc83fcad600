"""Context parallelism, drawn (lesson 14, lessons/14_long_context.ipynb): which K/V block each rank
holds at each ring step and which scores it computes, the causal work per rank (contiguous against
zig-zag), the score memory measured on real ranks, and the cost of ring against Ulysses.

    from parallel_lab.show import context as cf
    print(cf.ring_table(cp=4))          # step x rank: the K/V block held, the score block computed
    cf.ring_steps_figure(cp=4)          # the seq x seq score matrix, one panel per ring step
    cf.work_figure(cp=4)                # scores computed per rank under the causal mask
    print(cf.runs_table(results))       # run_context results: errors, score bytes, bytes sent
    print(cf.cost_table(cf.compare_costs()))

Every number comes from the engine (``context.blockwise.step_block``, ``zigzag_positions``,
``context.cost.context_cost``, ``context.run.run_context``), rounded, so nbval compares the output.
Papers: ring attention (Liu, Zaharia & Abbeel 2023), the zig-zag split (Megatron-LM's context
parallelism, ``get_batch_on_this_cp_rank``: 2·cp chunks, rank r holds r and 2·cp-1-r),
DeepSpeed-Ulysses (Jacobs et al. 2023).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from parallel_lab import hardware
from parallel_lab.context.blockwise import step_block, zigzag_positions
from parallel_lab.context.cost import context_cost
from parallel_lab.i18n import _, pad
from parallel_lab.i18n import width as text_width
from parallel_lab.show.pipeline import plain_layout

RANK_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#9d755d", "#72b7b2", "#ff9da6")
# the lesson's big example: a 128k-token sequence of a 70B-class model (hidden 8192, 64 heads), bf16
BIG = dict(batch=1, seq=131072, hidden=8192, heads=64, dtype_bytes=2)


def source_of(rank: int, step: int, cp: int) -> int:
    """The rank whose K/V block ``rank`` holds at ring step ``step`` (each step: one hop from r-1)."""
    return (rank - step) % cp


def computed_cells(cp: int, seq: int, causal: bool = True) -> list[list[list[tuple[int, int]]]]:
    """``[step][rank]``: the (query position, key position) scores rank ``rank`` computes at ring
    step ``step`` (global positions, zig-zag layout; ``blockwise.step_block``)."""
    local = seq // cp
    out = []
    for step in range(cp):
        row = []
        for rank in range(cp):
            src = source_of(rank, step, cp)
            block = step_block(rank, src, cp, local, causal)
            queries = zigzag_positions(seq, cp, rank)[block.rows]
            keys = zigzag_positions(seq, cp, src)[block.cols]
            row.append([(q, k) for q in queries for k in keys if not (block.diagonal and k > q)])
        out.append(row)
    return out


def ring_table(cp: int = 4, seq: int = 16, causal: bool = True) -> str:
    """Step x rank: ``K/V of r<src>, <rows>x<cols>`` -- the block held and the size of the score
    block computed (a diagonal block counts whole: it is computed, then masked)."""
    local = seq // cp
    head = (f"{pad(_('step'), 4, '>')} | " + " | ".join(pad(_("rank {rank}").format(rank=r), 16)
                                                      for r in range(cp))).rstrip()
    mask = _("causal, zig-zag") if causal else _("no mask")
    lines = [_("seq {seq}, cp {cp}, {local} positions per rank ({mask})").format(
        seq=seq, cp=cp, local=local, mask=mask), head, "-" * text_width(head)]
    for step in range(cp):
        cells = []
        for rank in range(cp):
            src = source_of(rank, step, cp)
            b = step_block(rank, src, cp, local, causal)
            rows, cols = b.rows.stop - b.rows.start, b.cols.stop - b.cols.start
            held = _("K/V of r{rank},").format(rank=src)
            cells.append(f"{pad(held, 9)}{rows:>2}x{cols:<2}{'◣' if b.diagonal else ' '}")
        lines.append((f"{step:>4} | " + " | ".join(pad(c, 16) for c in cells)).rstrip())
    return "\n".join(lines)


def ring_steps_figure(cp: int = 4, seq: int = 16, causal: bool = True) -> go.Figure:
    """One panel per ring step: the ``seq x seq`` score matrix (queries down, keys across, global
    positions), each score coloured by the rank that computes it at that step; blank: masked, or
    computed at another step."""
    cells = computed_cells(cp, seq, causal)
    fig = make_subplots(1, cp, subplot_titles=[_("step {step}").format(step=s) for s in range(cp)],
                        horizontal_spacing=0.03)
    for step in range(cp):
        z = [[None] * seq for _ in range(seq)]
        for rank, pairs in enumerate(cells[step]):
            for q, k in pairs:
                z[q][k] = rank
        fig.add_trace(go.Heatmap(z=z, zmin=-0.5, zmax=cp - 0.5, showscale=step == cp - 1, xgap=1, ygap=1,
                                 colorscale=_discrete(cp), hovertemplate=_("query %{y}, key %{x}: rank %{z}")
                                 + "<extra></extra>", colorbar=dict(title="rank", tickvals=list(range(cp)))),
                      1, step + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=step == 0, row=1, col=step + 1)
        fig.update_xaxes(showticklabels=False, row=1, col=step + 1)
    mask = _("causal, zig-zag split") if causal else _("no mask")
    fig.update_layout(**plain_layout(height=300, width=220 * cp + 120,
                                     title=_("Ring attention, cp = {cp}, seq = {seq} ({mask}): who computes which "
                                             "scores at each step").format(cp=cp, seq=seq, mask=mask)))
    fig.update_yaxes(title_text=_("query position"), row=1, col=1)
    return fig


def _discrete(n: int) -> list:
    """A colour scale with one flat band per rank 0..n-1."""
    scale = []
    for r in range(n):
        scale += [[r / n, RANK_COLOURS[r % len(RANK_COLOURS)]], [(r + 1) / n, RANK_COLOURS[r % len(RANK_COLOURS)]]]
    return scale


def causal_work(cp: int, seq: int) -> dict:
    """Scores each rank computes under the causal mask in one forward, whole blocks (a block on
    the diagonal counted whole): ``contiguous`` (rank r holds positions r·t..(r+1)·t-1 and skips the
    blocks after its own: r + 1 blocks of t x t) and ``zigzag`` (``step_block``: t² + (cp-1)·t²/2)."""
    t = seq // cp
    zigzag = []
    for rank in range(cp):
        total = 0
        for step in range(cp):
            b = step_block(rank, source_of(rank, step, cp), cp, t, True)
            total += (b.rows.stop - b.rows.start) * (b.cols.stop - b.cols.start)
        zigzag.append(total)
    return {"contiguous": [(r + 1) * t * t for r in range(cp)], "zigzag": zigzag}


def work_figure(cp: int = 4, seq: int = 16) -> go.Figure:
    """Bars per rank: scores computed per forward, contiguous split against zig-zag (causal)."""
    work = causal_work(cp, seq)
    ranks = [_("rank {rank}").format(rank=r) for r in range(cp)]
    fig = go.Figure([go.Bar(x=ranks, y=work["contiguous"], name=_("contiguous split"), marker_color="#bab0ac"),
                     go.Bar(x=ranks, y=work["zigzag"], name=_("zig-zag split"), marker_color="#4c78a8")])
    fig.update_layout(**plain_layout(height=320, barmode="group", yaxis_title=_("scores computed (one forward)"),
                                     title=_("Causal mask, cp = {cp}, seq = {seq}: the slowest rank paces the "
                                             "ring").format(cp=cp, seq=seq)))
    return fig


def runs_table(results: Sequence[Mapping]) -> str:
    """``run_context`` results side by side: max output and gradient differences against the dense
    attention, the largest score tensor per rank (measured, predicted, one process, s²/cp of it),
    and the bytes each rank sent (measured, predicted)."""
    head = (f"{pad(_('variant'), 8)} {'cp':>2}  {'max |Δout|':>10} {'max |Δgrad|':>11}  "
            f"{pad(_('scores/rank B'), 13, '>')} {pad(_('predicted'), 9, '>')} {pad(_('1 process'), 9, '>')} "
            f"{pad(_('1 proc ÷'), 8, '>')} {pad(_('sent/rank B'), 11, '>')} {pad(_('predicted'), 9, '>')}")
    lines = [head, "-" * text_width(head)]
    for r in results:
        s = r["score_bytes_per_rank"]
        lines.append(f"{r['variant']:<8} {r['cp']:>2}  {_tiny(r['max_output_diff']):>10} "
                     f"{_tiny(r['max_grad_diff']):>11}  {s['measured']:>13,} {s['predicted']:>9,} "
                     f"{s['one_process']:>9,} {s['one_process'] / s['measured']:>8g} "
                     f"{r['bytes_sent_per_rank']['measured']:>11,} {r['bytes_sent_per_rank']['predicted']:>9,}")
    return "\n".join(lines)


def _tiny(x: float) -> str:
    """A difference as an order of magnitude: ``< 1e-12`` (rounding noise varies by the last bit)."""
    for bound in (1e-12, 1e-10, 1e-8, 1e-6):
        if x < bound:
            return f"< {bound:.0e}"
    return f"{x:.2g}"


def compare_costs(cps: Sequence[int] = (2, 4, 8), link_name: str = "nvlink4", flops: float = 400e12,
                  **shape) -> list[dict]:
    """``context_cost`` of ring and Ulysses, causal, for the ``BIG`` shape (or ``shape``) on
    ``link_name`` with ``flops`` achieved FLOP/s: one row per (cp, variant)."""
    shape = {**BIG, **shape}
    link = hardware.LINKS[link_name]
    rows = []
    for cp in cps:
        for variant in ("ring", "ulysses"):
            c = context_cost(variant, cp=cp, link=link, flops=flops, causal=True, **shape)
            rows.append({"cp": cp, "variant": variant, "messages": c.messages, "gb_sent": c.bytes_sent / 1e9,
                         "comm_ms": c.comm_s * 1e3, "exposed_ms": c.exposed_comm_s * 1e3,
                         "compute_ms": c.compute_s * 1e3, "score_gb": c.score_peak_bytes / 1e9,
                         "heads_ok": shape["heads"] % cp == 0})
    return rows


def cost_table(rows: Sequence[Mapping]) -> str:
    """``compare_costs`` rows as text (one step: forward + backward of one attention layer)."""
    head = (f"{'cp':>3} {pad(_('variant'), 8)} {pad(_('messages'), 8, '>')} {pad(_('GB sent'), 8, '>')} "
            f"{pad(_('comm ms'), 8, '>')} {pad(_('exposed ms'), 10, '>')} {pad(_('compute ms'), 10, '>')} "
            f"{pad(_('largest scores GB'), 17, '>')}")
    lines, last = [head, "-" * text_width(head)], None
    for r in rows:
        if last is not None and r["cp"] != last:
            lines.append("")
        last = r["cp"]
        lines.append(f"{r['cp']:>3} {r['variant']:<8} {r['messages']:>8} {r['gb_sent']:>8.2f} {r['comm_ms']:>8.2f} "
                     f"{r['exposed_ms']:>10.2f} {r['compute_ms']:>10.1f} {r['score_gb']:>17.2f}")
    return "\n".join(lines)


def score_memory_figure(seqs: Sequence[int] = (8192, 32768, 131072, 524288), cps: Sequence[int] = (1, 4, 16),
                        heads: int = 64, dtype_bytes: int = 2) -> go.Figure:
    """GB of the full score matrix ``heads·s²`` per rank if a rank held its ``s/cp`` rows of it,
    ``heads·s²/cp`` (what plain sequence splitting would keep), against the sequence length."""
    fig = go.Figure()
    for i, cp in enumerate(cps):
        gb = [round(heads * s * s * dtype_bytes / cp / 1e9, 3) for s in seqs]
        fig.add_trace(go.Scatter(x=list(seqs), y=gb, mode="lines+markers", name=f"cp = {cp}",
                                 line=dict(color=RANK_COLOURS[i])))
    fig.add_hline(y=141, line_dash="dot", annotation_text=_("one H200: 141 GB"))
    fig.update_layout(**plain_layout(height=340, xaxis_title=_("sequence length s (tokens)"),
                                     yaxis_title=_("GB of scores per rank (one layer, batch 1)"),
                                     title=_("The s² wall: {heads} heads × s² × {bytes} bytes, ÷ cp").format(
                                         heads=heads, bytes=dtype_bytes)))
    fig.update_xaxes(type="log", tickvals=list(seqs))
    fig.update_yaxes(type="log")
    return fig


# ----------------------------------------------------------------------------------------------
# The lesson's printed lines (through the catalog, so that they follow the lesson's language).

def scores_line(heads: int, seq: int, bytes_per_value: int) -> str:
    """The bytes of one layer's attention scores: heads × s² × bytes per value."""
    return _("scores of one layer: {heads} heads × s² × {b} bytes = {gb:,.0f} GB at s = {s:,}").format(
        heads=heads, b=bytes_per_value, gb=heads * seq * seq * bytes_per_value / 1e9, s=seq)


def merged_line(what: str, difference: float) -> str:
    """``what`` (a merge of blocks) against the full softmax: the largest difference."""
    return _("{what} vs the full softmax: max |difference| {d:.1e}").format(what=what, d=difference)


def blocks_merged_lines(difference: float, queries: int, block: int, keys: int) -> str:
    """Section 2's check: the blocks merged one by one against the full softmax, and the score tensor held."""
    return "\n".join([merged_line(_("{n} blocks merged").format(n=keys // block), difference),
                      _("largest score tensor held: {q} x {b} per head (blockwise) instead of {q} x {k}").format(
                          q=queries, b=block, k=keys)])


def stable_lse_line(naive: float, stable: float) -> str:
    """log(e^a + e^b) at a = 1000, b = 995, computed naively and with the maximum subtracted."""
    return _("lse_a = 1000, lse_b = 995: naive log(e^a + e^b) = {naive}, with the maximum subtracted = "
             "{stable:.6f}").format(naive=naive, stable=stable)


def work_line(work: Mapping) -> str:
    """``causal_work`` as a line: scores per rank under the contiguous and the zig-zag split."""
    return _("scores computed per rank: contiguous {contiguous}, zig-zag {zigzag} (the same total, {total})").format(
        contiguous=work["contiguous"], zigzag=work["zigzag"], total=sum(work["zigzag"]))


def score_bytes_lines(results: Sequence[Mapping]) -> str:
    """Per run: the largest score tensor measured on a rank against one process / cp and / cp²."""
    lines = []
    for r in results:
        scores = r["score_bytes_per_rank"]
        lines.append(_("{variant} cp {cp}: measured {measured:>6,} B, one process / cp = {per_cp:>6,} B (s²/cp), "
                       "one process / cp² = {per_cp2:>6,} B").format(
            variant=pad(r["variant"], 8), cp=r["cp"], measured=scores["measured"],
            per_cp=scores["one_process"] // r["cp"], per_cp2=scores["one_process"] // r["cp"] ** 2))
    return "\n".join(lines)


def calls_line(result: Mapping) -> str:
    """Rank 0's collectives in one forward and backward of a run."""
    return _("{variant} cp {cp}, rank 0's calls in one forward and backward: {calls}").format(
        variant=result["variant"], cp=result["cp"], calls=result["collectives"])


def refused_line(variant: str, cp: int, error: Exception) -> str:
    """A run refused before any process started, with the library's reason."""
    return _("{variant}, cp {cp}, refused: {error}").format(variant=variant, cp=cp, error=error)


def run_line(result: Mapping) -> str:
    """One run against the dense attention: its largest differences and its score bytes per rank."""
    message = _("{variant}, cp {cp}, s = {seq}: max |Δout| {out}, max |Δgrad| {grad}, scores per rank {scores:,} B")
    return message.format(
        variant=result["variant"], cp=result["cp"], seq=result["config"]["seq"], out=_tiny(result["max_output_diff"]),
        grad=_tiny(result["max_grad_diff"]), scores=result["score_bytes_per_rank"]["measured"])


def not_written_yet(name: str) -> str:
    """What a try-it cell says when the student's function still raises NotImplementedError."""
    return _("{name} is not written yet: fill it in above, run its cell, then this one").format(name=name)
