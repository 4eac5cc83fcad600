"""Mixture of experts (models.MoE) and expert parallelism (parallel_lab.moe) against one process, in fp64.

The pure tests pin the dense layer's routing, capacity and drops, the load-balancing loss, the MoE
GPT and the all-to-all cost; no process. Then every case runs on ep = 2 and 4 ranks in one launch
per ep, and the tests read those results: outputs, the loss and every gradient equal the dense
layer's to 1e-10, the same assignments are dropped, and the all-to-all bytes commlog measured are
the token vectors routed. The CLI tests check the JSON contract and that bad sizes fail before any
process starts.
"""

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parallel_lab import models
from parallel_lab.hardware import Link
from parallel_lab.moe import cost
from parallel_lab.moe import run as moe_run
from parallel_lab.runtime import commlog, launcher

TOL = 1e-10
EPS = (2, 4)
CASES = {
    "default": moe_run.Case(),  # top-2, capacity factor 1.25: a few drops
    "drops": moe_run.Case(capacity_factor=0.5),  # half the demand: many drops, whole tokens too
    "top1": moe_run.Case(top_k=1, capacity_factor=1.0),  # Switch
    "dropless": moe_run.Case(capacity_factor=None),  # DeepSeek-V3: no capacity
}
EXE = str(Path(sys.executable).with_name("parallel-lab"))


# ----------------------------------------------------------------------------------------------
# The dense layer (no processes).


def test_capacity_is_the_ceiling_of_factor_tokens_k_over_experts():
    assert models.expert_capacity(64, 8, 2, 1.25) == 20
    assert models.expert_capacity(64, 8, 2, 0.5) == 8
    assert models.expert_capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    assert models.expert_capacity(40, 4, 2, 1.1) == 22  # not 23: 1.1 * 40 * 2 / 4 = 22.000000000000004
    assert models.expert_capacity(64, 8, 2, None) == 64  # no capacity: an expert can get every token


