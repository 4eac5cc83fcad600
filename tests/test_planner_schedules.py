"""The planner searches ZB-V and DualPipeV, and its cost model learns uneven end ranks (the embedding
and the LM head): closed forms against the simulator, the memory of the V placement, GPT-3 175B."""

import json

import pytest

from parallel_lab import cli
from parallel_lab.hardware import Cluster
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.planning import cost, memory, memory_model, planner
from parallel_lab.planning.cost import pipeline_makespan, uneven_makespan

GPT3 = memory.ModelConfig("GPT-3 175B", 96, 12288, 96, 50257, 2048)


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("fwd, bwd", [(1.0, 2.0), (1.0, 3.0), (2.0, 2.0), (1.5, 2.0), (1.0, 1.5), (1.0, 4.0)])
def test_v_closed_forms_equal_the_simulator(name, fwd, bwd):
    for pp in (2, 3, 4, 8):
        for m in (2 * pp, 3 * pp, 5 * pp):
            # a rank's forward fwd and backward bwd, split over its two stages, I = W = B/2
            timeline = simulate(build(name, pp, m, 2), Costs(F=fwd / 2, B=bwd / 2))
            assert pipeline_makespan(name, pp, m, 2, fwd, bwd) == pytest.approx(timeline.makespan)


def _uneven(name, v, p, m, e0, e1, r):
    """Per-stage costs with the first stage e0 and the last e1 of a rank's forward heavier; the
    simulator's makespan and the per-rank loads the cost model takes."""
    n = p * v
    f, b = [1.0 / v] * n, [r / v] * n
    f[0] += e0
    b[0] += e0 * r
    f[-1] += e1
    b[-1] += e1 * r
    owner = [s if s < p else 2 * p - 1 - s for s in range(n)] if name in cost.V_SCHEDULES else [s % p for s in range(n)]
    fr, br = [0.0] * p, [0.0] * p
    for s in range(n):
        fr[owner[s]] += f[s]
        br[owner[s]] += b[s]
    return simulate(build(name, p, m, v), Costs(F=f, B=b)).makespan, fr, br


@pytest.mark.parametrize("name, v, exact", [("gpipe", 1, True), ("1f1b", 1, True), ("zb-h1", 1, False),
                                            ("interleaved-1f1b", 2, False), ("zb-v", 2, False),
                                            ("dualpipe-v", 2, False)])
def test_uneven_ranks_makespan_against_the_simulator(name, v, exact):
    for p in (4, 8):
        for m in (2 * p, 8 * p):
            for e0, e1 in ((0.03, 0.03), (0.12, 0.12), (0.3, 0.3), (0.0, 0.5)):
                for r in (2.0, 3.0):
                    simulated, fr, br = _uneven(name, v, p, m, e0, e1, r)
                    estimate = uneven_makespan(name, p, m, v, fr, br)
                    if exact:
                        assert estimate == pytest.approx(simulated)
                    else:  # the stated bound (cost.uneven_makespan's docstring)
                        assert abs(estimate / simulated - 1) <= 0.10, (p, m, e0, e1, r, estimate, simulated)


def test_rank_loads_put_the_embedding_first_and_the_head_last_or_on_rank_0_in_the_v():
    loads = cost.rank_loads(GPT3, 8, "1f1b")
    assert sum(loads) == pytest.approx(8)
    assert loads[0] > loads[3] and loads[7] > loads[3] and loads[1:7] == [loads[3]] * 6
    v = cost.rank_loads(GPT3, 8, "zb-v")
    assert v[0] == pytest.approx(loads[0] + loads[7] - loads[3]) and v[7] == pytest.approx(loads[3])
    # the head is a third of a block of GPT-3 (V / 12h): PP 32's last rank is about 11 % heavier
    deep = cost.rank_loads(GPT3, 32, "1f1b")
    assert deep[-1] / deep[1] == pytest.approx(1 + 50257 / (12 * 12288) / 3, rel=0.01)


def test_without_ends_the_step_is_what_it_was_and_with_them_longer_for_a_deep_pipeline():
    cluster = Cluster(64, 8, 80)
    even = cost.step_time(GPT3, cluster, 1536, 8, 32, 2, 192, "zb-h1", recompute="selective", zero=1)
    same = cost.step_time(GPT3, cluster, 1536, 8, 32, 2, 192, "zb-h1", recompute="selective", zero=1,
                          split=(3,) * 32)
    ends = cost.step_time(GPT3, cluster, 1536, 8, 32, 2, 192, "zb-h1", recompute="selective", zero=1, ends=True)
    assert same["step_s"] == pytest.approx(even["step_s"], rel=1e-9)
    assert ends["step_s"] > 1.05 * even["step_s"]  # the last rank paces the steady state
    assert ends["compute_s"] == pytest.approx(even["compute_s"])  # the same work, placed differently


def test_light_ends_split_and_the_v_keeps_the_head_on_rank_0():
    split = memory_model.light_ends_split(96, 64)
    assert sum(split) == 96 and split[0] == split[-1] == 1 and max(split) == 2
    assert memory_model.light_ends_split(96, 32) is None  # even already
    rows = memory_model.device_memory(GPT3, pp=8, tp=8, schedule="zb-v", microbatches=16, virtual=2)
    assert rows[0]["params"] > rows[7]["params"] == rows[3]["params"]  # embedding and head both on rank 0
    rows = memory_model.device_memory(GPT3, pp=64, tp=8, schedule="1f1b", microbatches=128, split=split)
    assert rows[0]["layers_per_chunk"] == 1 and rows[1]["layers_per_chunk"] == 2


@pytest.fixture(scope="module")
def gpt3_1024():
    """GPT-3 175B on 1024 GPUs (128 DGX H100 nodes), GPT-3's batch, every schedule, ends modelled."""
    return planner.plan(GPT3, Cluster(128, 8, 80), 1536, schedules=planner.ALL_SCHEDULES, ends=True)


def test_gpt3_on_1024_gpus_considers_zb_v_and_dualpipe_v_and_uneven_end_ranks(gpt3_1024):
    plans = gpt3_1024["plans"]
    assert {"zb-v", "dualpipe-v"} <= {p["schedule"] for p in plans}
    uneven = [p for p in plans if p.get("split")]
    assert uneven and all(p["pp"] == 64 and p["split"][0] < max(p["split"]) for p in uneven)
    assert all(p["memory_gb"] <= 80 for p in plans)
    assert all(p["microbatches"] >= 2 * p["pp"] for p in plans if p["schedule"] in ("zb-v", "dualpipe-v"))
    json.dumps(gpt3_1024)


def test_plan_command_line_takes_schedules_and_ends(capsys):
    args = ["plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "50257", "--seq", "2048",
            "--batch", "1536", "--nodes", "16", "--gpus-per-node", "8", "--gpu-mem-gb", "80", "--json",
            "--schedules", "zb-v", "dualpipe-v", "zb-h1", "--ends", "--top", "50"]
    assert cli.main(args) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert {p["schedule"] for p in plans} <= {"zb-v", "dualpipe-v", "zb-h1"} and plans
    assert cli.main(args[:-7] + ["--schedules", "ring"]) == 2
    assert "unknown schedule 'ring'" in capsys.readouterr().err
