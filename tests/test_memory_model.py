"""Per-device memory under 3D parallelism (parallel_lab.planning.memory_model), checked against the real tiny GPT:
parameter counts from its modules, activations measured with saved_tensors_hooks."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from parallel_lab import models
from parallel_lab.pipeline.activation_bytes import ByteCounter
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import M_W_SHARE, simulate
from parallel_lab.planning import memory, memory_model
from parallel_lab.planning.memory_model import activation_bytes_per_layer as per_layer

GPT3 = memory.MODELS["GPT-3 175B"]


# ----------------------------------------------------------------------------------------------
# Parameters, against the real model.


@pytest.mark.parametrize("cfg", [models.GPTConfig(), models.GPTConfig(vocab=50, seq=7, hidden=32, heads=4, layers=3)])
def test_param_count_is_the_real_models(cfg):
    real = sum(p.numel() for p in models.GPT(cfg).parameters())
    assert memory_model.param_count(cfg.layers, cfg.hidden, cfg.vocab, cfg.seq) == real


# Megatron's split of a block: column-parallel weights and biases and row-parallel weights are cut
# in tp pieces; LayerNorms and the row-parallel biases (added after the all-reduce) are replicated.
SPLIT = ("attn.q.", "attn.k.", "attn.v.", "attn.proj.weight", "mlp.fc1.", "mlp.fc2.weight")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_layer_params_per_tp_rank(tp):
    cfg = models.GPTConfig(hidden=64, heads=8)
    block = models.Block(cfg)
    split = sum(p.numel() for n, p in block.named_parameters() if n.startswith(SPLIT))
    replicated = sum(p.numel() for n, p in block.named_parameters() if not n.startswith(SPLIT))
    assert split + replicated == sum(p.numel() for p in block.parameters())
    assert memory_model.layer_params(cfg.hidden, tp) == split // tp + replicated


def test_stage_params_add_up():
    cfg = memory.ModelConfig("small", layers=8, hidden=64, heads=8, vocab=96, seq=16)
    total = memory_model.param_count(8, 64, 96, 16)
    assert sum(memory_model.stage_params(cfg, pp=4, tp=1, stage=s) for s in range(4)) == total
    assert memory_model.stage_params(cfg, pp=1) == total
    with pytest.raises(ValueError, match="layers 8 % pp 3 != 0"):
        memory_model.stage_params(cfg, pp=3)


def test_gpt3_on_a_tp8_pp8_device_holds_about_a_64th():
    params = max(memory_model.stage_params(GPT3, pp=8, tp=8, stage=s) for s in range(8))
    assert params == pytest.approx(175e9 / 64, rel=0.06)  # + the embedding on stage 0


# ----------------------------------------------------------------------------------------------
# Activations: the paper's formulas ...


@pytest.mark.parametrize("s, b, h, a", [(2048, 1, 12288, 96), (512, 4, 1024, 16), (8, 2, 16, 2)])
@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_formulas(s, b, h, a, t):
    sbh, score = s * b * h, 5 * a * s / h
    if t == 1:
        assert per_layer(s, b, h, a) == pytest.approx(sbh * (34 + score))
    assert per_layer(s, b, h, a, tp=t) == pytest.approx(sbh * (10 + 24 / t + score / t))
    assert per_layer(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + score / t))
    assert per_layer(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert per_layer(s, b, h, a, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert per_layer(s, b, h, a, tp=t, recompute="full") == 2 * sbh
    assert per_layer(s, b, h, a, tp=t, sequence_parallel=True, recompute="full") == pytest.approx(2 * sbh / t)


def test_agrees_with_the_single_device_lesson():
    for name in ("GPT-3 1.3B", "GPT-3 175B"):
        m = memory.MODELS[name]
        assert memory.activations(m, 2) == m.layers * per_layer(m.seq, 2, m.hidden, m.heads)
        assert memory.activations(m, 2, recompute=True) == m.layers * per_layer(m.seq, 2, m.hidden, m.heads,
                                                                                recompute="full")


# ... and measured on the tiny GPT. In fp32 (4-byte values) without dropout the formula counts 16
# tensors of (s, b, h) values per layer -- LayerNorm inputs (2), the QKV input, Q, K, V, the attention
# output, the MLP input, its 4h output and the GELU output (4 + 4) -- plus the s x s softmax output
# per head. What the measurement sees in addition are per-token statistics the paper neglects:
# each LayerNorm's mean and 1/std (2 x 2 x s·b values) and, with the fused (flash) attention kernel
# PyTorch uses on CPU, the log-sum-exp per head (a·s·b). The fused kernel does not keep the s x s
# scores at all: it recomputes them in backward, i.e. it *is* selective recomputation.

TINY = models.GPTConfig(vocab=96, seq=32, hidden=64, heads=4, layers=1)
B = 3


def _measure(backend=None, wrap=None):
    block = models.GPT(TINY).blocks[0]
    x = torch.randn(B, TINY.seq, TINY.hidden, requires_grad=True)
    fn = block if wrap is None else (lambda inp: wrap(block, inp))
    with ByteCounter(exclude=block.parameters()).saved() as saved:
        if backend is None:
            fn(x)
        else:
            with sdpa_kernel(backend):
                fn(x)
    return saved.total


def _formula(recompute):
    return per_layer(TINY.seq, B, TINY.hidden, TINY.heads, recompute=recompute, value_bytes=4, dropout=False)


def test_measured_fused_attention_is_selective_recomputation():
    s, a = TINY.seq, TINY.heads
    stats = (4 + a) * s * B * 4  # LayerNorm mean + 1/std (x2), attention log-sum-exp per head
    assert _measure() == _formula("selective") + stats
    assert _measure() == pytest.approx(_formula("selective"), rel=0.01)


def test_measured_plain_attention_keeps_the_scores():
    stats = 4 * TINY.seq * B * 4  # LayerNorm statistics only
    assert _measure(SDPBackend.MATH) == _formula("none") + stats
    assert _measure(SDPBackend.MATH) == pytest.approx(_formula("none"), rel=0.01)


def test_measured_full_recomputation_keeps_the_input():
    measured = _measure(wrap=lambda block, x: checkpoint(block, x, use_reentrant=False))
    assert measured == _formula("full") == 4 * TINY.seq * B * TINY.hidden


# ----------------------------------------------------------------------------------------------
# Micro-batches in flight, from the simulator.


@pytest.mark.parametrize("name, virtual", [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)])
@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_capped_simulation_equals_the_full_one(name, virtual, pp):
    for m in (pp, 3 * pp, 5 * pp, 9 * pp):
        full = simulate(build(name, pp, m, virtual)).peak_rank_activations
        assert memory_model.in_flight(name, pp, m, virtual) == full


def test_in_flight_closed_forms():
    assert memory_model.in_flight("1f1b", 4, 16) == [4, 3, 2, 1]  # min(m, p - r)
    assert memory_model.in_flight("1f1b", 4, 2) == [2, 2, 2, 1]
    assert memory_model.in_flight("gpipe", 4, 600) == [600] * 4  # beyond the simulator's cap
    # ZB-H1 counted until W: rank r holds p - r micro-batches whole and r waiting for their W
    assert memory_model.in_flight("zb-h1", 4, 16, w_share=0.5) == [4, 3.5, 3, 2.5]
    assert memory_model.in_flight("zb-h1", 4, 16, w_share=1.0) == [4, 4, 4, 4]


def test_weight_gradient_memory_is_the_papers_m_w():
    """Qi et al. 2023, Table 1: M_W = 32sbh with 2-byte values; M_W / M_B = 32/34 once the attention
    scores are not stored (selective recomputation), which is the simulator's default share."""
    s, b, h = GPT3.seq, 1, GPT3.hidden
    assert memory_model.weight_grad_bytes_per_layer(s, b, h) == 32 * s * b * h
    assert memory_model.weight_grad_bytes_per_layer(s, b, h, tp=8, sequence_parallel=True) == 32 * s * b * h / 8
    assert memory_model.weight_grad_bytes_per_layer(s, b, h, tp=8) == 2 * s * b * h * (2 + 14 / 8)
    selective = per_layer(s, b, h, GPT3.heads, recompute="selective")
    assert memory_model.weight_grad_bytes_per_layer(s, b, h) / selective == pytest.approx(M_W_SHARE)


