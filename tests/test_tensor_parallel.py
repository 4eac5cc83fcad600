"""Tensor parallelism (parallel_lab.tensor) against the dense model on one process, in fp64.

Every rank of tp = 1, 2, 3, 4 runs every layer (with and without sequence parallelism) in one
launch per tp (the pool is reused), and the tests read those results: outputs, the loss and every
gradient must equal the matching shard of the dense reference to 1e-10. Collective counts come
from commlog on the ranks. The bad-input tests at the end start no process.
"""

import functools
import json

import pytest
import torch

from parallel_lab import models
from parallel_lab.runtime import launcher
from parallel_lab.tensor import dtensor as tp_dtensor
from parallel_lab.tensor import plan as tp_plan
from parallel_lab.tensor import run

# Shapes divisible by 1, 2, 3 and 4: hidden, 2*hidden, 4*hidden, heads, vocab and seq.
CONFIG = models.GPTConfig(vocab=48, seq=12, hidden=48, heads=12, layers=2)
BATCH = 2
TPS = (1, 2, 3, 4)
TOL = 1e-10
pytestmark = pytest.mark.timeout(120)
JOBS = [(case, sp) for case, c in run.CASES.items() for sp in (False, True) if not sp or c.sp_layouts]


@functools.lru_cache(maxsize=None)
def _reference(case):
    return run.reference(case, CONFIG, torch.float64, seed=0, batch=BATCH)


@functools.lru_cache(maxsize=None)
def results(tp):
    """Every case on ``tp`` ranks, then the DTensor check on the same pool: one start per tp."""
    jobs = [dict(case=case, config=CONFIG, sequence_parallel=sp, batch=BATCH, ref=_reference(case))
            for case, sp in JOBS]
    per_rank = launcher.run(run.check_cases, tp, args=(jobs,), timeout=120)
    by_job = {job: [ranks[i] for ranks in per_rank] for i, job in enumerate(JOBS)}
    dtensor = None
    if tp > 1:
        dtensor = launcher.run(tp_dtensor.check_against_dtensor, tp, kwargs=dict(config=CONFIG, batch=BATCH),
                               timeout=120)
    return by_job, dtensor


def full_output(rank_results, layout):
    """Reassemble the ranks' outputs (``layout`` as in run.CASES) into the whole tensor."""
    outs = [r["output"] for r in rank_results]
    if layout == "replicated":
        return outs[0]
    return torch.cat(outs, dim=-1 if layout == "hidden" else 1)


# ----------------------------------------------------------------------------------------------
# Against the dense reference.


@pytest.mark.ranks
@pytest.mark.parametrize("case,sequence_parallel", JOBS, ids=[f"{c}{'-sp' if sp else ''}" for c, sp in JOBS])
@pytest.mark.parametrize("tp", TPS)  # the outer loop: each tp's ranks start once
def test_matches_dense(tp, case, sequence_parallel):
    for r in results(tp)[0][(case, sequence_parallel)]:
        assert r["output_diff"] < TOL, f"rank {r['rank']}: output differs by {r['output_diff']:.3g}"
        bad = {name: d for name, d in r["grad_diffs"].items() if not d < TOL}
        assert not bad, f"rank {r['rank']}: gradients differ from the dense shards: {bad}"
        if case == "gpt":
            assert r["loss_diff"] < TOL


@pytest.mark.ranks
def test_every_gradient_is_checked():
    """The comparison covers each parameter (and the input): nothing is skipped by name."""
    r = results(2)[0][("block", True)][0]
    assert set(r["grad_diffs"]) == {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                    "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                    "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
                                    "<input>"}
    gpt = results(2)[0][("gpt", False)][0]["grad_diffs"]
    dense = len(list(models.GPT(CONFIG).parameters()))
    assert len(gpt) == dense - 4 * CONFIG.layers  # q, k, v (weights, biases) fuse into qkv; ids: no grad


@pytest.mark.ranks
@pytest.mark.parametrize("tp", (2, 3, 4))
@pytest.mark.parametrize("case", [c for c, sp in JOBS if sp])
def test_sequence_parallel_equals_plain_tp(tp, case):
    sp_layout = run.CASES[case].sp_layouts.split(">")[1]
    tp_layout = run.CASES[case].layouts.split(">")[1]
    by_job = results(tp)[0]
    sp_out = full_output(by_job[(case, True)], sp_layout)
    tp_out = full_output(by_job[(case, False)], tp_layout)
    assert sp_out.shape == tp_out.shape
    assert (sp_out - tp_out).abs().max().item() < TOL


