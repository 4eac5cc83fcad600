"""The course's models, as plain single-device PyTorch: an MLP and a tiny GPT (nanoGPT-like).

Nothing here knows about parallelism. Tensor parallelism is applied from outside by a plan
(``parallel_lab.tensor.plan.parallelize``) and pipeline parallelism cuts ``GPT.as_sequential()``
into stages, so every parallel run can be checked against these modules on one process.

    cfg = GPTConfig(vocab=96, seq=24, hidden=192, heads=24, layers=2)
    model = GPT(cfg, seed=0)                       # same seed -> same weights, in any process
    idx, targets = random_tokens(cfg, batch=2, seed=1)
    loss = cross_entropy(model(idx), targets)

Shapes: B batch, T sequence, H hidden, V vocabulary. Activations are ``(B, T, H)`` (nanoGPT's
layout). Introduced in the tensor-parallel lesson.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from parallel_lab.checks import positive_int


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the tiny GPT. ``hidden`` must be a multiple of ``heads``."""

    vocab: int = 96
    seq: int = 24  # the longest sequence (the number of position embeddings)
    hidden: int = 192
    heads: int = 24
    layers: int = 2
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab", "seq", "hidden", "heads", "layers"):
            positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# ----------------------------------------------------------------------------------------------
# Deterministic initialisation: the same seed gives the same weights in every process, which is
# what lets a rank cut its shard from the dense weights and a test compare with one process.


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> nn.Module:
    """Draw every parameter from a private generator seeded with ``seed`` (in parameter order).

    Linear and embedding weights ~ N(0, 1/fan_in) and N(0, 1): activations stay O(1) at any width,
    so a fixed absolute tolerance means the same thing for every shape. Biases ~ N(0, 0.1) rather
    than zero, so that a bias cut from the wrong place would show. LayerNorm starts at (1, 0).
    """
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.fill_(0.0)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            w = module.weight
            std = 1.0 if isinstance(module, nn.Embedding) else w.shape[1] ** -0.5
            w.copy_(torch.randn(w.shape, generator=gen) * std)
            if getattr(module, "bias", None) is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
    return model


# ----------------------------------------------------------------------------------------------
# The MLP: the layer Megatron-LM splits "column then row".


class MLP(nn.Module):
    """``(..., H) -> (..., 4H) -> (..., H)`` with GELU in between (Megatron-LM's MLP block)."""

    def __init__(self, hidden: int, seed: int | None = 0):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)
        if seed is not None:  # None: the enclosing model initialises everything at once
            init_weights(self, seed)

    def forward(self, x):  # (..., H)
        return self.fc2(self.act(self.fc1(x)))  # (..., 4H) -> (..., H)


# ----------------------------------------------------------------------------------------------
# The tiny GPT.


def causal_attention(q, k, v, head_dim: int, dropout: float = 0.0):
    """Causal multi-head attention on ``(B, T, n*head_dim)`` queries, keys and values.

    The number of heads ``n`` is read from the width, so the same function serves any subset of
    heads (a tensor-parallel rank holds ``heads / tp`` of them). Returns ``(B, T, n*head_dim)``.
    """
    B, T, width = q.shape
    # (B, T, n*d) -> (B, n, T, d): one attention per head
    q, k, v = (t.view(B, T, width // head_dim, head_dim).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)  # (B, n, T, d)
    return y.transpose(1, 2).reshape(B, T, width)  # (B, T, n*d)


class CausalSelfAttention(nn.Module):
    """``(B, T, H) -> (B, T, H)``: separate q, k, v projections (torchtitan's layout), output proj."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        H = config.hidden
        self.head_dim, self.dropout = config.head_dim, config.dropout
        self.q, self.k, self.v = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.proj = nn.Linear(H, H)

    def forward(self, x):  # (B, T, H)
        p = self.dropout if self.training else 0.0
        y = causal_attention(self.q(x), self.k(x), self.v(x), self.head_dim, p)  # (B, T, H)
        return self.proj(y)


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``. ``(B, T, H)``."""

    def __init__(self, config: GPTConfig, seed: int | None = 0):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config.hidden, seed=None)
        self.drop = nn.Dropout(config.dropout)
        if seed is not None:  # None: the enclosing GPT initialises everything at once
            init_weights(self, seed)

    def forward(self, x):  # (B, T, H)
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Embeddings(nn.Module):
    """Token plus learned position embeddings: ``(B, T)`` ids -> ``(B, T, H)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.seq, config.hidden)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx):  # (B, T) token ids
        positions = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        return self.drop(self.tok(idx) + self.pos(positions))  # (B, T, H)


class LMHead(nn.Module):
    """Final LayerNorm and the projection to the vocabulary: ``(B, T, H) -> (B, T, V)`` logits."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.hidden)
        # Not tied to the token embedding (nanoGPT ties them): tied weights would sit in the first
        # and the last pipeline stage and need a gradient all-reduce between them.
        self.out = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, x):  # (B, T, H)
        return self.out(self.ln(x))  # (B, T, V)


class GPT(nn.Module):
    """``embed -> blocks -> head``: ``(B, T)`` token ids -> ``(B, T, V)`` logits.

    ``as_sequential()`` lists the same modules in order, for cutting into pipeline stages.
    """

    def __init__(self, config: GPTConfig, seed: int = 0):
        super().__init__()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config, seed=None) for _ in range(config.layers))
        self.head = LMHead(config)
        init_weights(self, seed)

    def forward(self, idx):  # (B, T)
        if idx.shape[1] > self.config.seq:
            raise ValueError(f"sequence length {idx.shape[1]} > config.seq {self.config.seq}")
        x = self.embed(idx)  # (B, T, H)
        for block in self.blocks:
            x = block(x)  # (B, T, H)
        return self.head(x)  # (B, T, V)

    def as_sequential(self) -> nn.Sequential:
        """``[embed, block 0, ..., block L-1, head]`` sharing this model's modules (and weights)."""
        return nn.Sequential(self.embed, *self.blocks, self.head)


def cross_entropy(logits, targets):
    """Mean next-token loss: ``(B, T, V)`` logits, ``(B, T)`` targets -> scalar."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def random_tokens(config: GPTConfig, batch: int, seed: int = 0):
    """A deterministic batch of random token ids and next-token targets, each ``(batch, seq)``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(config.vocab, (batch, config.seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
