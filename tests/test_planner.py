"""The planner (parallel_lab.planning.planner): closed forms against the simulator, the time model's parts,
what it picks for GPT-3 175B and why it rejects the rest; calibration on real ranks."""

import doctest
import json

import pytest

from parallel_lab.hardware import SYSTEMS, Cluster, ring_all_reduce_time
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.planning import calibration, memory, memory_model, planner
from parallel_lab.planning.cost import pipeline_makespan, step_time

GPT3 = memory.ModelConfig("GPT-3 175B", 96, 12288, 96, 50257, 2048)
CLUSTER = Cluster(nodes=64, gpus_per_node=8, gpu_mem_gb=80)  # the defaults: 64 DGX H100


@pytest.fixture(scope="module")
def gpt3():
    return planner.plan(GPT3, CLUSTER, 1536)


# ----------------------------------------------------------------------------------------------
# The pieces.


@pytest.mark.parametrize("name, virtual", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1),
                                           ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)])
@pytest.mark.parametrize("fwd, bwd", [(1.0, 2.0), (1.0, 3.0), (1.0, 2.05), (1.5, 2.0)])
def test_closed_forms_equal_the_simulator(name, virtual, fwd, bwd):
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 5 * pp):
            # the simulator takes per-chunk costs: a rank's work split over its v chunks
            timeline = simulate(build(name, pp, m, virtual), Costs(F=fwd / virtual, B=bwd / virtual))
            assert pipeline_makespan(name, pp, m, virtual, fwd, bwd) == pytest.approx(timeline.makespan)


def test_pure_data_parallel_step_is_compute_plus_gradient_all_reduce():
    model = memory.ModelConfig("small", layers=4, hidden=256, heads=4, vocab=1000, seq=128)
    cluster = Cluster(nodes=1, gpus_per_node=4, gpu_mem_gb=16, tflops=10)
    parts = step_time(model, cluster, batch=8, dp=4, pp=1, tp=1, microbatches=2)
    params = memory_model.param_count(4, 256, 1000, 128)
    assert parts["compute_s"] == pytest.approx(6 * params * 8 * 128 / 4 / 10e12)
    assert parts["bubble_s"] == pytest.approx(0) and parts["tp_comm_s"] == parts["pp_comm_s"] == 0
    assert parts["dp_comm_s"] == pytest.approx(ring_all_reduce_time(2 * params, 4, 5e-6, 450e9))  # intra-node
    assert parts["step_s"] == pytest.approx(sum(v for k, v in parts.items() if k != "step_s"))
    full = step_time(model, cluster, batch=8, dp=4, pp=1, tp=1, microbatches=2, recompute="full")
    assert full["compute_s"] == pytest.approx(parts["compute_s"] * 4 / 3)  # one more forward


def test_tp_all_reduces_per_layer_and_links():
    model = memory.ModelConfig("small", layers=4, hidden=256, heads=4, vocab=1000, seq=128)
    cluster = Cluster(nodes=2, gpus_per_node=4, gpu_mem_gb=16, intra_gbps=100, inter_gbps=10, latency_us=0)
    parts = step_time(model, cluster, batch=4, dp=2, pp=1, tp=4, microbatches=2)
    one = ring_all_reduce_time(2 * 1 * 128 * 256, 4, 0.0, 100e9)  # b=1: one (s, b, h) bf16 tensor, NVLink
    per_token = ring_all_reduce_time(4 * 1 * 128, 4, 0.0, 100e9)  # one fp32 value per token
    ends = 2 * one + 3 * per_token  # embedding (fwd), LM head (bwd), the vocab-parallel loss (3 fwd)
    assert parts["tp_comm_s"] == pytest.approx(2 * (4 * 4 * one + ends))  # 2 micro-batches x 4 layers x (2 fwd + 2 bwd)
    full = step_time(model, cluster, batch=4, dp=2, pp=1, tp=4, microbatches=2, recompute="full")
    assert full["tp_comm_s"] == pytest.approx(2 * (4 * 6 * one + ends))  # the recomputed forward all-reduces again
    staged = step_time(model, cluster, batch=4, dp=1, pp=2, tp=4, microbatches=2)  # b=2, 2 layers a stage
    one, per_token = (ring_all_reduce_time(n, 4, 0.0, 100e9) for n in (2 * 2 * 128 * 256, 4 * 2 * 128))
    assert staged["tp_comm_s"] == pytest.approx(2 * (2 * 4 * one + one + 3 * per_token))  # the last stage's ends
    # the dp group {0, 4}, {1, 5}, ... spans the two nodes: network bandwidth
    grads = 2 * memory_model.stage_params(model, 1, 4, 0)
    assert parts["dp_comm_s"] == pytest.approx(ring_all_reduce_time(grads, 2, 0.0, 10e9))


