"""Expert and context parallelism in the planner (parallel_lab.planning): the MoE model spec, expert
memory over ep, the all-to-all term against moe.cost, the ring's K/V passing and score block against
context.cost, the plans that fit only with EP or only with CP, and bad input before any search."""

import json
from dataclasses import replace

import pytest

from parallel_lab import models
from parallel_lab.cli import main
from parallel_lab.context.cost import context_cost
from parallel_lab.hardware import Cluster
from parallel_lab.moe.cost import moe_layer_time
from parallel_lab.planning import cost, memory, memory_model, planner
from parallel_lab.planning.cost import STEP_PARTS, step_time

MOE = memory.ModelConfig("small MoE", layers=4, hidden=1024, heads=16, vocab=32000, seq=4096, experts=8, top_k=2)
# Two blocks of 64 experts and two heads: TP <= 2 and PP <= 2 cannot split its 17B expert parameters enough
WIDE = memory.ModelConfig("wide MoE", layers=2, hidden=4096, heads=2, vocab=32000, seq=1024, experts=64, top_k=2)
LONG = memory.ModelConfig("GPT-3 6.7B at 128k", 32, 4096, 32, 50257, 131072)


# ----------------------------------------------------------------------------------------------
# The model spec.


def test_moe_param_count_is_the_course_moe_gpt():
    cfg = models.GPTConfig(vocab=50, seq=16, hidden=32, heads=4, layers=2, experts=4, top_k=2)
    real = sum(p.numel() for p in models.GPT(cfg).parameters())
    assert memory_model.param_count(2, 32, 50, 16, experts=4) == real
    dense, expert = memory_model.moe_layer_params(32, 4)
    assert dense + expert == sum(p.numel() for p in models.GPT(cfg).blocks[0].parameters())
    # a token passes 2 of the 4 experts: the active count drops two experts per block
    assert memory_model.active_param_count(replace(memory.ModelConfig("m", 2, 32, 4, 50, 16), experts=4)) == \
        real - 2 * 2 * expert // 4


def test_mixtral_spec_in_the_courses_terms():
    m = memory.MOE_MODELS["Mixtral 8x7B (approx.)"]
    assert (m.layers, m.hidden, m.heads, m.experts, m.top_k, m.vocab) == (32, 4096, 32, 8, 2, 32000)
    # 4h GELU experts and full attention: 36.8B (11.0B active) against the real SwiGLU model's 46.7B
    # (12.9B active; Jiang et al. 2024): an approximation, and said so in memory.py
    assert m.params == pytest.approx(36.8e9, rel=0.005)
    assert m.active_params == pytest.approx(11.0e9, rel=0.005)
    assert memory.ModelConfig("d", 4, 64, 4).params == memory.gpt_params(4, 64)  # dense unchanged
    with pytest.raises(ValueError, match="MoE needs top_k <= experts, got top_k 3, experts 2"):
        memory.ModelConfig("bad", 2, 64, 4, experts=2, top_k=3)


