"""Pure tests of the cost model and simulator: closed forms from the papers, an independent
reference, memory, the unit grid, the CLI summary, and invalid schedules."""

import functools
import json
import random
import sys
from dataclasses import replace

import pytest

from parallel_lab.pipeline.actions import Action, ScheduleError, parse_actions
from parallel_lab.pipeline.schedules import (
    build,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    naive,
    one_f_one_b,
    zb_h1,
    zb_v,
)
from parallel_lab.pipeline.simulate import Costs, parse_costs, simulate, summary, unit_grid
from parallel_lab.pipeline.validate import validate

GRID = [(p, m) for p in range(1, 9) for m in range(1, 17)]
EXACT = 1e-9


def reference_makespan(schedule, costs):
    """Independent pull-style definition: end(a) = cost(a) + max(end(previous on rank), inputs + hop)."""
    table, link = costs.per_stage(schedule.n_stages), costs.link
    previous, position = {}, {}
    for actions in schedule.ranks:
        done = [a for a in actions if a is not None]
        for before, a in zip([None] + done, done):
            previous[a] = before
    for a in previous:
        position[a.stage, a.kind, a.microbatch] = a
    owner = schedule.stage_to_rank

    def inputs(a):
        s, kind, j = a
        if kind == "F":
            return [position[s - 1, "F", j]] if s > 0 else []
        if kind == "W":
            return [position[s, "I", j]]
        grad = position.get((s + 1, "B", j)) or position.get((s + 1, "I", j))
        return [position[s, "F", j]] + ([grad] if grad else [])

    @functools.lru_cache(maxsize=None)
    def end(a):
        start = end(previous[a]) if previous[a] else 0.0
        for need in inputs(a):
            start = max(start, end(need) + (link if owner[need.stage] != owner[a.stage] else 0.0))
        return start + table[a.kind][a.stage]

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    return max(end(a) for a in previous)


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("f,b", [(1, 1), (1, 2), (2, 3)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, f, b):
    for p, m in GRID:
        t = simulate(build(name, p, m), Costs(F=f, B=b))
        assert abs(t.bubble_fraction - (p - 1) / (m + p - 1)) < EXACT, (p, m)
        assert abs(t.makespan - (m + p - 1) * (f + b)) < EXACT, (p, m)


def test_naive_bubble_is_p_minus_1_over_p():
    for p in range(1, 9):
        assert abs(simulate(naive(p)).bubble_fraction - (p - 1) / p) < EXACT


def test_peak_activations_1f1b_is_min_m_p_minus_r_and_gpipe_is_m():
    for p, m in GRID:
        assert simulate(one_f_one_b(p, m)).peak_activations == [min(m, p - r) for r in range(p)]
        assert simulate(gpipe(p, m)).peak_activations == [m] * p


@pytest.mark.parametrize("f,b", [(1, 1), (1, 2), (2, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal(f, b):
    for p in range(1, 9):
        for m in range(p, 17, p):
            for v in (1, 2, 3, 4):
                ideal = m * v * (f + b)  # per rank, with per-chunk costs f and b
                t = simulate(interleaved_1f1b(p, m, v), Costs(F=f, B=b))
                assert abs(t.makespan - ideal * (1 + (p - 1) / (v * m))) < EXACT, (p, m, v)


def test_zb_h1_bubble_is_a_third_of_1f1b():
    """F = I = W = 1: 1F1B idles 3(p-1) per rank, ZB-H1 only p-1, i.e. (p-1)/(3m) of the ideal 3m."""
    costs = Costs(F=1, B=2, I=1, W=1)
    for p, m in GRID:
        zb_idle = simulate(zb_h1(p, m), costs).makespan - 3 * m
        assert simulate(one_f_one_b(p, m), costs).makespan - 3 * m == 3 * (p - 1)
        if m >= p:
            assert zb_idle == p - 1, (p, m)
            assert abs(zb_idle / (3 * m) - (p - 1) / (3 * m)) < EXACT
        else:  # short pipeline: the last stage's F/I alternation paces it (2m + 2p - 1 in all)
            assert zb_idle == 2 * p - 1 - m, (p, m)
            assert zb_idle < 3 * (p - 1), (p, m)


def grid_peaks(schedule, w):
    """Peak activations per rank counted independently from the unit grid's strings: a microbatch
    holds 1 from the first slot of its F, frees 1 after its B's last slot, 1 - w after its I's and
    w after its W's (costs F=1, B=2, I=W=1)."""
    timeline = simulate(schedule, Costs(F=1, B=2, I=1, W=1), w_share=w)
    peaks = []
    for row in unit_grid(timeline).values():
        held, peak = 0.0, 0.0
        for t, cell in enumerate(row):
            kind = cell and Action.parse(cell).kind
            if cell and kind == "F" and (t == 0 or row[t - 1] != cell):
                held += 1
            peak = max(peak, held)
            if cell and (t + 1 == len(row) or row[t + 1] != cell):  # its last slot
                held -= {"F": 0, "B": 1, "I": 1 - w, "W": w}[kind]
        peaks.append(round(peak, 6))
    return peaks


@pytest.mark.parametrize("w", [1.0, 32 / 34, 0.5, 0.0])
def test_zb_h1_peaks_counted_until_w(w):
    """I frees M_B - M_W, W frees M_W (Qi et al. 2023, Table 1): rank r holds min(m, p - r) whole
    microbatches and up to r waiting for their W: (p - r) M_B + r M_W once m >= p, more than 1F1B's
    (p - r) M_B on every rank but the first."""
    for p, m in GRID:
        zb = simulate(zb_h1(p, m), w_share=w)
        full = [min(m, p - r) for r in range(p)]
        closed = [round(f + w * min(r, m - f), 6) for r, f in enumerate(full)]
        assert zb.peak_rank_activations == zb.peak_activations == closed, (p, m, w)
        assert grid_peaks(zb_h1(p, m), w) == closed, (p, m, w)
        assert max(closed) == min(m, p) == max(simulate(one_f_one_b(p, m)).peak_activations)


def test_zb_h1_schedule_json_reports_peaks_until_w():
    out = summary(zb_h1(4, 8))
    assert out["peak_activations"] == [4, round(3 + 32 / 34, 6), round(2 + 2 * 32 / 34, 6), round(1 + 3 * 32 / 34, 6)]
    assert out["w_share"] == round(32 / 34, 6)
    assert simulate(zb_h1(4, 8), w_share=1.0).peak_activations == [4, 4, 4, 4]


def test_split_backward_peaks_match_the_grid_count_for_every_split_schedule():
    for p, m in [(2, 3), (3, 5), (4, 8), (4, 12)]:
        for schedule in (zb_h1(p, m), zb_v(p, m)) + ((dualpipe_v(p, m),) if m >= 2 * p else ()):
            assert simulate(schedule, Costs(F=1, B=2, I=1, W=1)).peak_rank_activations == grid_peaks(schedule, 32 / 34)


def test_zb_v_reaches_the_start_up_lower_bound():
    """F = I = W = 1 per stage (half a rank's layers): rank p-1 cannot start before p-1, and with
    m >= 2p-1 ZB-V then never idles again: makespan 6m + p - 1, half ZB-H1's bubble for the same model."""
    costs = Costs(F=1, B=2, I=1, W=1)
    for p, m in GRID:
        t = simulate(zb_v(p, m), costs)
        if m >= 2 * p - 1:
            assert t.makespan == 6 * m + p - 1, (p, m)
        assert t.makespan <= simulate(zb_h1(p, m), Costs(F=2, B=4, I=2, W=2)).makespan, (p, m)
        # each stage is half a rank: 2 stashes per 1F1B microbatch, so 1F1B's rank-0 peak p becomes 2p
        # (counted until W; W follows its I at once in the steady state, so nothing is held at the peak)
        assert max(t.peak_rank_activations) == 2 * min(m, p), (p, m)


# ---------------------------------------------------------------- against an independent reference


def test_matches_reference_on_random_costs_and_links():
    rng = random.Random(0)
    for schedule in [gpipe(3, 5), one_f_one_b(4, 6), interleaved_1f1b(2, 4, 3), zb_h1(4, 3), zb_v(3, 7), naive(3),
                     dualpipe_v(3, 7)]:
        for _ in range(5):
            n = schedule.n_stages
            costs = Costs(
                F=[rng.uniform(0.5, 2) for _ in range(n)],
                B=[rng.uniform(1, 3) for _ in range(n)],
                I=[rng.uniform(0.5, 1.5) for _ in range(n)],
                W=[rng.uniform(0.5, 1.5) for _ in range(n)],
                latency=rng.uniform(0, 0.5),
                bytes_per_message=rng.uniform(0, 100),
                bandwidth=rng.uniform(100, 1000),
            )
            assert abs(simulate(schedule, costs).makespan - reference_makespan(schedule, costs)) < EXACT


def test_link_cost_adds_two_hops_per_boundary_to_naive():
    p = 4
    t = simulate(naive(p), Costs(F=1, B=2, latency=0.25, bytes_per_message=1e6, bandwidth=4e6))
    assert abs(t.makespan - (p * 3 + 2 * (p - 1) * 0.5)) < EXACT


def test_slowest_stage_bounds_1f1b():
    costs = Costs(F=[1, 3, 1, 1], B=[2, 6, 2, 2])
    t = simulate(one_f_one_b(4, 8), costs)
    assert t.makespan >= 8 * (3 + 6)
    assert t.busy == [24, 72, 24, 24]


def test_timeline_records_every_action_in_rank_order():
    s = zb_h1(3, 4)
    t = simulate(s)
    assert [[a for a, _, _ in timed] for timed in t.ranks] == s.ranks
    for timed in t.ranks:
        assert all(e0 <= s1 for (_, _, e0), (_, s1, _) in zip(timed, timed[1:]))


def test_idle_slots_carry_no_time():
    padded = replace(one_f_one_b(2, 1), ranks=[parse_actions("0F0 . . 0B0"), parse_actions(". 1F0 1B0 .")])
    assert simulate(padded).makespan == simulate(one_f_one_b(2, 1)).makespan == 6


def test_memory_curve_starts_and_ends_empty():
    t = simulate(one_f_one_b(4, 8))
    for s, curve in enumerate(t.memory):
        assert curve[0] == (0.0, 0) and curve[-1][1] == 0
        assert max(c for _, c in curve) == t.peak_activations[s]


def test_invalid_schedule_raises_the_validation_error():
    broken = replace(one_f_one_b(2, 2), ranks=[parse_actions("0F0 0B0 0F1 0B1"), parse_actions("1F0 1F1 1B0 1B1")])
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(broken)


# ---------------------------------------------------------------- costs


def test_split_costs_default_to_half_the_backward():
    table = Costs(F=1, B=3).per_stage(2)
    assert table == {"F": [1, 1], "B": [3, 3], "I": [1.5, 1.5], "W": [1.5, 1.5]}


def test_parse_costs():
    assert parse_costs("1,2,1") == Costs(F=1, B=2, I=1, W=1)
    assert parse_costs("1,3,1").I == 2
    assert parse_costs("1,2") == Costs(F=1, B=2)


@pytest.mark.parametrize(
    "text,message",
    [("1", "needs 2 or 3 numbers"), ("a,b", "needs numbers"), ("1,2,2", "needs 0 < W < B"),
     ("1,-2", "cost B must be > 0")],
)
def test_parse_costs_rejects(text, message):
    with pytest.raises(ScheduleError, match=message):
        parse_costs(text)


def test_per_stage_costs_must_match_the_stage_count():
    with pytest.raises(ScheduleError, match="cost F has 3 per-stage values, schedule has 4 stages"):
        simulate(one_f_one_b(4, 4), Costs(F=[1, 1, 1]))


# ---------------------------------------------------------------- grid and summary


def test_unit_grid_with_unit_costs():
    grid = unit_grid(simulate(one_f_one_b(2, 2), Costs(F=1, B=1)))
    assert grid == {0: ["0F0", "0F1", None, "0B0", None, "0B1"], 1: [None, "1F0", "1B0", "1F1", "1B1", None]}


def test_unit_grid_repeats_an_action_over_its_slots():
    grid = unit_grid(simulate(naive(2)))  # F=1, B=2
    assert grid == {0: ["0F0", None, None, None, "0B0", "0B0"], 1: [None, "1F0", "1B0", "1B0", None, None]}


def test_unit_grid_with_fractional_costs_lists_actions_with_idle_gaps():
    grid = unit_grid(simulate(naive(2), Costs(F=0.5, B=1.25)))
    assert grid == {0: ["0F0", None, "0B0"], 1: [None, "1F0", "1B0"]}


def test_unit_grid_falls_back_to_action_order_when_huge():
    grid = unit_grid(simulate(naive(2), Costs(F=1e6, B=2e6)))
    assert grid == {0: ["0F0", None, "0B0"], 1: [None, "1F0", "1B0"]}


def test_summary_is_the_cli_contract():
    out = json.loads(json.dumps(summary(build("zb-v", 2, 4), parse_costs("1,2,1"))))
    keys = {"schedule", "stages", "microbatches", "ranks", "makespan", "bubble_fraction", "peak_activations"}
    assert keys <= set(out)
    assert (out["schedule"], out["stages"], out["microbatches"], out["virtual"]) == ("zb-v", 2, 4, 2)
    assert len(out["peak_activations"]) == 4
    assert set(out["ranks"]) == {"0", "1"}
    assert all(len(row) == out["makespan"] for row in out["ranks"].values())
    busy = sum(cell is not None for row in out["ranks"].values() for cell in row)
    assert abs(out["bubble_fraction"] - (1 - busy / (2 * out["makespan"]))) < EXACT


def test_closed_forms_hold_at_the_caps():
    """p = 64 ranks, m = 512 microbatches (the course's caps): the same closed forms as on small grids."""
    p, m = 64, 512
    for name in ("gpipe", "1f1b"):
        t = simulate(build(name, p, m))
        assert abs(t.bubble_fraction - (p - 1) / (m + p - 1)) < EXACT
    assert simulate(build("1f1b", p, m)).peak_activations == [p - r for r in range(p)]
    costs = Costs(F=1, B=2, I=1, W=1)
    assert simulate(build("zb-h1", p, m), costs).makespan == 3 * m + p - 1
    assert simulate(build("zb-v", p, m), costs).makespan == 6 * m + p - 1


def test_a_schedule_that_settles_slowly_is_validated_then_finished(monkeypatch):
    """After SWEEPS_BEFORE_VALIDATE sweeps the simulator asks validate() whether it is looking at a
    deadlock; a valid schedule then keeps sweeping to the exact answer."""
    import parallel_lab.pipeline.simulate as sim

    checked = []
    monkeypatch.setattr(sim, "SWEEPS_BEFORE_VALIDATE", 1)
    monkeypatch.setattr(sim, "validate", lambda schedule: checked.append(schedule) or schedule)
    schedule = one_f_one_b(4, 6)
    costs = Costs(F=[1, 3, 1, 2], B=[2, 5, 2, 3], latency=0.5)
    assert abs(simulate(schedule, costs).makespan - reference_makespan(schedule, costs)) < EXACT
    assert checked == [schedule]


def _rows(schedule, *rows):
    return replace(schedule, ranks=[parse_actions(row) for row in rows])


@pytest.mark.parametrize("schedule", [
    _rows(one_f_one_b(2, 2), "0F0 0F1 0B0", "1F0 1B0 1F1 1B1"),  # missing
    _rows(one_f_one_b(2, 2), "0F0 0F1 0B0 0B1 0B1", "1F0 1B0 1F1 1B1"),  # repeated
    _rows(zb_h1(1, 2), "0F0 0I0 0W0 0F1 0I1"),  # missing W
    _rows(zb_h1(1, 1), "0F0 0I0 0B0"),  # B mixed with I/W
    _rows(zb_h1(1, 1), "0F0 0B0 0W0"),
    _rows(one_f_one_b(2, 2), "0F0 0B0 0F1 0B1", "1B0 1F0 1F1 1B1"),  # B before its F
    _rows(zb_h1(1, 2), "0F0 0W0 0I0 0F1 0I1 0W1"),  # W before its I
    _rows(zb_v(2, 1), "0F0 3F0 3I0 0I0 0W0 3W0", "1F0 2I0 2F0 1I0 1W0 2W0"),  # across stages, one rank
    _rows(one_f_one_b(2, 2), "0F0 0F1 0B0 0B1", "1F0 1B0 0F1 1B1"),  # wrong rank
    _rows(one_f_one_b(1, 1), "0F0 0B0 0F1"),  # out of range
    _rows(one_f_one_b(2, 1), "0F0 0B0"),  # a rank list short
    _rows(one_f_one_b(2, 2), "0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"),  # deadlock
    replace(one_f_one_b(1, 1), ranks=[[(0, "F", 0), (0, "X", 0)]]),  # not an action
    replace(one_f_one_b(1, 1), ranks=[[(0, "F", 0), (0, "BB", 0)]]),
])
def test_every_invalid_schedule_raises_validates_error(schedule):
    with pytest.raises(ScheduleError) as expected:
        validate(schedule)
    with pytest.raises(ScheduleError) as got:
        simulate(schedule)
    assert str(got.value) == str(expected.value)
