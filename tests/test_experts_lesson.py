"""Lesson 13's figures and tables (parallel_lab.show.experts) hold the engine's numbers: the loads and
drops are models.MoE's routing, the dispatch matrix is what expert parallelism sends on real ranks
(commlog's bytes, the rows each expert ran on), the costs are moe.cost's and hardware's. No timings."""

import pytest

from parallel_lab import models
from parallel_lab.hardware import LINKS, ring_all_reduce_time
from parallel_lab.moe import cost
from parallel_lab.moe.run import Case, reference, run_moe
from parallel_lab.show import experts as xf

CASE = Case(capacity_factor=1.0)  # the lesson's: 64 tokens, 8 experts, top-2, drops


@pytest.fixture(scope="module")
def routing():
    return xf.dense_routing(CASE)


def test_dense_routing_is_the_run_s_reference(routing):
    ref = reference(CASE)
    assert routing.dropped == ref["dropped"] > 0
    assert routing.tokens_per_expert.tolist() == ref["tokens_per_expert"]
    assert routing.routed_per_expert.tolist() == ref["routed_per_expert"]
    assert routing.capacity == models.expert_capacity(64, 8, 2, 1.0) == 16


def test_load_figure_stacks_kept_choices_and_drops_under_the_capacity(routing):
    fig = xf.load_figure(routing)
    kept = [trace for trace in fig.data if "kept" in trace.name]
    dropped = next(trace for trace in fig.data if "dropped" in trace.name)
    assert len(kept) == CASE.top_k
    assert [sum(v) for v in zip(*(t.y for t in kept))] == routing.tokens_per_expert.tolist()
    assert [k + d for k, d in zip(routing.tokens_per_expert.tolist(), dropped.y)] == routing.routed_per_expert.tolist()
    assert sum(dropped.y) == routing.dropped
    assert fig.layout.shapes[0].y0 == routing.capacity
    assert all(t <= routing.capacity for t in routing.tokens_per_expert.tolist())
    assert f"{routing.dropped} assignments dropped" in xf.load_table(routing)


def test_drops_figure_marks_exactly_the_dropped_assignments(routing):
    fig = xf.drops_figure(routing)
    z, text = fig.data[0].z, fig.data[0].text
    n, k = routing.expert.shape
    assert len(z) == k and len(z[0]) == n
    assert sum(row.count(0) for row in z) == routing.dropped
    for s in range(k):
        for t in range(n):
            assert text[s][t] == str(int(routing.expert[t, s]))
            assert (z[s][t] == 0) == (not bool(routing.kept[t, s]))


def test_dispatch_counts_cover_every_kept_assignment_once(routing):
    for ep in (1, 2, 4, 8):
        counts = xf.dispatch_counts(routing, ep)
        assert sum(map(sum, counts)) == int(routing.kept.sum())
        # column d: what rank d's experts run on, the whole batch's tokens_per_expert summed per rank
        per = 8 // ep
        assert [sum(row[d] for row in counts) for d in range(ep)] == \
            [sum(routing.tokens_per_expert.tolist()[d * per:(d + 1) * per]) for d in range(ep)]
    fig = xf.dispatch_figure(xf.dispatch_counts(routing, 4), hidden=16)
    assert fig.data[0].z == tuple(tuple(row) for row in xf.dispatch_counts(routing, 4)) or \
        [list(r) for r in fig.data[0].z] == xf.dispatch_counts(routing, 4)


def test_imbalance_grows_with_alike_tokens_and_starts_at_the_run_s_numbers():
    rows = xf.imbalance_rows(CASE, shifts=(0.0, 1.0, 2.0))
    ref = reference(CASE)
    assert rows[0]["dropped"] == ref["dropped"] and rows[0]["routed"] == ref["routed_per_expert"]
    assert rows[0]["aux_loss"] == round(ref["aux_loss"], 4)
    assert [r["dropped"] for r in rows] == sorted(r["dropped"] for r in rows)
    assert rows[-1]["aux_loss"] > rows[0]["aux_loss"] > 1.0 - 1e-9
    assert all(sum(r["routed"]) == 128 for r in rows)
    assert len(xf.imbalance_figure(rows).data) == 3


def test_cost_rows_are_moe_cost_and_the_ring_all_reduce():
    rows = xf.cost_rows(tokens=4096, hidden=4096, top_k=2, ranks=8)
    link = LINKS["nvlink4"]
    assert rows[0]["ep_ms"] == round(cost.moe_layer_time(4096, 4096, 2, 8, link) * 1e3, 3)
    tp_all_reduce = ring_all_reduce_time(4096 * 4096 * 2, 8, link.latency, link.bandwidth)
    assert rows[0]["tp_ms"] == round(2 * tp_all_reduce * 1e3, 3)
    assert rows[0]["ep_sent_mb"] == pytest.approx(2 * rows[0]["tp_sent_mb"], abs=0.2)  # k copies, half the bytes each
    assert "EP MB sent" in xf.cost_table(rows)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_dispatch_matrix_is_what_the_ranks_send(routing):
    ep = 4
    result = run_moe(ep=ep, experts=8, top_k=2, capacity_factor=1.0)
    counts = xf.dispatch_counts(routing, ep)
    row_bytes = CASE.hidden * 8  # fp64
    for r in range(ep):
        out_rows, in_rows = sum(counts[r]), sum(row[r] for row in counts)
        assert result["all_to_all_bytes"][r] == 2 * (out_rows + in_rows) * row_bytes
        assert sum(result["tokens_per_expert"][2 * r:2 * r + 2]) == in_rows
    assert result["dropped"] == routing.dropped
