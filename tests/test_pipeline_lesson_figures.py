"""Pictures and tables of lessons 06-08 (parallel_lab.show.schedules, recompute_figures and
pipedream_figures): the numbers they
show against the closed forms of the papers, determinism and size of the JSON nbval stores, and the
weight versions predicted from the schedule. Only the last test starts ranks (PipeDream's modes)."""

import pytest

from parallel_lab.pipeline import communication, pipedream
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import simulate
from parallel_lab.planning import cost, memory
from parallel_lab.show import pipedream as pf
from parallel_lab.show import recompute as rf
from parallel_lab.show import schedules as sf

# ----------------------------------------------------------------------------------------------
# Lesson 07: schedules compared.


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_schedule_rows_follow_the_closed_forms(p, m):
    rows = {r["schedule"]: r for r in sf.compare_schedules([(p, m)])}
    assert rows["1f1b"]["ratio"] == pytest.approx((p - 1) / m)
    assert rows["interleaved-1f1b"]["ratio"] == pytest.approx((p - 1) / (2 * m))  # v = 2
    assert rows["zb-h1"]["ratio"] == pytest.approx((p - 1) / (3 * m))  # F = I = W
    assert rows["zb-v"]["ratio"] < rows["zb-h1"]["ratio"]
    for r in rows.values():
        assert r["bubble"] == pytest.approx(r["ratio"] / (1 + r["ratio"]))
    # messages: 2 per boundary between ranks per microbatch; ZB-V's turn at the bottom is local
    assert rows["1f1b"]["messages"] == rows["zb-h1"]["messages"] == 2 * (p - 1) * m
    assert rows["interleaved-1f1b"]["messages"] == 2 * (2 * p - 1) * m
    assert rows["zb-v"]["messages"] == 2 * (2 * p - 2) * m
    # memory in whole stages: 1F1B, ZB-H1 and ZB-V peak at p on their busiest rank; interleaving more
    assert rows["1f1b"]["peak"] == rows["zb-h1"]["peak"] == rows["zb-v"]["peak"] == min(p, m)
    assert rows["interleaved-1f1b"]["peak"] > p


def test_message_count_is_the_quiz_answer():
    assert communication.message_count("interleaved-1f1b", 4, 8, 2) == 112.0
    assert communication.message_count("1f1b", 4, 8) == 48.0
    assert communication.message_count("naive", 3, 1) == 4.0


def test_schedule_table_has_a_row_per_case_and_schedule():
    rows = sf.compare_schedules([(4, 8), (8, 16)])
    text = sf.schedule_table(rows)
    lines = [line for line in text.splitlines()[2:] if line.strip()]
    assert len(lines) == len(rows) == 8
    assert "interleaved-1f1b v=2" in text and "27.3%" in text


def test_bubble_curves_are_the_simulated_bubbles_deterministic_and_compact():
    fig = sf.bubble_curves(ranks=4)
    names = [t.name for t in fig.data]
    assert names == ["1f1b", "interleaved-1f1b v=2", "zb-h1", "zb-v", "interleaved-1f1b v=4"]
    zb_v = fig.data[3]
    assert list(zb_v.y) == [round(simulate(build("zb-v", 4, m), sf.UNIT).bubble_fraction, 4) for m in zb_v.x]
    for trace in fig.data:  # more microbatches, smaller bubble
        assert list(trace.y) == sorted(trace.y, reverse=True)
    assert fig.to_json() == sf.bubble_curves(ranks=4).to_json()
    assert len(fig.to_json()) < 3000


# ----------------------------------------------------------------------------------------------
# Lesson 08: recomputation's trade-off.


def test_recompute_overhead_counts_flops():
    gpt3 = memory.MODELS["GPT-3 175B"]
    assert cost.recompute_overhead(gpt3, "none") == 0
    assert cost.recompute_overhead("GPT-3 175B", "full") == pytest.approx(1 / 3)
    s, h = gpt3.seq, gpt3.hidden
    selective = cost.recompute_overhead(gpt3, "selective")
    # the attention core's 4bs^2h over the step's 3 x (24bsh^2 + 4bs^2h)
    assert selective == pytest.approx(4 * s * s * h / (3 * (24 * s * h * h + 4 * s * s * h)))
    assert 0.005 < selective < 0.01
    with pytest.raises(ValueError, match="unknown recompute 'some'"):
        cost.recompute_overhead(gpt3, "some")