def test_top_k_gates_renormalise_for_k_above_one_only():
    logits = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    probs, gate, expert = models.top_k_routing(logits, 2)
    assert torch.allclose(gate.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(expert, probs.topk(2, -1).indices) and (expert[:, 0] != expert[:, 1]).all()
    probs, gate, expert = models.top_k_routing(logits, 1)
    assert torch.equal(gate, probs.gather(1, expert))  # Switch: the probability itself


def test_queues_fill_first_choices_before_second_then_in_token_order():
    expert = torch.tensor([[0, 1], [0, 2], [1, 0]])  # (n=3, k=2)
    counts = models.assignment_counts(expert, 3)
    assert counts.tolist() == [[2, 1, 0], [1, 1, 1]]
    position = models.queue_positions(expert, 3, counts.cumsum(0) - counts)
    # first choices: tokens 0, 1 at expert 0 (0, 1), token 2 at expert 1 (0); then the second
    # choices behind them: token 0 at expert 1 (1), token 1 at expert 2 (0), token 2 at expert 0 (2)
    assert position.tolist() == [[0, 1], [1, 0], [0, 2]]


def _naive(moe, x):
    """The layer's definition, token by token: the gate-weighted sum of the kept choices' outputs."""
    r = moe.routing
    flat = x.reshape(-1, x.shape[-1])
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for s in range(moe.top_k):
            if r.kept[t, s]:
                out[t] += r.gate[t, s] * moe.experts[int(r.expert[t, s])](flat[t])
    return out.view(x.shape)


@pytest.mark.parametrize("top_k, factor", [(2, 0.5), (1, 0.75), (2, 1.25), (3, None)])
def test_dense_moe_drops_beyond_capacity_and_dropped_tokens_come_out_zero(top_k, factor):
    moe = models.MoE(16, 8, top_k, factor, ffn=32, seed=0).double()
    x = torch.randn(4, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = moe(x)
        assert torch.allclose(out, _naive(moe, x), atol=1e-12, rtol=0)
    r = moe.routing
    n = 32
    assert r.capacity == models.expert_capacity(n, 8, top_k, factor)
    assert torch.equal(r.kept, r.position < r.capacity)
    assert r.routed_per_expert.sum() == n * top_k
    assert torch.equal(r.tokens_per_expert, r.routed_per_expert.clamp(max=r.capacity))
    assert r.dropped == n * top_k - int(r.tokens_per_expert.sum())
    if factor is None or factor < 1:  # no capacity never drops; less than the mean demand always does
        assert (r.dropped > 0) == (factor is not None)
    flat = out.reshape(n, 16)
    assert (flat[r.dropped_tokens] == 0).all() and (flat[~r.dropped_tokens] != 0).all()
    if factor == 0.5:
        assert r.dropped_tokens.any()  # some tokens lost every choice


def test_a_dropped_token_passes_the_block_unchanged():
    cfg = models.GPTConfig(vocab=16, seq=8, hidden=16, heads=2, layers=1, experts=4, top_k=1, capacity_factor=0.25)
    block = models.Block(cfg, seed=0).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y = block(x)
        after_attn = x + block.attn(block.ln1(x))
    dropped = block.mlp.routing.dropped_tokens.view(2, 8)
    assert dropped.any()
    assert torch.equal(y[dropped], after_attn[dropped]) and not torch.equal(y[~dropped], after_attn[~dropped])


def test_load_balancing_loss_is_one_when_uniform_and_grows_with_imbalance():
    moe = models.MoE(16, 4, 2, None, ffn=8, seed=0).double()
    x = torch.randn(64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        moe.router.weight.zero_()  # every probability 1/E
    moe(x)
    assert moe.routing.aux_loss.item() == pytest.approx(1.0, abs=1e-12)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 10 * x.mean(0)  # expert 0 favoured
    moe(x)
    assert moe.routing.aux_loss.item() > 1.2 and moe.routing.aux_loss.requires_grad


def test_gpt_with_experts_in_place_of_the_mlp():
    cfg = models.GPTConfig(vocab=32, seq=8, hidden=24, heads=4, layers=2, experts=4, top_k=2)
    model = models.GPT(cfg, seed=0)
    assert all(isinstance(b.mlp, models.MoE) for b in model.blocks)
    assert all(isinstance(b.mlp, models.MLP) for b in models.GPT(models.GPTConfig(vocab=32, seq=8, hidden=24,
                                                                                  heads=4, layers=2)).blocks)
    idx, targets = models.random_tokens(cfg, batch=2, seed=0)
    loss = models.cross_entropy(model(idx), targets) + 0.01 * models.moe_aux_loss(model)
    loss.backward()
    assert all(b.mlp.router.weight.grad.abs().sum() > 0 for b in model.blocks)
    assert torch.equal(models.GPT(cfg, seed=0).blocks[1].mlp.router.weight, model.blocks[1].mlp.router.weight)
    with pytest.raises(ValueError, match="MoE needs top_k <= experts, got top_k 5, experts 4"):
        models.GPTConfig(experts=4, top_k=5)


# ----------------------------------------------------------------------------------------------
# Bad input and the all-to-all cost (no processes).


@pytest.mark.parametrize("case, ep, message", [
    (moe_run.Case(), 3,
     "expert parallelism needs experts % ep == 0 (each rank holds experts / ep), got experts 8, ep 3"),
    (moe_run.Case(), 16,
     f"expert parallelism needs ep <= {launcher.MAX_WORLD_SIZE} (the launcher's cap on ranks), got ep 16"),
    (moe_run.Case(experts=4, batch=6), 4, "expert parallelism needs batch % ep == 0 (each rank its own sequences), "
                                          "got batch 6, ep 4"),
    (moe_run.Case(), 0, "ep must be a positive integer, got ep 0"),
])
def test_bad_sizes_fail_before_any_process_starts(monkeypatch, case, ep, message):
    monkeypatch.setattr(launcher, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError) as info:
        moe_run.run_moe(ep, case=case)
    assert str(info.value) == message
    with pytest.raises(ValueError, match=r"MoE needs top_k <= experts, got top_k 9, experts 8"):
        moe_run.run_moe(2, top_k=9)


def test_commlog_counts_what_a_rank_hands_all_to_all_single():
    out, inp = torch.empty(3, 4, dtype=torch.float64), torch.empty(5, 4, dtype=torch.float64)
    assert commlog._nbytes("all_to_all_single", {"output": out, "input": inp}) == 5 * 4 * 8


def test_all_to_all_cost_sends_n_minus_one_over_n():
    assert cost.all_to_all_sent_bytes(1000, 4) == 750
    assert cost.all_to_all_time(1000, 1, 1e-5, 1e9) == 0.0
    assert cost.all_to_all_time(1000, 4, 1e-5, 1e9) == pytest.approx(3e-5 + 750 / 1e9)
    link = Link("test", 1e9, 1e-5)
    n = cost.dispatch_bytes(tokens=64, hidden=16, top_k=2, bytes_per_element=8)
    assert n == 64 * 2 * 16 * 8
    assert cost.moe_layer_time(64, 16, 2, 4, link, 8) == pytest.approx(4 * cost.all_to_all_time(n, 4, 1e-5, 1e9))
    with pytest.raises(ValueError, match="world_size must be a positive integer, got world_size 0"):
        cost.all_to_all_time(1000, 0, 1e-5, 1e9)


# ----------------------------------------------------------------------------------------------
# Expert parallelism on real ranks.


@functools.lru_cache(maxsize=None)
def results(ep):
    """Every case on ``ep`` ranks, in one launch: ``{case: (summary, per-rank results)}``."""
    refs = {name: moe_run.reference(case) for name, case in CASES.items()}
    jobs = [dict(case=case, ref=refs[name]) for name, case in CASES.items()]
    per_rank = launcher.run(moe_run.check_cases, ep, args=(jobs,), timeout=240)
    out = {}
    for i, (name, case) in enumerate(CASES.items()):
        ranks = [r[i] for r in per_rank]
        out[name] = (moe_run.summarize(case, ep, refs[name], ranks), ranks)
    return out


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ep", EPS)
def test_expert_parallel_equals_the_dense_layer_drops_included(ep):
    for name, (report, ranks) in results(ep).items():
        assert report["max_output_diff"] < TOL, (name, report)
        assert report["max_grad_diff"] < TOL, (name, [r["grad_diffs"] for r in ranks])
        assert report["loss_diff"] < TOL, name
        assert report["routing_equal"], name  # every rank kept and dropped what the dense layer did
        assert report["dropped"] == report["reference_dropped"], name
        assert report["tokens_per_expert"] == report["reference_tokens_per_expert"], name
        assert all(r["batch_capacity"] == report["capacity"] for r in ranks), name
        # each rank's router, expert and input gradients were all compared
        assert all(len(r["grad_diffs"]) == 2 + 4 * (8 // ep) for r in ranks), name
    drops, dropless = results(ep)["drops"][0], results(ep)["dropless"][0]
    assert drops["dropped"] > 0 and drops["dropped_tokens"] > 0
    assert dropless["dropped"] == 0 and dropless["tokens_per_expert"] == dropless["routed_per_expert"]
    assert results(ep)["default"][0]["dropped"] > 0  # capacity 1.25 still drops here


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ep", EPS)
def test_all_to_all_bytes_are_the_token_vectors_routed(ep):
    for name, (report, ranks) in results(ep).items():
        case = CASES[name]
        row = case.hidden * 8  # one fp64 token vector
        for r in ranks:
            # forward: dispatch hands over the rank's kept assignments, combine what its experts computed;
            # backward: the same two, reversed
            sent, received = r["sent"], sum(r["received_per_expert"])
            for log in (r["forward"], r["backward"]):
                assert log["all_to_all_single"] == {"count": 2, "bytes": (sent + received) * row}, name
            assert r["forward"]["all_gather_single"] == {"count": 1, "bytes": case.top_k * case.experts * 8}
            assert r["grad_sync"] == {"all_reduce": {"count": 1, "bytes": case.experts * case.hidden * 8}}
        kept = sum(report["tokens_per_expert"])
        assert sum(r["sent"] for r in ranks) == kept == case.batch * case.seq * case.top_k - report["dropped"]
        assert sum(report["all_to_all_bytes"]) == 4 * kept * row


# ----------------------------------------------------------------------------------------------
# The command line.


def cli(*args, timeout=300):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_run_moe_json_contract():
    out = cli("run", "moe", "--ep", "2", "--experts", "4", "--top-k", "1", "--capacity-factor", "0.75", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"max_output_diff", "max_grad_diff", "tokens_per_expert", "dropped", "collectives"} <= set(report)
    assert report["ep"] == 2 and report["experts"] == 4 and report["top_k"] == 1
    assert report["max_output_diff"] < TOL and report["max_grad_diff"] < TOL and report["routing_equal"]
    assert report["capacity"] == math.ceil(0.75 * 64 / 4) and max(report["tokens_per_expert"]) <= 12
    assert report["dropped"] == 64 - sum(report["tokens_per_expert"]) > 0
    assert report["collectives"]["all_to_all_single"]["count"] == 4  # 2 forward, 2 backward


@pytest.mark.parametrize("args, message", [
    (("--ep", "3"), "expert parallelism needs experts % ep == 0 (each rank holds experts / ep), got experts 8, ep 3"),
    (("--ep", "2", "--experts", "4", "--top-k", "5"), "MoE needs top_k <= experts, got top_k 5, experts 4"),
    (("--ep", "9"), "expert parallelism needs ep <= 8 (the launcher's cap on ranks), got ep 9"),
])
def test_run_moe_bad_input_exits_2_with_one_line_before_launch(args, message):
    out = cli("run", "moe", *args, "--json", timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"parallel-lab run: {message}"]
