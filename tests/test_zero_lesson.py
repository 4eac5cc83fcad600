"""Lesson 12's figures and tables (parallel_lab.show.zero) against the engine's numbers: the formula
figure is zero.memory's (and ZeRO's Figure 1), the measured tables are the run's own bytes, the
traffic is 2Ψ / 3Ψ, the Gantt chart draws exactly the placed timeline; plus the lesson's graded
prediction and quiz answers. No timing is asserted."""

import pytest

from parallel_lab.course.predictions import GRADED
from parallel_lab.course.quiz import answers
from parallel_lab.hardware import GIGABIT_ETHERNET
from parallel_lab.show import zero as zf
from parallel_lab.zero import memory, traffic
from parallel_lab.zero.run import run_zero


@pytest.fixture(scope="module")
def reports():
    return {stage: run_zero(stage=stage, dp=2, steps=1) for stage in range(4)}


@pytest.fixture(scope="module")
def overlapped():
    return run_zero(stage=3, dp=2, steps=1, overlap=True)


def test_stage_memory_is_the_formula_and_zero_figure_1():
    rows = zf.stage_memory()
    assert [round(r["total"] / 1e9, 1) for r in rows] == [120.0, 31.4, 16.6, 1.9]  # Rajbhandari et al., Fig. 1
    for r in rows:
        want = memory.per_rank(7.5e9, 64, r["stage"], 2, adam_bytes=12)
        assert all(r[k] == want[k] for k in ("parameters", "gradients", "optimizer"))
    fig = zf.stage_memory_figure(rows)
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["Adam state"] == [round(r["optimizer"] / 1e9, 3) for r in rows]
    assert "activations" not in bars  # Figure 1 counts the model state only


def test_four_way_keeps_the_activations_at_every_stage():
    rows = zf.four_way("GPT-3 6.7B", dp=64)
    assert len({r["activations"] for r in rows}) == 1 and rows[0]["activations"] > 0
    assert rows[3]["total"] - rows[3]["activations"] == pytest.approx(16 * rows[0]["parameters"] / 2 / 64)


@pytest.mark.ranks
def test_memory_table_and_figure_show_the_measured_bytes(reports):
    rows = zf.memory_rows(reports)
    for row in rows:
        cell = reports[row["stage"]]["memory_per_rank"][row["part"]]
        assert row["measured"] == cell["measured"] and row["predicted"] == round(cell["predicted"])
    for part in zf.PARTS:  # each category equals the formula to the byte
        assert all(row["measured"] == row["predicted"] for row in rows if row["part"] == part)
    table = zf.memory_table(reports)
    assert f"{reports[3]['memory_per_rank']['optimizer']['measured']:,}" in table
    fig = zf.memory_figure(reports)
    measured = {t.name: list(t.y) for t in fig.data}
    assert measured["gradients (measured)"] == [reports[s]["memory_per_rank"]["gradients"]["measured"] / 1e6
                                                 for s in range(4)]
    totals = [row["predicted"] / 1e6 for row in rows if row["part"] == "total"]
    assert list(fig.data[-1].y) == totals and totals == sorted(totals, reverse=True)  # falls stage by stage


@pytest.mark.ranks
def test_traffic_is_two_then_three_psi(reports):
    rows = zf.traffic_rows(reports)
    assert [r["measured_psi"] for r in rows] == [2, 2, 2, 3] == [r["predicted_psi"] for r in rows]
    for r in rows:
        assert r["measured"] == traffic.volume(reports[r["stage"]]["collectives"], 2)
    fig = zf.traffic_figure(reports)
    assert list(fig.data[0].y) == [2, 2, 2, 3]
    assert "all-reduce 6x" in zf.traffic_table(reports).splitlines()[2]


@pytest.mark.ranks
def test_equality_table_says_every_stage_equals_one_process(reports):
    lines = zf.equality_table(reports).splitlines()[2:]
    assert len(lines) == 4 and all(line.endswith("yes") for line in lines)


@pytest.mark.ranks
def test_overlap_gantt_draws_the_placed_timeline(overlapped):
    placed = overlapped["timeline"]["virtual"]
    fig = zf.overlap_gantt(overlapped)
    comm = [t for t in fig.data if t.name in ("all-gather", "reduce-scatter")]
    assert sum(len(t.x) for t in comm) == sum(len(c) for c in placed["comm"])
    compute = sum(len(t.x) for t in fig.data) - sum(len(t.x) for t in comm)
    assert compute == sum(len(c) for c in placed["compute"])
    order = zf.comm_order(overlapped)
    assert order[:6] == ["all-gather embed", *(f"all-gather blocks.{i}" for i in range(4)), "all-gather head"]
    assert order.count("reduce-scatter blocks.0") == 1 and len(order) == 18
    serial = zf.overlap_gantt(overlapped, which="serial")
    assert "serial" in serial.layout.title.text


@pytest.mark.ranks
def test_on_gigabit_ethernet_the_overlap_hides_communication_visibly():
    """Lesson 12 section 5 prices the collectives on Gigabit Ethernet so that the charts differ: the
    same measured work, placed with overlap, waits less for the network than placed serially, and the
    network's share of the serial step is large enough to see (not a timing: a placement of one run)."""
    report = run_zero(stage=3, dp=2, steps=1, overlap=True, link=GIGABIT_ETHERNET)
    v = report["virtual"]
    assert v["waiting_s"] < v["serial_waiting_s"] and v["step_s"] < v["serial_step_s"]
    comm = sum(end - start for _, _, start, end in report["timeline"]["serial"]["comm"][0])
    assert comm > 0.2 * v["serial_step_s"]  # 18 collectives of a 400 kB unit at 125 MB/s: milliseconds
    summary = zf.overlap_summary({3: report})
    assert summary.startswith("stage 3: step") and f"{v['serial_step_s'] * 1e3:.1f} ms serial" in summary


def test_link_table_is_traffic_over_bandwidth():
    rows = zf.link_rows(7.5e9, dp=64, tokens_per_gpu=8192)
    assert rows[3]["gb_sent"] == pytest.approx(1.5 * rows[2]["gb_sent"])
    assert rows[3]["network_s"] == pytest.approx(rows[3]["nvlink_s"] * 9)  # NDR 50 GB/s vs NVLink 4 450 GB/s


def test_graded_prediction_and_quiz_answers():
    assert GRADED["zero2-model-state"].lesson == "12"
    assert GRADED["zero2-model-state"].reference() == pytest.approx(2 + 14 / 8)
    assert answers.zero_model_state_gb(13, 16, 3) == pytest.approx(13.0)
    assert [answers.zero_traffic_per_step(s) for s in range(4)] == [2, 2, 2, 3]