def test_recompute_points_trade_memory_for_compute():
    points = rf.recompute_points("GPT-3 175B", micro_batches=(1, 2))
    assert [(q["micro_batch"], q["recompute"]) for q in points] == [
        (1, "none"), (1, "selective"), (1, "full"), (2, "none"), (2, "selective"), (2, "full")]
    for b in (1, 2):
        mine = [q for q in points if q["micro_batch"] == b]
        assert [q["overhead"] for q in mine] == sorted(q["overhead"] for q in mine)
        assert [q["total_gb"] for q in mine] == sorted((q["total_gb"] for q in mine), reverse=True)
    # the lesson's story: micro-batch 1 overflows 80 GB without recomputation, fits with selective
    one = {q["recompute"]: q["total_gb"] for q in points if q["micro_batch"] == 1}
    assert one["none"] > 80 > one["selective"]


def test_recompute_tradeoff_figure_is_deterministic_and_compact():
    fig = rf.recompute_tradeoff("GPT-3 175B", micro_batches=(1, 2, 4))
    assert [t.name for t in fig.data] == ["micro-batch 1", "micro-batch 2", "micro-batch 4"]
    assert all(len(t.x) == 3 for t in fig.data)
    assert fig.to_json() == rf.recompute_tradeoff("GPT-3 175B", micro_batches=(1, 2, 4)).to_json()
    assert len(fig.to_json()) < 2500


# ----------------------------------------------------------------------------------------------
# Lesson 08: PipeDream's weight versions, from the schedule.


@pytest.mark.parametrize("p, steps, m", [(4, 3, 4), (3, 2, 5), (2, 4, 2)])
def test_expected_versions(p, steps, m):
    v = pipedream.expected_versions(p, steps, m)
    n = steps * m
    for s in range(p):
        assert [j for j, _, _ in v["no-stash"][s]] == list(range(n))
        stale = [b - f for _, f, b in v["no-stash"][s]]
        assert stale == [min(j, p - 1 - s) for j in range(n)]  # ramps up, then p-1-s
        assert all(f == b for _, f, b in v["stash"][s])
        assert [f for _, f, _ in v["stash"][s]] == [f for _, f, _ in v["no-stash"][s]]
        assert [(f, b) for _, f, b in v["flush"][s]] == [(j // m, j // m) for j in range(n)]
    assert [pipedream.staleness(p, s) for s in range(p)] == [p - 1 - s for s in range(p)]
    assert [pipedream.stashed_versions(p, s) for s in range(p)] == [p - s for s in range(p)]


def test_versions_text_marks_backwards_with_other_weights():
    text = pf.versions_text(pipedream.expected_versions(4, 3, 4), stage=0)
    lines = text.splitlines()
    assert lines[1].split() == ["microbatch"] + [str(j) for j in range(12)]
    assert lines[2].split()[:5] == ["no-stash", "0/0", "0/1*", "0/2*", "0/3*"]
    assert lines[3].split()[5:7] == ["1/1", "2/2"]
    assert lines[4].split()[-1] == "2/2"


def test_versions_figure_shows_staleness_and_accepts_compare_modes_output():
    expected = pipedream.expected_versions(4, 3, 4)
    # compare_modes' shape: per mode a dict whose "versions" are per stage lists of lists
    measured = {mode: {"versions": [[list(t) for t in reversed(stage)] for stage in per_stage]}
                for mode, per_stage in expected.items()}
    fig = pf.versions_figure(measured, microbatches=4)
    assert fig.to_json() == pf.versions_figure(expected, microbatches=4).to_json()
    no_stash, stash, flush = fig.data
    assert [row[-1] for row in no_stash.z] == [3, 2, 1, 0]
    assert no_stash.text[0][4] == "1→4" and stash.text[0][4] == "1" and flush.text[3][11] == "2"
    assert all(z == 0 for row in stash.z + flush.z for z in row)
    assert fig.layout.coloraxis.cmax == 3
    assert len(fig.to_json()) < 6000


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_versions_recorded_on_ranks_are_those_of_the_schedule():
    out = pipedream.compare_modes(stages=4, steps=2, microbatches=3, lr=0.1)
    expected = pipedream.expected_versions(4, 2, 3)
    for mode in pipedream.MODES:
        assert [sorted(tuple(v) for v in stage) for stage in out[mode]["versions"]] == expected[mode], mode
    assert out["stash"]["peak_versions"] == [pipedream.stashed_versions(4, s, microbatches=6) for s in range(4)]
    assert out["stash"]["peak_versions"] == [3, 3, 2, 1]  # 6 microbatches do not fill stage 0 yet