# ----------------------------------------------------------------------------------------------
# Communication, counted by commlog on the ranks.


def _counts(log):
    return {op: row["count"] for op, row in log.items()}


@pytest.mark.ranks
@pytest.mark.parametrize("tp", (2, 3, 4))
def test_block_does_two_all_reduces_forward_and_two_backward(tp):
    r = results(tp)[0][("block", False)][0]
    assert _counts(r["forward"]) == {"all_reduce": 2}
    assert _counts(r["backward"]) == {"all_reduce": 2}
    activation = BATCH * CONFIG.seq * CONFIG.hidden * 8  # one (B, T, H) fp64 tensor, in bytes
    assert r["forward"]["all_reduce"]["bytes"] == r["backward"]["all_reduce"]["bytes"] == 2 * activation
    assert r["grad_sync"] == {}


@pytest.mark.ranks
@pytest.mark.parametrize("tp", (2, 3, 4))
def test_sequence_parallel_block_trades_all_reduces_for_the_same_volume(tp):
    plain = results(tp)[0][("block", False)][0]
    sp = results(tp)[0][("block", True)][0]
    halves = {"all_gather_single": 2, "reduce_scatter_single": 2}
    assert _counts(sp["forward"]) == halves
    assert run.ring_bytes(sp["forward"], tp) == pytest.approx(run.ring_bytes(plain["forward"], tp))
    # backward: the two halves of f's and g's all-reduces, plus the column layers' extra all-gather of
    # their input (Korthikanti et al. 2022, section 4.2.2): 6 halves where plain TP sends 4
    assert _counts(sp["backward"]) == {"all_gather_single": 4, "reduce_scatter_single": 2}
    assert run.ring_bytes(sp["backward"], tp) == pytest.approx(1.5 * run.ring_bytes(plain["backward"], tp))
    # LayerNorms and the row biases saw one sequence shard each: one all-reduce sums their grads
    assert _counts(sp["grad_sync"]) == {"all_reduce": 1}