# ----------------------------------------------------------------------------------------------
# Expert parallelism.


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_memory_falls_as_one_over_ep(ep):
    dense1, expert1 = memory_model.stage_param_split(MOE, 1, 1, 0, 1)
    dense, expert = memory_model.stage_param_split(MOE, 1, 1, 0, ep)
    assert dense == dense1 and expert * ep == expert1
    one = memory_model.device_memory(MOE, dp=8, ep=1)[0]
    row = memory_model.device_memory(MOE, dp=8, ep=ep)[0]
    assert one["weights"] - row["weights"] == pytest.approx(2 * expert1 * (1 - 1 / ep))
    assert one["optimizer"] - row["optimizer"] == pytest.approx(12 * expert1 * (1 - 1 / ep))
    assert row["activations"] == one["activations"]  # balanced routing: the same tokens per rank
    # ZeRO-1 shards the experts' Adam state over their expert-data-parallel group, dp / ep ranks
    z1 = memory_model.device_memory(MOE, dp=8, ep=ep, zero=1)[0]
    assert z1["optimizer"] == pytest.approx(12 * (dense / 8 + expert / (8 // ep)))


def test_the_all_to_all_term_is_moe_costs_for_the_ep_group():
    cluster = Cluster(nodes=2, gpus_per_node=4, gpu_mem_gb=80, intra_gbps=400, inter_gbps=40, latency_us=2)
    b, m = 2, 2  # batch 32 over dp 8 and 2 micro-batches
    for ep, link in ((4, cluster.intra), (8, cluster.inter)):  # 4 consecutive ranks: one node; 8: both
        parts = step_time(MOE, cluster, 32, dp=8, pp=1, tp=1, microbatches=m, ep=ep)
        per_layer = moe_layer_time(b * MOE.seq, MOE.hidden, MOE.top_k, ep, link)  # 4 all-to-alls
        assert parts["ep_comm_s"] == pytest.approx(m * MOE.layers * per_layer)
        assert parts["step_s"] == pytest.approx(sum(parts[k] for k in STEP_PARTS))
    # with TP 2 each rank dispatches its sequence-parallel half of the tokens
    tp2 = step_time(MOE, cluster, 32, dp=4, pp=1, tp=2, microbatches=1, ep=2)
    per_layer = moe_layer_time(8 * MOE.seq // 2, MOE.hidden, MOE.top_k, 2, cluster.intra)
    assert tp2["ep_comm_s"] == pytest.approx(MOE.layers * per_layer)
    assert step_time(MOE, cluster, 32, dp=8, pp=1, tp=1, microbatches=m)["ep_comm_s"] == 0  # ep 1


def test_compute_counts_the_top_k_experts_not_all():
    cluster = Cluster(nodes=1, gpus_per_node=8, gpu_mem_gb=80, tflops=100)
    parts = [step_time(MOE, cluster, 32, dp=8, pp=1, tp=1, microbatches=1, ep=ep) for ep in (1, 8)]
    active = memory_model.active_param_count(MOE)
    assert parts[0]["compute_s"] == parts[1]["compute_s"] == pytest.approx(6 * active * 32 * MOE.seq / 8 / 100e12)
    assert active < memory_model.param_count(MOE.layers, MOE.hidden, MOE.vocab, MOE.seq, MOE.experts) / 2


def test_a_moe_model_that_fits_only_with_expert_parallelism():
    cluster = Cluster(nodes=1, gpus_per_node=8, gpu_mem_gb=48)
    # ZeRO left out: sharding the experts' state over dp is the other way to make it fit
    without = planner.plan(WIDE, cluster, 16, zero=(0,), ep=(1,))
    assert without["plans"] == []
    with_ep = planner.plan(WIDE, cluster, 16, zero=(0,))
    assert with_ep["plans"] and all(p["ep"] > 1 for p in with_ep["plans"])
    best = with_ep["plans"][0]
    assert best["dp"] % best["ep"] == 0 and WIDE.experts % best["ep"] == 0
    assert best["breakdown"]["ep_comm_s"] > 0 and best["memory_gb"] <= 48
    assert any(r["reason"].startswith("dp 2 % ep 4 != 0") for r in with_ep["rejected"])
    json.dumps(with_ep)


# ----------------------------------------------------------------------------------------------
# Context parallelism.


@pytest.mark.parametrize("tp, cp", [(1, 2), (2, 4), (4, 8)])
def test_cp_score_block_is_context_costs_and_activations_scale_with_s_over_cp(tp, cp):
    model = memory.ModelConfig("m", 4, 1024, 16, 1000, 8192)
    c = context_cost("ring", batch=2, seq=8192, hidden=1024 // tp, heads=16 // tp, cp=cp,
                     link=Cluster(1, 8, 80).intra)
    assert c.score_peak_bytes == 2 * (16 // tp) * (8192 // cp) ** 2 * 2  # b · (a/tp) · (s/cp)^2, 2 bytes
    row = memory_model.device_memory(model, micro_batch=2, dp=1, tp=tp, cp=cp, sequence_parallel=True)[0]
    assert row["scores"] == c.score_peak_bytes and row["cp"] == cp
    # per layer: the sbh terms with s/cp positions and no per-layer scores (ring recomputes its blocks)
    ring = memory_model.activation_bytes_per_layer(8192, 2, 1024, 16, tp, True, "none", cp=cp)
    short = memory_model.activation_bytes_per_layer(8192 // cp, 2, 1024, 16, tp, True, "selective")
    assert ring == short
    assert memory_model.device_memory(model, micro_batch=2, tp=tp, sequence_parallel=True)[0]["scores"] == 0


def test_the_ring_term_is_context_costs_exposed_time_for_the_cp_group():
    model = memory.ModelConfig("m", 4, 1024, 16, 1000, 32768)
    cluster = Cluster(nodes=2, gpus_per_node=4, gpu_mem_gb=80, intra_gbps=400, inter_gbps=5, latency_us=2)
    exposed = []
    for tp, cp, link in ((1, 4, cluster.intra), (2, 4, cluster.inter)):  # cp x tp = 4: one node; 8: both
        parts = step_time(model, cluster, 8, dp=8 // (tp * cp), pp=1, tp=tp, microbatches=1, cp=cp)
        b = 8 // (8 // (tp * cp))
        c = context_cost("ring", batch=b, seq=32768, hidden=1024 // tp, heads=16 // tp, cp=cp, link=link,
                         flops=cluster.tflops * 1e12)
        assert parts["cp_comm_s"] == pytest.approx(model.layers * c.exposed_comm_s)
        assert parts["cp_comm_s"] < model.layers * c.comm_s  # the hops overlap the blocks' compute
        exposed.append(parts["cp_comm_s"] / (model.layers * c.comm_s))
    # inside the node little more than the last gradient hop shows; over the slow network the hops
    # outlast the blocks and more of the ring is exposed
    assert 0 < exposed[0] < exposed[1]
    # compute is shared by all dp·pp·tp·cp devices
    assert parts["compute_s"] == pytest.approx(6 * memory_model.param_count(4, 1024, 1000, 32768) * 8 * 32768
                                               / 8 / (cluster.tflops * 1e12))


def test_a_long_sequence_fits_only_with_context_parallelism():
    cluster = Cluster(nodes=2, gpus_per_node=8, gpu_mem_gb=80)
    # selective recomputation (attention kept fused); full recomputation is left out: it recomputes a
    # layer's s x s scores in the backward, a transient the memory model does not count
    without = planner.plan(LONG, cluster, 8, cp=(1,), recompute=("selective",))
    assert without["plans"] == []
    searched = planner.plan(LONG, cluster, 8, recompute=("selective",))  # seq > LONG_SEQ: cp searched
    assert searched["plans"] and all(p["cp"] > 1 for p in searched["plans"])
    best = searched["plans"][0]
    assert best["dp"] * best["pp"] * best["tp"] * best["cp"] == 16 == best["world_size"]
    assert best["memory"]["scores"] > 0 and best["memory_gb"] <= 80


def test_dense_defaults_carry_ep_and_cp_of_one():
    result = planner.plan(memory.MODELS["GPT-3 1.3B"], Cluster(1, 8, 80), 16, top=3)
    for p in result["plans"]:
        assert (p["ep"], p["cp"]) == (1, 1)
        assert p["breakdown"]["ep_comm_s"] == p["breakdown"]["cp_comm_s"] == 0
    assert all(set(r["plan"]) <= {"dp", "pp", "tp", "schedule", "virtual", "recompute", "zero", "microbatches",
                                  "micro_batch"} for r in result["rejected"])


@pytest.mark.parametrize("dp, pp, tp, cp, ep", [(8, 4, 2, 1, 1), (4, 2, 8, 1, 1), (2, 8, 4, 1, 1),
                                                (64, 1, 8, 1, 1), (1, 64, 8, 1, 1)])
def test_the_ep_cp_grid_crosses_nodes_as_the_3d_mesh_without_them(dp, pp, tp, cp, ep):
    nodes = dp * pp * tp * cp // 8
    plain = cost._crossings(dp, pp, tp, nodes, 8)
    grid = cost._crossings_ep_cp(dp, pp, cp, tp, ep, nodes, 8)
    assert {k: grid[k] for k in plain} == plain


# ----------------------------------------------------------------------------------------------
# Bad input, before any search.


@pytest.mark.parametrize("model, kwargs, message", [
    (MOE, dict(ep=(3,)), "experts 8 % ep 3 != 0: expert parallel ranks would hold unequal numbers of experts"),
    (MOE, dict(ep=(16,)), "experts 8 % ep 16 != 0"),
    (replace(MOE, experts=16), dict(ep=(16,)), "world_size 8 % ep 16 != 0"),
    (memory.MODELS["GPT-3 1.3B"], dict(ep=(2,)), "ep 2 needs a model with experts, got experts 0"),
    (memory.MODELS["GPT-3 1.3B"], dict(cp=(3,)), "seq 2048 % cp 3 != 0: context parallel ranks"),
    (memory.MODELS["GPT-3 1.3B"], dict(cp=(16,)), "world_size 8 % cp 16 != 0"),
])
def test_plan_rejects_bad_degrees(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        planner.plan(model, Cluster(1, 8, 80), 16, **kwargs)


def test_bad_degrees_in_the_cost_and_memory_models():
    cluster = Cluster(1, 8, 80)
    with pytest.raises(ValueError, match="dp 2 % ep 4 != 0: expert parallel groups are carved out of the "
                                         "data-parallel group"):
        step_time(MOE, cluster, 16, dp=2, pp=1, tp=4, microbatches=1, ep=4)
    with pytest.raises(ValueError, match="dp 2 % ep 4 != 0"):
        memory_model.device_memory(MOE, dp=2, ep=4)
    with pytest.raises(ValueError, match="seq 4096 % cp 3 != 0"):
        memory_model.device_memory(MOE, cp=3)


def test_cli_plans_a_moe_model(capsys):
    args = ["plan", "--layers", "2", "--hidden", "4096", "--heads", "2", "--vocab", "32000", "--seq", "1024",
            "--batch", "16", "--nodes", "1", "--gpus-per-node", "8", "--gpu-mem-gb", "48", "--zero", "0",
            "--experts", "64", "--top-k", "2", "--ep", "1", "4", "8", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plans"] and {p["ep"] for p in report["plans"]} <= {4, 8}
    assert report["model"]["experts"] == 64 and report["model"]["active_params"] < report["model"]["params"]
    assert main(args[:-1] + ["--ep", "3"]) == 2
    assert "experts 64 % ep 3 != 0" in capsys.readouterr().err
