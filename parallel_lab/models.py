"""The course's models, as plain single-device PyTorch: an MLP (and the pipeline lessons' stack of
Linear + GELU blocks, ``mlp_stack``), a mixture of experts (``MoE``) and a tiny GPT (nanoGPT-like;
``GPTConfig(experts=E)`` puts a MoE in every block instead of the MLP).

Nothing here knows about parallelism. Tensor parallelism is applied from outside by a plan
(``parallel_lab.tensor.plan.parallelize``), pipeline parallelism cuts ``GPT.as_sequential()``
into stages and expert parallelism spreads a ``MoE``'s experts over ranks
(``parallel_lab.moe.layer.ExpertParallelMoE.from_dense``), so every parallel run can be checked
against these modules on one process.

    cfg = GPTConfig(vocab=96, seq=24, hidden=192, heads=24, layers=2)
    model = GPT(cfg, seed=0)                       # same seed -> same weights, in any process
    idx, targets = random_tokens(cfg, batch=2, seed=1)
    loss = cross_entropy(model(idx), targets)

Shapes: B batch, T sequence, H hidden, V vocabulary. Activations are ``(B, T, H)`` (nanoGPT's
layout). Introduced in the tensor-parallel lesson.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from parallel_lab.checks import positive_int, positive_number
from parallel_lab.i18n import _

# Lesson 13 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("top_k_routing",)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the tiny GPT. ``hidden`` must be a multiple of ``heads``."""

    vocab: int = 96
    seq: int = 24  # the longest sequence (the number of position embeddings)
    hidden: int = 192
    heads: int = 24
    layers: int = 2
    dropout: float = 0.0
    # A mixture of experts in place of every block's MLP (``MoE``) when experts > 0; 0: the dense MLP.
    experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = 1.25  # None: no capacity, no token dropped

    def __post_init__(self):
        for name in ("vocab", "seq", "hidden", "heads", "layers"):
            positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(_("hidden {hidden} is not divisible by heads {heads}").format(hidden=self.hidden,
                                                                                            heads=self.heads))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.experts:
            check_moe(self.experts, self.top_k, self.capacity_factor)

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

    def __init__(self, hidden: int, seed: int | None = 0, ffn: int | None = None):
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn  # the inner width (an expert's may be smaller)
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)
        if seed is not None:  # None: the enclosing model initialises everything at once
            init_weights(self, seed)

    def forward(self, x):  # (..., H)
        return self.fc2(self.act(self.fc1(x)))  # (..., 4H) -> (..., H)


def mlp_stack(hidden: int, layers: int, seed: int = 0) -> nn.Sequential:
    """The pipeline lessons' MLP: ``layers`` blocks, each ``nn.Linear(hidden, hidden)`` then GELU,
    ``(N, H) -> (N, H)``; a block is what ``parallel_lab.pipeline.stages`` moves between stages."""
    blocks = nn.Sequential(*(nn.Sequential(nn.Linear(hidden, hidden), nn.GELU()) for _ in range(layers)))
    return init_weights(blocks, seed)


# ----------------------------------------------------------------------------------------------
# A mixture of experts: E MLPs and a router that sends each token to k of them.
#
# Lepikhin et al. 2020, "GShard" (top-2 routing, an expert capacity, tokens over it dropped, first
# choices queued before second ones); Fedus et al. 2021, "Switch Transformers" (top-1, the capacity
# factor, the auxiliary load-balancing loss); DeepSeek-AI 2024, "DeepSeek-V3" (top-8 of 256 routed
# experts, balanced without an auxiliary loss and without dropping: ``capacity_factor=None`` here).
# Expert parallelism (``parallel_lab.moe``) spreads the experts over ranks from outside and routes,
# caps and drops exactly as this layer does, with these functions.