def test_zb_h1_device_memory_counts_activations_until_w():
    kwargs = dict(micro_batch=1, dp=8, pp=8, tp=8, sequence_parallel=True, microbatches=64, recompute="selective")
    zb = memory_model.device_memory(GPT3, schedule="zb-h1", **kwargs)
    one = memory_model.device_memory(GPT3, schedule="1f1b", **kwargs)
    assert zb[0]["activations"] == pytest.approx(one[0]["activations"])  # rank 0: p M_B in both
    for r in range(1, 7):  # later ranks: (p - r) M_B + r M_W, more than 1F1B's (p - r) M_B
        assert zb[r]["in_flight"] == pytest.approx(8 - r + r * 32 / 34, abs=1e-6)
        assert zb[r]["activations"] > one[r]["activations"]
    worst = memory_model.max_device_memory(GPT3, schedule="zb-h1", **kwargs)
    assert worst == max(zb, key=lambda row: row["total"])


# ----------------------------------------------------------------------------------------------
# A whole device.


def test_zero1_shards_the_optimizer_over_dp():
    plain = memory_model.max_device_memory(GPT3, dp=8, pp=8, tp=8, microbatches=8)
    zero = memory_model.max_device_memory(GPT3, dp=8, pp=8, tp=8, microbatches=8, zero1=True)
    assert zero["optimizer"] == pytest.approx(plain["optimizer"] / 8)
    assert zero["weights"] == plain["weights"] and zero["activations"] == plain["activations"]
    assert plain["optimizer"] == 12 * plain["params"] and plain["weights"] == 2 * plain["params"]