# ----------------------------------------------------------------------------------------------
# GPT-3 175B on 64 nodes x 8 GPUs x 80 GB.


def test_gpt3_keeps_tensor_parallelism_inside_a_node(gpt3):
    plans = gpt3["plans"]
    assert plans and all(p["tp"] <= 8 for p in plans)
    assert plans[0]["tp"] == 4 and plans[0]["pp"] == 16 and plans[0]["schedule"] == "zb-h1"
    best_tp8 = min(p["step_s"] for p in plans if p["tp"] == 8)
    assert best_tp8 <= 1.08 * plans[0]["step_s"]  # a whole node of TP is within 8% of the best
    assert all(p["tp"] >= 4 for p in plans[:10])


def test_the_defaults_are_a_dgx_h100_cluster():
    assert CLUSTER == SYSTEMS["DGX H100"].cluster(64)
    assert (CLUSTER.intra_gbps, CLUSTER.inter_gbps) == (450, 50)  # NVLink 4, InfiniBand NDR per GPU
    assert CLUSTER.tflops == pytest.approx(0.40 * 989, abs=0.05)


def test_gpt3_with_1f1b_puts_tp8_first_on_a100s_and_tp4_on_h100s():
    """Megatron-LM's 2021 setting (DGX A100, 1F1B): TP 8, as in the paper. On H100s the GPU got
    3.2x faster and NVLink 1.5x: the all-reduces weigh more, and TP 4 comes first."""
    a100 = planner.plan(GPT3, SYSTEMS["DGX A100"].cluster(64), 1536, schedules=("1f1b",))
    assert a100["plans"][0]["tp"] == 8
    h100 = planner.plan(GPT3, CLUSTER, 1536, schedules=("1f1b",))
    assert h100["plans"][0]["tp"] == 4


def test_gpt3_plans_fit_and_are_ranked(gpt3):
    plans = gpt3["plans"]
    assert all(p["memory_gb"] <= 80 for p in plans)
    assert [p["step_s"] for p in plans] == sorted(p["step_s"] for p in plans)
    for p in plans:
        assert p["dp"] * p["pp"] * p["tp"] == 512
        assert p["dp"] * p["microbatches"] * p["micro_batch"] == 1536
        assert GPT3.layers % (p["pp"] * p["virtual"]) == 0
    json.dumps(gpt3)  # the CLI prints it


def test_gpt3_rejections_say_why(gpt3):
    reasons = {json.dumps(r["plan"], sort_keys=True): r["reason"] for r in gpt3["rejected"]}
    tp16 = reasons['{"dp": 32, "pp": 1, "tp": 16}']
    assert tp16 == "tp 16 > devices_per_node 8: tensor parallel groups would cross nodes"
    assert reasons['{"dp": 1, "pp": 64, "tp": 8}'] == "layers 96 % pp 64 != 0"
    pure_dp = [r for r in gpt3["rejected"] if r["plan"]["tp"] == 1 and r["plan"]["pp"] == 1]
    assert pure_dp and all("GB > 80 GB" in r["reason"] for r in pure_dp)
    # more than 2.8 TB: the model state alone is 16 bytes x 175B
    assert all(float(r["reason"].split()[1]) > 2800 for r in pure_dp)
    tp8pp1 = [r for r in gpt3["rejected"] if r["plan"]["tp"] == 8 and r["plan"]["pp"] == 1]
    assert tp8pp1 and all("GB > 80 GB" in r["reason"] for r in tp8pp1)