def check_moe(experts, top_k, capacity_factor) -> None:
    """The sizes a mixture of experts needs, or a ValueError naming the broken one."""
    positive_int("experts", experts)
    positive_int("top_k", top_k)
    if top_k > experts:
        raise ValueError(f"MoE needs top_k <= experts, got top_k {top_k}, experts {experts}")
    if capacity_factor is not None:
        positive_number("capacity_factor", capacity_factor)


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Assignments one expert takes in a forward: ceil(capacity_factor * tokens * top_k / experts)
    (Switch's formula with k assignments per token). None: ``tokens``, which never drops (a token's
    k choices are k different experts)."""
    if capacity_factor is None:
        return tokens
    # rounded first: 1.1 * 40 * 2 / 4 is 22.000000000000004 in floating point, whose ceiling is 23
    return math.ceil(round(capacity_factor * tokens * top_k / experts, 9))


def top_k_routing(logits, top_k: int):
    """Router logits ``(n, E)`` -> softmax ``probs`` ``(n, E)``, ``gate`` and ``expert`` ``(n, k)``
    (best first). With k > 1 the k gates are renormalised to sum to 1 (GShard, Mixtral); with k = 1
    the gate is the probability itself (Switch): renormalised it would be 1 and the output would
    give the router no gradient."""
    probs = logits.softmax(dim=-1)
    gate, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gate = gate / gate.sum(dim=-1, keepdim=True)
    return probs, gate, expert


def assignment_counts(expert, experts: int):
    """``(n, k)`` chosen experts -> ``(k, E)``: how many tokens took each expert as choice s."""
    return F.one_hot(expert.t(), experts).sum(dim=1)  # (k, n, E) -> (k, E)


def queue_positions(expert, experts: int, ahead):
    """Each assignment's place in its expert's queue: ``(n, k)`` chosen experts -> ``(n, k)``.

    Queues fill choice by choice (every token's first choice before any second choice, GShard) and
    within a choice in token order. ``ahead`` ``(k, E)`` counts the assignments queued before this
    batch's at each (choice, expert): ``counts.cumsum(0) - counts`` for a batch on its own; expert
    parallelism adds the lower ranks' tokens. A position >= the capacity is a dropped assignment.
    """
    onehot = F.one_hot(expert.t(), experts)  # (k, n, E)
    earlier = onehot.cumsum(dim=1) - onehot  # (k, n, E): earlier tokens, same choice and expert
    position = (earlier + ahead[:, None, :]).gather(2, expert.t().unsqueeze(2)).squeeze(2)  # (k, n)
    return position.t()  # (n, k)


def load_balancing_loss(probs, routed, tokens: int):
    """Switch Transformer's auxiliary loss ``E * sum_i f_i * P_i``: f_i the share of the assignments
    routed to expert i (before the capacity; no gradient), P_i expert i's mean router probability.
    1 when routing is uniform, more when unbalanced. ``probs`` ``(n, E)``; ``routed`` ``(E,)`` and
    ``tokens`` may count a larger batch than ``probs`` holds (expert parallelism: the whole batch's,
    so that the ranks' losses add up to the batch's)."""
    share = routed.to(probs.dtype) / routed.sum()  # (E,) f_i
    return probs.shape[-1] * (share * probs.sum(dim=0)).sum() / tokens


def run_experts(experts, x, which):
    """Row i of ``x`` ``(m, H)`` through ``experts[which[i]]`` -> ``(m, H)``. Every expert runs, on
    no rows when none was chosen, so that each has a (zero) gradient after backward."""
    out = x.new_zeros(x.shape)
    for e, expert in enumerate(experts):
        rows = (which == e).nonzero().squeeze(1)
        out = out.index_copy(0, rows, expert(x[rows]))
    return out


@dataclass
class Routing:
    """What a MoE layer's last forward did with its n tokens, k choices each."""

    expert: torch.Tensor  # (n, k) the chosen experts, best first
    gate: torch.Tensor  # (n, k) their weights in the output (detached)
    position: torch.Tensor  # (n, k) the place in the expert's queue
    kept: torch.Tensor  # (n, k) position < capacity; False: dropped
    capacity: int  # assignments one expert takes
    routed_per_expert: torch.Tensor  # (E,) assignments routed to each expert: the demand
    tokens_per_expert: torch.Tensor  # (E,) assignments each expert computed: min(demand, capacity)
    aux_loss: torch.Tensor  # load_balancing_loss, a differentiable scalar

    @property
    def dropped(self) -> int:
        """Assignments (token, choice) dropped for want of capacity."""
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self):
        """``(n,)``: tokens whose every choice was dropped. The layer gives them 0, so ``Block``'s
        residual passes them on unchanged."""
        return ~self.kept.any(dim=-1)


class MoE(nn.Module):
    """A mixture-of-experts MLP, ``(..., H) -> (..., H)``: a router (``Linear(H, E)``, no bias) and
    ``experts`` MLPs ``H -> ffn -> H``. A token's output is the gate-weighted sum of its ``top_k``
    experts' outputs. An expert takes at most ``expert_capacity`` assignments per forward; the rest
    are dropped and add nothing (a token with every choice dropped comes out 0).

    Each forward leaves ``self.routing`` (a ``Routing``): which assignments were dropped, the load
    per expert, and ``aux_loss`` -- add ``coef * aux_loss`` to the loss to balance the experts
    (Switch uses coef 0.01; ``moe_aux_loss`` sums a model's).
    """

    def __init__(self, hidden: int, experts: int, top_k: int = 2, capacity_factor: float | None = 1.25,
                 ffn: int | None = None, seed: int | None = 0):
        super().__init__()
        positive_int("hidden", hidden)
        check_moe(experts, top_k, capacity_factor)
        self.num_experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, seed=None, ffn=ffn) for _ in range(experts))
        self.routing: Routing | None = None
        if seed is not None:  # None: the enclosing model initialises everything at once
            init_weights(self, seed)

    def forward(self, x):  # (..., H)
        flat = x.reshape(-1, x.shape[-1])  # (n, H): the tokens, in order
        n, E = flat.shape[0], self.num_experts
        probs, gate, expert = top_k_routing(self.router(flat), self.top_k)  # (n, E), (n, k), (n, k)
        counts = assignment_counts(expert, E)  # (k, E)
        capacity = expert_capacity(n, E, self.top_k, self.capacity_factor)
        position = queue_positions(expert, E, counts.cumsum(0) - counts)  # (n, k)
        kept = position < capacity
        token, choice = kept.nonzero(as_tuple=True)  # the kept assignments
        y = run_experts(self.experts, flat[token], expert[token, choice])  # (kept, H)
        out = flat.new_zeros(flat.shape).index_add(0, token, gate[token, choice, None] * y)  # (n, H)
        routed = counts.sum(0)  # (E,)
        self.routing = Routing(expert, gate.detach(), position, kept, capacity, routed,
                               routed.clamp(max=capacity), load_balancing_loss(probs, routed, n))
        return out.view(x.shape)


def moe_aux_loss(model: nn.Module):
    """The sum of the load-balancing losses of ``model``'s mixture-of-experts layers (any module
    with a ``routing``) in their last forward; 0 when it has none."""
    losses = [m.routing.aux_loss for m in model.modules() if getattr(m, "routing", None) is not None]
    return sum(losses, torch.zeros(()))


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
        if config.experts:  # the same place and name: a dropped token leaves the block as x
            self.mlp = MoE(config.hidden, config.experts, config.top_k, config.capacity_factor, seed=None)
        else:
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
