"""Pictures and tables of lesson 14 (parallel_lab.show.context): the numbers they show against the
engine's (``context.blockwise.step_block``, ``context.cost.context_cost``), determinism, and the
graded prediction's reference. No ranks start and nothing is timed."""

import pytest

from parallel_lab import hardware
from parallel_lab.context.blockwise import step_block
from parallel_lab.context.cost import _ring_blocks, context_cost
from parallel_lab.course.predictions import GRADED
from parallel_lab.course.quiz import answers
from parallel_lab.show import context as cf


@pytest.mark.parametrize("cp, seq", [(2, 8), (4, 16), (4, 32), (8, 32)])
def test_the_steps_cover_the_causal_triangle_exactly_once(cp, seq):
    cells = cf.computed_cells(cp, seq, causal=True)
    seen = [pair for step in cells for rank in step for pair in rank]
    assert len(seen) == len(set(seen)) == seq * (seq + 1) // 2
    assert all(k <= q for q, k in seen)


@pytest.mark.parametrize("cp, seq", [(2, 8), (4, 16)])
def test_the_steps_cover_the_whole_matrix_without_a_mask(cp, seq):
    seen = {pair for step in cf.computed_cells(cp, seq, causal=False) for rank in step for pair in rank}
    assert len(seen) == seq * seq


def test_the_figure_colours_each_score_by_the_rank_that_computes_it():
    cp, seq = 4, 16
    fig = cf.ring_steps_figure(cp, seq)
    assert len(fig.data) == cp
    cells = cf.computed_cells(cp, seq)
    for step, trace in enumerate(fig.data):
        z = trace.z
        for rank in range(cp):
            mine = {(q, k) for q in range(seq) for k in range(seq) if z[q][k] == rank}
            assert mine == set(cells[step][rank])
    assert fig.to_json() == cf.ring_steps_figure(cp, seq).to_json()


def test_the_table_names_the_source_and_the_block_of_step_block():
    cp, seq = 4, 16
    lines = cf.ring_table(cp, seq).splitlines()[3:]
    assert len(lines) == cp
    for step, line in enumerate(lines):
        cells = [c.strip() for c in line.split("|")[1:]]
        for rank, cell in enumerate(cells):
            src = (rank - step) % cp
            b = step_block(rank, src, cp, seq // cp, True)
            rows, cols = b.rows.stop - b.rows.start, b.cols.stop - b.cols.start
            assert cell.startswith(f"K/V of r{src},") and f"{rows}x{cols}" in cell
            assert ("◣" in cell) == (step == 0)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_balances_the_causal_work_and_matches_the_cost_model(cp):
    seq = 8 * cp
    work = cf.causal_work(cp, seq)
    t = seq // cp
    assert len(set(work["zigzag"])) == 1
    assert work["zigzag"][0] == sum(r * c for r, c in _ring_blocks(cp, t, True))
    assert sum(work["contiguous"]) == sum(work["zigzag"])
    assert work["contiguous"][-1] == cp * work["contiguous"][0]
    fig = cf.work_figure(cp, seq)
    assert list(fig.data[0].y) == work["contiguous"] and list(fig.data[1].y) == work["zigzag"]


def test_cost_rows_are_context_cost():
    rows = cf.compare_costs(cps=(2, 8))
    assert [(r["cp"], r["variant"]) for r in rows] == [(2, "ring"), (2, "ulysses"), (8, "ring"), (8, "ulysses")]
    for r in rows:
        c = context_cost(r["variant"], cp=r["cp"], link=hardware.LINKS["nvlink4"], flops=400e12, causal=True,
                         **cf.BIG)
        assert r["messages"] == c.messages
        assert r["gb_sent"] == pytest.approx(c.bytes_sent / 1e9)
        assert r["score_gb"] == pytest.approx(c.score_peak_bytes / 1e9)
        assert r["exposed_ms"] == pytest.approx(c.exposed_comm_s * 1e3)
    text = cf.cost_table(rows)
    assert len([line for line in text.splitlines()[2:] if line.strip()]) == len(rows)


def test_score_memory_figure_is_heads_s2_over_cp():
    fig = cf.score_memory_figure(seqs=(1024, 4096), cps=(1, 4), heads=8, dtype_bytes=2)
    assert list(fig.data[1].y) == [round(8 * s * s * 2 / 4 / 1e9, 3) for s in (1024, 4096)]


def test_runs_table_shows_the_run_report():
    report = {"variant": "ring", "cp": 4, "max_output_diff": 3e-16, "max_grad_diff": 2e-11,
              "score_bytes_per_rank": {"measured": 8192, "predicted": 8192, "one_process": 131072},
              "bytes_sent_per_rank": {"measured": 163840, "predicted": 163840}}
    line = cf.runs_table([report]).splitlines()[2]
    assert "< 1e-12" in line and "< 1e-10" in line and "8,192" in line and "163,840" in line
    assert " 16 " in line  # one process / measured = cp²


def test_graded_prediction_and_quiz_answers_are_the_cost_model():
    assert GRADED["ring-score-bytes"].lesson == "14"
    assert GRADED["ring-score-bytes"].reference() == 2 * 8 * (32 // 4) ** 2 * 8
    assert answers.context_score_bytes("ulysses", 2, 32, 8, 4, 8, 64) == 2 * (8 // 4) * 32 ** 2 * 8
    assert answers.context_messages("ring", 8) == 2 * 7 + 8
    assert answers.context_messages("ulysses", 8) == 4 * 7