def test_gpt3_tp8_pp8_activations_by_hand():
    row = memory_model.device_memory(GPT3, micro_batch=1, dp=8, pp=8, tp=8, sequence_parallel=True,
                                     schedule="1f1b", microbatches=64, recompute="selective")[0]
    s, h = GPT3.seq, GPT3.hidden
    assert row["in_flight"] == 8  # 1F1B: stage 0 holds p micro-batches
    assert row["activations"] == pytest.approx(8 * 12 * s * h * 34 / 8)  # 8 micro-batches x 12 layers
    vocab_rows = -(-GPT3.vocab // 8)  # 50257 rows do not split evenly: count the padded ones
    params = 12 * ((12 * h * h + 7 * h) // 8 + 6 * h) + vocab_rows * h + s * h
    assert row["params"] == params
    assert row["total"] == pytest.approx(16 * params + row["activations"])  # ~44 GB of state + ~10 GB


def test_first_stage_is_the_heaviest_for_1f1b_and_max_finds_it():
    rows = memory_model.device_memory(GPT3, dp=8, pp=8, tp=8, microbatches=32, recompute="selective")
    worst = memory_model.max_device_memory(GPT3, dp=8, pp=8, tp=8, microbatches=32, recompute="selective")
    assert worst == max(rows, key=lambda r: r["total"]) and worst["stage"] == 0
    assert [r["in_flight"] for r in rows] == [8, 7, 6, 5, 4, 3, 2, 1]


@pytest.mark.parametrize("call, message", [
    (lambda: per_layer(2048, 1, 12288, 96, recompute="some"), "unknown recompute 'some'"),
    (lambda: memory_model.device_memory(GPT3, pp=5), r"layers 96 % \(pp 5 x virtual 1\) != 0"),
    (lambda: memory_model.device_memory(GPT3, tp=5), "heads 96 % tp 5 != 0"),
    (lambda: per_layer(0, 1, 8, 2), "seq must be a positive integer, got seq 0"),
])
def test_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