def test_docstring_example():
    failures, _ = doctest.testmod(planner, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert failures == 0


# ----------------------------------------------------------------------------------------------
# Small cases, costs, the CLI entry point.


def test_a_model_that_fits_one_device_is_pure_data_parallel():
    # GPT-3 1.3B: 16 bytes x 1.3B = 21 GB of state fits an 80 GB device; splitting it only adds work
    result = planner.plan_from_args(layers=24, hidden=2048, heads=16, vocab=50257, seq=2048, batch=64,
                                    nodes=1, gpus_per_node=8, gpu_mem_gb=80)
    top = result["plans"][0]
    assert (top["dp"], top["pp"], top["tp"], top["recompute"]) == (8, 1, 1, "none")
    assert top["breakdown"]["bubble_s"] == top["breakdown"]["tp_comm_s"] == 0
    assert result["model"]["params"] == memory_model.param_count(24, 2048, 50257, 2048)


def test_memory_rejection_quotes_the_numbers():
    result = planner.plan_from_args(layers=4, hidden=4096, heads=32, vocab=50257, seq=2048, batch=8,
                                    nodes=1, gpus_per_node=4, gpu_mem_gb=1)
    assert result["plans"] == []
    assert all(r["reason"].startswith("needs ") and "GB > 1 GB" in r["reason"] for r in result["rejected"]
               if "GB" in r["reason"])


def test_training_cost():
    row = {"global_batch": 1536, "seq": 2048, "step_s": 40.0, "world_size": 512}
    cost = planner.training_cost(row, tokens=1536 * 2048 * 900, price_per_gpu_hour=2.0)
    assert cost["steps"] == 900 and cost["gpu_hours"] == pytest.approx(900 * 40 * 512 / 3600)
    assert cost["cost"] == pytest.approx(2 * cost["gpu_hours"]) and cost["days"] == pytest.approx(900 * 40 / 86400)
    with pytest.raises(ValueError, match="need tokens > 0"):
        planner.training_cost(row, 0, 1.0)


def test_plan_from_args_adds_costs_and_formats():
    result = planner.plan_from_args(layers=4, hidden=256, heads=4, vocab=1000, seq=128, batch=16, nodes=1,
                                    gpus_per_node=4, gpu_mem_gb=16, price=2.5, tokens=1e9, top=3)
    assert len(result["plans"]) == 3 and all(p["cost"]["cost"] > 0 for p in result["plans"])
    assert result["cluster"]["gpus_per_node"] == 4 and result["batch"] == 16
    text = planner.format_plans(result)
    assert text.splitlines()[0].split()[:3] == ["dp", "pp", "tp"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0), "batch must be a positive integer"),
    (dict(schedules=("dualpipe",)), "unknown schedule 'dualpipe'"),
    (dict(recompute=("some",)), "unknown recompute 'some'"),
])
def test_plan_errors(kwargs, message):
    args = dict(batch=8) | kwargs
    batch = args.pop("batch")
    with pytest.raises(ValueError, match=message):
        planner.plan(GPT3, CLUSTER, batch, **args)


def test_cluster_errors():
    with pytest.raises(ValueError, match="gpu_mem_gb must be a positive number, got gpu_mem_gb 0"):
        Cluster(1, 8, 0)
    with pytest.raises(ValueError, match="nodes must be a positive integer"):
        Cluster(0, 8, 80)


# ----------------------------------------------------------------------------------------------
# Calibration on this machine's ranks.


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_calibrate_on_two_ranks():
    fit = calibration.calibrate(world_size=2, sizes_bytes=(2**10, 2**14, 2**17), matmul=96, repeats=3)
    assert fit["tflops"] > 0 and fit["latency_us"] >= 0 and fit["intra_gbps"] > 0
    assert len(fit["all_reduce_s"]) == 3 and all(t > 0 for t in fit["all_reduce_s"])
    Cluster(nodes=1, gpus_per_node=2, gpu_mem_gb=1, intra_gbps=min(fit["intra_gbps"], 1e6),
            tflops=fit["tflops"], latency_us=fit["latency_us"])  # usable as the planner's constants