@pytest.mark.ranks
@pytest.mark.parametrize("tp", (2, 3, 4))
def test_a_block_keeps_what_the_memory_model_counts_with_and_without_sequence_parallelism(tp):
    """What autograd saves on a rank for the backward is Korthikanti et al. 2022's sbh(10 + 24/t) with
    tensor parallelism and sbh·34/t with sequence parallelism (fp64, no dropout: 16 tensors of (s, b, h)
    values, the 4 outside the split layers t times smaller with SP; the fused attention keeps no
    scores, as selective recomputation), plus the per-token statistics the paper neglects: each
    LayerNorm's mean and 1/std on the tokens it sees, the attention's log-sum-exp of its heads. SP
    reaches 34/t only because the column layers keep their input's sequence shard and gather it again
    in the backward; keeping the gathered input would add 2·sbh·(1 − 1/t) values."""
    from parallel_lab.planning.memory_model import activation_bytes_per_layer

    s, b, h, a = CONFIG.seq, BATCH, CONFIG.hidden, CONFIG.heads
    for sp in (False, True):
        r = results(tp)[0][("block", sp)][0]
        model = activation_bytes_per_layer(s, b, h, a, tp=tp, sequence_parallel=sp, recompute="selective",
                                           value_bytes=8, dropout=False)
        statistics = 8 * (4 * s * b // (tp if sp else 1) + a // tp * s * b)
        assert r["saved_bytes"] == model + statistics, (sp, r["saved_bytes"], model, statistics)


@pytest.mark.ranks
@pytest.mark.parametrize("case", ["mlp", "parallel_mlp"])
def test_mlp_does_one_all_reduce_each_way(case):
    r = results(2)[0][(case, False)][0]
    assert _counts(r["forward"]) == {"all_reduce": 1}
    assert _counts(r["backward"]) == {"all_reduce": 1}


@pytest.mark.ranks
def test_gpt_collectives():
    r = results(4)[0][("gpt", False)][0]
    layers = CONFIG.layers
    # embedding g + 2 per block + the loss's max, target logit and sum-exp (no logits gathered)
    assert _counts(r["forward"]) == {"all_reduce": 1 + 2 * layers + 3}
    assert _counts(r["backward"]) == {"all_reduce": 2 * layers + 1}  # blocks' f's and the LM head's
    ce = results(4)[0][("cross_entropy", False)][0]
    assert ce["forward"]["all_reduce"] == {"count": 3, "bytes": 3 * BATCH * CONFIG.seq * 8}


# ----------------------------------------------------------------------------------------------
# Against PyTorch's own tensor parallelism (DTensor).


@pytest.mark.ranks
@pytest.mark.parametrize("tp", (2, 3, 4))
def test_matches_dtensor_parallelize_module(tp):
    for r in results(tp)[1]:
        assert r["output_diff"] < TOL
        assert r["input_grad_diff"] < TOL
        assert max(r["grad_diffs"].values()) < TOL, r["grad_diffs"]
        assert set(r["grad_diffs"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


# ----------------------------------------------------------------------------------------------
# The `run tensor` contract.


@pytest.mark.ranks
@pytest.mark.parametrize("model,sequence_parallel", [("block", True), ("gpt", False)])
def test_run_tensor_contract(model, sequence_parallel):
    out = run.run_tensor(4, model, sequence_parallel)  # tp 4: the pool left by the tests above
    json.dumps(out)  # the CLI prints it
    assert {"tp", "model", "sequence_parallel", "max_output_diff", "max_grad_diff", "collectives"} <= set(out)
    assert (out["tp"], out["model"], out["sequence_parallel"]) == (4, model, sequence_parallel)
    assert out["max_output_diff"] < TOL and out["max_grad_diff"] < TOL
    for row in out["collectives"].values():
        assert set(row) == {"count", "bytes"}
    if model == "gpt":
        assert out["loss_diff"] < TOL
        assert out["collectives"]["all_reduce"]["count"] == 1 + 2 * 2 + 3 + 2 * 2 + 1
    else:
        assert out["collectives"]["all_gather_single"]["count"] == 6  # 2 forward, 2 + 2 (the re-gathers) backward


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors before any process starts.


def cfg(**sizes):
    base = dict(vocab=48, seq=12, hidden=48, heads=12, layers=1)
    return models.GPTConfig(**{**base, **sizes})


@pytest.mark.parametrize("config,tp,sp,message", [
    (cfg(hidden=250, heads=5), 4, False, "hidden 250 is not divisible by tp 4"),
    (cfg(hidden=48, heads=6), 4, False, "heads 6 is not divisible by tp 4"),
    (cfg(vocab=50), 4, False, "vocab 50 is not divisible by tp 4"),
    (cfg(seq=10), 4, True, "sequence length 10 is not divisible by tp 4"),
    (cfg(), 9, False, "tp 9 is larger than the 8 ranks available"),
    (cfg(), 0, False, "tp must be at least 1, got 0"),
    (cfg(dropout=0.1), 2, False, "dropout 0.1 with tp 2"),
])
def test_check_tensor_parallel_names_the_broken_invariant(config, tp, sp, message):
    with pytest.raises(ValueError, match=message):
        tp_plan.check_tensor_parallel(config, tp, sp)


def test_sequence_length_only_matters_with_sequence_parallelism():
    tp_plan.check_tensor_parallel(cfg(seq=10), 4, sequence_parallel=False)


def test_run_tensor_rejects_bad_input_before_starting_ranks():
    before = launcher.pool_pids()
    with pytest.raises(ValueError, match="hidden 192 is not divisible by tp 5"):
        run.run_tensor(5, "block")
    with pytest.raises(ValueError, match="model must be one of"):
        run.run_tensor(2, "cnn")
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("plan,error,message", [
    ({"fc1": "diagonal"}, ValueError, "unknown style 'diagonal'"),
    ({"fc3": "colwise"}, ValueError, r"plan entries \['fc3'\] match no module of MLP"),
    ({"act": "colwise"}, TypeError, "'act' is a GELU; style 'colwise' needs Linear"),
    ({"fc*": "colwise", "fc2": "rowwise"}, ValueError, "'fc2' matches plan entries with different styles"),
])
def test_bad_plans_fail_without_processes(plan, error, message):
    with pytest.raises(error, match=message):
        tp_plan.parallelize(models.MLP(8), plan)


def test_default_plans_resolve_to_the_expected_modules():
    gpt = models.GPT(cfg(layers=2))
    chosen = dict(tp_plan.resolve_plan(gpt, tp_plan.default_plan(gpt)))
    assert chosen["blocks.1.attn"] == "attention" and chosen["blocks.0.mlp"] == "mlp"
    assert chosen["embed"] == "vocab_embedding" and chosen["head.out"] == "colwise"
    assert "blocks.0.mlp.fc1" not in chosen  # inside a module the plan already replaces
    assert tp_plan.default_plan(models.MLP(8)) == {"fc1": "colwise", "fc2": "rowwise"}
