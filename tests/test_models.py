"""The plain single-device models (parallel_lab.models): shapes, determinism, causality. No processes."""

import pytest
import torch

from parallel_lab import models

CFG = models.GPTConfig(vocab=32, seq=8, hidden=24, heads=4, layers=2)


def test_mlp_is_h_to_4h_to_h():
    mlp = models.MLP(16)
    assert mlp.fc1.weight.shape == (64, 16) and mlp.fc2.weight.shape == (16, 64)
    assert mlp(torch.randn(3, 5, 16)).shape == (3, 5, 16)


def test_gpt_shapes_and_loss():
    model = models.GPT(CFG)
    idx, targets = models.random_tokens(CFG, batch=3, seed=0)
    assert idx.shape == targets.shape == (3, CFG.seq)
    logits = model(idx)
    assert logits.shape == (3, CFG.seq, CFG.vocab)
    loss = models.cross_entropy(logits, targets)
    manual = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).mean()
    assert torch.allclose(loss, manual)


def test_random_tokens_are_shifted_targets():
    idx, targets = models.random_tokens(CFG, batch=2, seed=3)
    assert torch.equal(idx[:, 1:], targets[:, :-1])
    assert torch.equal(idx, models.random_tokens(CFG, batch=2, seed=3)[0])


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = models.GPT(CFG, seed=0), models.GPT(CFG, seed=0), models.GPT(CFG, seed=1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith(("ln.weight", "ln.bias", "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias")):
            assert not torch.equal(pa, pc), name


def test_init_does_not_depend_on_dtype_or_global_rng():
    torch.manual_seed(123)
    a = models.MLP(16, seed=5)
    torch.manual_seed(456)
    b = models.MLP(16, seed=5).to(torch.float64)
    assert torch.equal(a.fc1.weight.double(), b.fc1.weight)


def test_gpt_is_causal():
    model = models.GPT(CFG).double()
    idx, _ = models.random_tokens(CFG, batch=1, seed=0)
    changed = idx.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % CFG.vocab
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-12, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_as_sequential_is_the_same_model():
    model = models.GPT(CFG)
    idx, _ = models.random_tokens(CFG, batch=2, seed=0)
    stages = model.as_sequential()
    assert len(stages) == CFG.layers + 2
    assert torch.equal(stages(idx), model(idx))
    x = stages[:2](idx)  # a pipeline cut: embed + block 0, then the rest
    assert torch.equal(stages[2:](x), model(idx))


def test_attention_heads_are_independent():
    """What tensor parallelism relies on: attention over a subset of heads gives those heads' part."""
    cfg = models.GPTConfig(vocab=8, seq=6, hidden=24, heads=4, layers=1)
    q, k, v = (torch.randn(2, cfg.seq, cfg.hidden, dtype=torch.float64) for _ in range(3))
    full = models.causal_attention(q, k, v, cfg.head_dim)
    half = slice(0, cfg.hidden // 2)
    part = models.causal_attention(q[..., half], k[..., half], v[..., half], cfg.head_dim)
    assert torch.allclose(part, full[..., half], atol=1e-14, rtol=0)


def test_block_keeps_shape_and_is_deterministic():
    x = torch.randn(2, CFG.seq, CFG.hidden)
    assert torch.equal(models.Block(CFG, seed=4)(x), models.Block(CFG, seed=4)(x))
    assert models.Block(CFG)(x).shape == x.shape


@pytest.mark.parametrize("sizes,message", [
    (dict(hidden=30, heads=4), "hidden 30 is not divisible by heads 4"),
    (dict(layers=0), "layers must be a positive integer, got layers 0"),
    (dict(vocab=2.5), "vocab must be a positive integer, got vocab 2.5"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
])
def test_config_errors_name_the_invariant(sizes, message):
    base = dict(vocab=32, seq=8, hidden=24, heads=4, layers=2)
    with pytest.raises(ValueError, match=message):
        models.GPTConfig(**{**base, **sizes})


def test_gpt_rejects_sequences_longer_than_its_positions():
    model = models.GPT(CFG)
    with pytest.raises(ValueError, match="sequence length 9 > config.seq 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
