"""ZeRO stages 0-3 on real ranks against one process, and the memory and traffic formulas.

Pure first: the paper's Figure 1 numbers, the traffic rules, the checks made before launch, Adam on
a shard against torch.optim.Adam, the flat units, the virtual clock's placement rules. Then every
stage, without and with overlap, on 2 and 4 gloo ranks in one launch per world size (a GPT whose
units do not divide by 4, so padding is exercised): after 3 Adam steps in fp64 every parameter and
every step's loss equal one process with torch.optim.Adam to 1e-10; the measured model state per
rank is within 10 % of ``zero.memory.per_rank``; the traffic of a step is within 10 % of 2Ψ
(stages 0-2) or 3Ψ (stage 3), with the expected collectives; on the virtual clock collectives
overlap compute only with overlap on, and overlap never lengthens the step. Last, the command
line's JSON.
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parallel_lab import models
from parallel_lab.hardware import Link
from parallel_lab.runtime import launcher
from parallel_lab.zero import memory, traffic
from parallel_lab.zero import run as zrun
from parallel_lab.zero.adam import AdamState, adam_step
from parallel_lab.zero.engine import FlatUnit, Zero, gpt_units
from parallel_lab.zero.overlap import collective_seconds, place, serial

TOL = 1e-10
# Units of 290 (embed), 1330 (each block) and 250 (head) parameters: none divides by 4.
CONFIG = models.GPTConfig(vocab=23, seq=6, hidden=10, heads=2, layers=2)
EXE = str(Path(sys.executable).with_name("parallel-lab"))
SLOW = Link("slow", 1e8, 20e-6)  # 100 MB/s: collectives cost as much as this GPT's compute


# ----------------------------------------------------------------------------------------------
# The formulas.


def test_per_rank_gives_the_papers_figure_1():
    """Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N = 64, K = 12, fp16 values."""
    gb = {stage: memory.per_rank(7.5e9, 64, stage, value_bytes=2, adam_bytes=12)["total"] / 1e9 for stage in range(4)}
    assert gb[0] == pytest.approx(120) and gb[1] == pytest.approx(31.4, abs=0.05)
    assert gb[2] == pytest.approx(16.6, abs=0.05) and gb[3] == pytest.approx(1.9, abs=0.05)


def test_per_rank_shards_one_more_category_per_stage():
    psi, dp, unit = 1000, 4, 100
    rows = [memory.per_rank(psi, dp, stage, value_bytes=8, unit=unit) for stage in range(4)]
    assert [r["optimizer"] for r in rows] == [16 * psi, 4 * psi, 4 * psi, 4 * psi]  # 2 moments x 8 B
    assert [r["gradients"] for r in rows] == [8 * psi, 8 * psi, 2 * psi, 2 * psi]
    assert [r["parameters"] for r in rows] == [8 * psi, 8 * psi, 8 * psi, 2 * psi]
    assert [r["buffers"] for r in rows] == [0, 0, 8 * unit, 16 * unit]  # a unit's grad; + its params
    ahead = [memory.per_rank(psi, dp, stage, value_bytes=8, unit=unit, overlap=True)["buffers"] for stage in range(4)]
    assert ahead == [0, 0, 16 * unit, 24 * unit]  # one more unit in flight
    assert all(r["total"] == sum(r[c] for c in memory.CATEGORIES) for r in rows)


def test_traffic_is_two_psi_then_three_psi_and_volume_reads_commlog():
    assert [traffic.per_step(100, 4, s, 8)["volume"] for s in range(4)] == [1600, 1600, 1600, 2400]
    assert traffic.per_step(100, 4, 3, 8)["ring_sent"] == 1800
    log = {"all_gather_single": {"count": 2, "bytes": 50}, "reduce_scatter_single": {"count": 1, "bytes": 200}}
    assert traffic.volume(log, dp=4) == 50 * 4 + 200
    assert traffic.volume({"all_reduce": {"count": 3, "bytes": 100}}, dp=4) == 200
    with pytest.raises(ValueError, match="no volume rule for \\['broadcast'\\]"):
        traffic.volume({"broadcast": {"count": 1, "bytes": 8}}, dp=2)


@pytest.mark.parametrize("kwargs,message", [
    (dict(stage=4, dp=2), "stage must be one of 0, 1, 2, 3 .* got stage 4"),
    (dict(stage=True, dp=2), "got stage True"),
    (dict(stage=1, dp=3), "batch 8 % dp 3 != 0"),
    (dict(stage=1, dp=9, batch=9), "dp 9 > 8, the launcher's cap"),
    (dict(stage=1, dp=0), "dp must be a positive integer, got dp 0"),
    (dict(stage=1, dp=2, model="mlp"), "model must be one of"),
    (dict(stage=1, dp=2, steps=0), "steps must be a positive integer"),
])
def test_plan_refuses_bad_input_before_any_process(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zrun.plan(**kwargs)


def test_adam_on_a_flat_tensor_is_torch_adam():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(50, generator=gen, dtype=torch.float64)
    ref = w.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.1, betas=(0.8, 0.99), eps=1e-6)
    state = AdamState.zeros_like(w)
    for _ in range(4):
        g = torch.randn(50, generator=gen, dtype=torch.float64)
        ref.grad = g.clone()
        opt.step()
        adam_step(w, g, state, lr=0.1, betas=(0.8, 0.99), eps=1e-6)
    assert torch.equal(w, ref.detach()) and state.step == 4


def test_flat_unit_keeps_values_and_modules_and_pads_to_a_multiple_of_dp():
    model = models.GPT(CONFIG, seed=0).double()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = [id(p) for p in model.parameters()]
    units = [FlatUnit(name, module, dp=4, rank=3) for name, module in gpt_units(model)]
    assert [u.numel for u in units] == [290, 1330, 1330, 250]
    assert [u.padded for u in units] == [292, 1332, 1332, 252] and units[1].lo == 999
    assert [id(p) for p in model.parameters()] == ids  # the same parameter objects
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.untyped_storage().data_ptr() in {
            u.flat.untyped_storage().data_ptr() for u in units}
    with torch.no_grad():
        units[0].flat.zero_()
    assert model.embed.tok.weight.abs().sum() == 0  # parameters are views of the flat buffer


def test_units_must_cover_every_parameter_once():
    model = models.GPT(CONFIG, seed=0)
    with pytest.raises(ValueError, match="missing \\['head.ln.weight'"):
        Zero._check_cover(model, gpt_units(model)[:-1])
    with pytest.raises(ValueError, match="in several units"):
        Zero._check_cover(model, [*gpt_units(model), ("again", model.head)])


LINK = Link("test", 1e3, 0.5)  # a 100-byte collective over 2 ranks: 0.5 + 50 / 1e3 s per message


def test_collective_costs_are_ring_messages_and_an_all_reduce_is_both_halves():
    assert collective_seconds("all_gather_single", 100, 2, LINK) == pytest.approx(0.55)
    halves = [collective_seconds(op, 100, 2, LINK) for op in ("reduce_scatter_single", "all_gather_single")]
    assert collective_seconds("all_reduce", 100, 2, LINK) == pytest.approx(sum(halves))
    assert collective_seconds("all_reduce", 100, 4, LINK) == pytest.approx(6 * (0.5 + 25 / 1e3))
    assert collective_seconds("all_reduce", 100, 1, LINK) == 0


def test_place_starts_a_collective_when_every_rank_issued_it_and_waits_hold_compute():
    ag = ("all_gather_single", 100, "u")
    fast = [("compute", "F a", 1.0), ("issue", 0, *ag), ("compute", "F b", 2.0), ("wait", 0), ("compute", "F c", 1.0)]
    slow = [("compute", "F a", 3.0), ("issue", 0, *ag), ("compute", "F b", 0.1), ("wait", 0), ("compute", "F c", 1.0)]
    t = place([fast, slow], 2, LINK)
    assert t["comm"][0] == t["comm"][1] == [["all_gather_single", "u", 3.0, 3.55]]  # the later rank's issue
    assert t["compute"][0] == [["F a", 0, 1.0], ["F b", 1.0, 3.0], ["F c", 3.55, 4.55]]
    assert t["compute"][1][2] == ["F c", 3.55, 4.55] and t["makespan"] == pytest.approx(4.55)
    assert t["busy"] == [4.0, pytest.approx(4.1)] and t["waiting"][0] == pytest.approx(0.55)
    # Without overlap the same work waits at once: F b only after the collective.
    s = place([serial(fast), serial(slow)], 2, LINK)
    assert serial(fast)[2] == ("wait", 0) and s["compute"][0][1] == ["F b", 3.55, 5.55]
    assert s["makespan"] > t["makespan"]


def test_place_runs_collectives_in_issue_order_one_at_a_time():
    prog = [("issue", 0, "all_reduce", 100, "b"), ("issue", 1, "all_reduce", 100, "a"), ("compute", "B a", 0.1),
            ("wait", 0), ("wait", 1)]
    t = place([prog, prog], 2, LINK)
    (_, _, s0, e0), (_, _, s1, e1) = t["comm"][0]
    assert s0 == 0 and s1 == pytest.approx(e0) and t["makespan"] == pytest.approx(e1)


def test_place_refuses_programs_that_would_hang_or_disagree():
    ar = ("all_reduce", 8, "u")
    with pytest.raises(ValueError, match="ranks issue different collectives"):
        place([[("issue", 0, *ar), ("wait", 0)], []], 2, LINK)
    with pytest.raises(ValueError, match="waits for collective 0 before issuing it"):
        place([[("wait", 0), ("issue", 0, *ar)]] * 2, 2, LINK)


# ----------------------------------------------------------------------------------------------
# On real ranks: every stage of one world size in one launch.


def _runs(dp):
    return [zrun.plan(stage, dp, steps=3, batch=4, config=CONFIG, overlap=overlap, link=SLOW)
            for stage in memory.STAGES for overlap in (False, True)]


@functools.lru_cache(maxsize=None)
def results(dp):
    """Every (stage, overlap) of world size dp in one launch; -> {(stage, overlap): run_zero report}."""
    runs = _runs(dp)
    per_rank = launcher.run(zrun.zero_jobs, dp, args=(runs,), timeout=180)
    return {(run.stage, run.overlap): zrun.report(run, [r[i] for r in per_rank]) for i, run in enumerate(runs)}


CASES = [(dp, stage, overlap) for dp in (2, 4) for stage in memory.STAGES for overlap in (False, True)]
IDS = [f"dp{dp}-stage{stage}" + ("-overlap" if overlap else "") for dp, stage, overlap in CASES]


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp,stage,overlap", CASES, ids=IDS)
def test_parameters_and_losses_equal_one_process_with_torch_adam(dp, stage, overlap):
    r = results(dp)[stage, overlap]
    assert r["max_param_diff"] < TOL and r["loss_diff"] < TOL
    assert len(r["losses"]) == 3 and r["losses"][-1] < r["losses"][0]  # it trains


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp,stage,overlap", CASES, ids=IDS)
def test_measured_memory_per_rank_within_10_percent_of_the_formula(dp, stage, overlap):
    mem = results(dp)[stage, overlap]["memory_per_rank"]
    assert set(mem) == {*memory.CATEGORIES, "total"}
    for category, row in mem.items():
        assert memory.within(row["measured"], row["predicted"]), (category, row)
    # What sharding buys: stage 3 holds a shard of everything plus two units in flight.
    if stage == 3:
        r = results(dp)[stage, overlap]
        assert mem["parameters"]["measured"] < r["params"] * 8 / dp * 1.1
        assert mem["buffers"]["measured"] <= (3 if overlap else 2) * max(r["units"].values()) * 8 * 1.01


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp,stage,overlap", CASES, ids=IDS)
def test_traffic_per_step_within_10_percent_of_two_or_three_psi(dp, stage, overlap):
    r = results(dp)[stage, overlap]
    t = r["traffic_per_step"]
    assert t["predicted"] == (3 if stage == 3 else 2) * r["params"] * 8
    assert memory.within(t["measured"], t["predicted"]), t
    units = len(r["units"])
    expected = {0: {"all_reduce": units}, 1: {"reduce_scatter_single": units, "all_gather_single": units},
                2: {"reduce_scatter_single": units, "all_gather_single": units},
                3: {"reduce_scatter_single": units, "all_gather_single": 2 * units}}[stage]
    assert {op: c["count"] for op, c in r["collectives"].items()} == expected
    assert r["collectives_same_every_step"]


def _overlapping(intervals, others) -> bool:
    return any(a[-2] < b[-1] - 1e-12 and b[-2] < a[-1] - 1e-12 for a in intervals for b in others)


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp,stage,overlap", CASES, ids=IDS)
def test_virtual_clock_overlaps_collectives_with_compute_only_with_overlap(dp, stage, overlap):
    r = results(dp)[stage, overlap]
    placed = r["timeline"]["virtual"]
    assert len(placed["comm"]) == dp and len(placed["comm"][0]) == sum(c["count"] for c in r["collectives"].values())
    hidden = [_overlapping(placed["compute"][k], placed["comm"][k]) for k in range(dp)]
    if overlap:  # the last rank to issue the first in-flight collective computes while it travels
        assert any(hidden), placed
        assert r["virtual"]["step_s"] <= r["virtual"]["serial_step_s"] + 1e-12
    else:
        assert not any(hidden) and r["virtual"]["step_s"] == r["virtual"]["serial_step_s"]
    labels = {c[0] for c in placed["compute"][0]}
    assert {"F embed", "B head", "adam head"} <= labels


# ----------------------------------------------------------------------------------------------
# The command line.


def cli(*args, timeout=300):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_run_zero_json_contract():
    out = cli("run", "zero", "--stage", "3", "--dp", "2", "--steps", "2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"max_param_diff", "loss_diff", "memory_per_rank", "collectives", "traffic_per_step"} <= set(report)
    assert report["stage"] == 3 and report["dp"] == 2 and report["steps"] == 2
    assert report["max_param_diff"] < TOL and report["loss_diff"] < TOL
    assert set(report["memory_per_rank"]["optimizer"]) == {"measured", "predicted"}
    assert set(report["collectives"]["all_gather_single"]) == {"count", "bytes"}


def test_run_zero_bad_input_is_one_line_before_launch():
    out = cli("run", "zero", "--stage", "2", "--dp", "3")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "parallel-lab run: batch 8 % dp 3 != 0: every rank needs an equal slice of the batch for the mean "
        "of their losses to be the batch's mean loss"]
