"""Pipeline stages: cut a model into them, the same in every process.

    spec = ModelSpec("mlp", hidden=64, layers=8, batch=16)
    pieces = spec.pieces()                 # the whole model as an ordered list of modules
    stages = cut(spec, n_stages=4)         # [Stage(index=0, module=layers 0-1, names=[...]), ...]
    x, target = spec.data()                # the whole batch; microbatches are row chunks

The model itself knows nothing about pipelines: a model is an ordered list of *pieces* (for the MLP
stack, eight Linear+GELU blocks; for the tiny GPT of ``parallel_lab.models``, the embedding, the
transformer blocks and the head), and a stage is a contiguous run of them. Only the repeated middle
pieces are balanced across stages; the GPT's embedding rides on the first stage and its final norm,
head and loss on the last (as in Megatron-LM and torchtitan).

Every process rebuilds the same weights from ``spec.seed`` (deterministic initialisation), so ranks
need no weights sent to them and the single-process reference (``reference``) sees the very same
model. Parameter names are global (``"3.0.weight"``: piece 3's), so gradients from any rank can be
compared with the reference by name.

``pipeline.worker.StageWorker`` runs one stage's actions; ``pipeline.executor`` decides when.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from parallel_lab import models
from parallel_lab.checks import positive_int
from parallel_lab.i18n import N_, _

# Lesson 09 prints these (``i18n.source``): their docstrings and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("cut_at", "_stages")
MODELS = ("mlp", "gpt")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class ModelSpec:
    """What to build, as plain data (picklable: it is what the parent sends to the ranks).

    model:   "mlp" (``models.mlp_stack``: ``layers`` Linear+GELU blocks of width ``hidden``, mean
             squared error against a random target) or "gpt" (``parallel_lab.models.GPT`` with ``layers`` blocks, mean
             next-token cross-entropy)
    batch:   the whole batch; microbatches are equal row chunks of it
    seq, vocab, heads: GPT sizes (ignored by the MLP)
    dtype:   "float64" (exact comparisons) or "float32" (benchmarks)
    """

    model: str = "mlp"
    hidden: int = 32
    layers: int = 8
    batch: int = 16
    seq: int = 8
    vocab: int = 32
    heads: int = 2
    seed: int = 0
    dtype: str = "float64"

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        for name in ("hidden", "layers", "batch", "seq", "vocab", "heads"):
            positive_int(name, getattr(self, name))
        if self.model == "gpt" and self.hidden % self.heads:
            raise ValueError(f"gpt needs hidden % heads == 0, got hidden {self.hidden}, heads {self.heads}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    def gpt_config(self):
        return models.GPTConfig(vocab=self.vocab, seq=self.seq, hidden=self.hidden, heads=self.heads,
                                layers=self.layers)

    def pieces(self) -> tuple[list[nn.Module], int, int]:
        """``(pieces, head, tail)``: the model as an ordered list of modules, of which the first
        ``head`` and the last ``tail`` are pinned to the first and the last stage (the GPT's
        embedding and its final norm + projection); the rest are balanced across stages."""
        if self.model == "mlp":
            return list(models.mlp_stack(self.hidden, self.layers, self.seed).to(self.torch_dtype)), 0, 0

        gpt = models.GPT(self.gpt_config(), seed=self.seed).to(self.torch_dtype)
        return list(gpt.as_sequential()), 1, 1

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch ``(x, target)``: MLP ``(batch, hidden)`` both; GPT ``(batch, seq)`` token
        ids and next-token targets. Drawn from ``seed + 1``, the same in every process."""
        if self.model == "mlp":
            gen = torch.Generator().manual_seed(self.seed + 1)
            x = torch.randn((self.batch, self.hidden), generator=gen)
            target = torch.randn((self.batch, self.hidden), generator=gen)
            return x.to(self.torch_dtype), target.to(self.torch_dtype)

        return models.random_tokens(self.gpt_config(), self.batch, self.seed + 1)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss of one (micro)batch: a scalar."""
        if self.model == "mlp":
            return F.mse_loss(out, target)  # (N, H), (N, H)
        return F.cross_entropy(out.flatten(0, 1), target.flatten())  # (N, T, V), (N, T)

    def boundary_shape(self, rows: int) -> tuple[int, ...]:
        """Shape of what crosses between two stages for a microbatch of ``rows``: the hidden state,
        ``(rows, hidden)`` for the MLP, ``(rows, seq, hidden)`` for the GPT."""
        return (rows, self.hidden) if self.model == "mlp" else (rows, self.seq, self.hidden)

    def cuttable(self) -> int:
        """How many pieces are balanced across stages: at most this many stages."""
        return self.layers


class Stage(NamedTuple):
    """One model stage: ``module`` applies pieces ``first..last`` in order; ``names[i]`` is the global
    name (``"{piece}.{name in piece}"``) of ``module``'s i-th parameter."""

    index: int
    module: nn.Sequential
    first: int
    last: int
    names: list[str]


def check_stages(spec: ModelSpec, n_stages: int) -> None:
    """Raise ValueError (before anything starts) when the model cannot be cut into ``n_stages``."""
    check_blocks(spec.model, spec.cuttable(), n_stages)


def check_blocks(model: str, blocks: int, n_stages: int) -> None:
    """Raise ValueError when ``blocks`` (the pieces balanced across stages: the MLP's Linear+GELU
    blocks, the GPT's transformer blocks) cannot fill ``n_stages`` stages, one at least each."""
    if n_stages > blocks:
        message = (N_("cannot cut {model} into {stages} model stages: it has only layers {blocks} Linear+GELU blocks, "
                      "and every stage needs at least one (n_stages {stages} > layers {blocks})") if model == "mlp"
                   else N_("cannot cut {model} into {stages} model stages: it has only layers {blocks} transformer "
                           "blocks, and every stage needs at least one (n_stages {stages} > layers {blocks})"))
        raise ValueError(_(message).format(model=model, stages=n_stages, blocks=blocks))


def bounds(n_pieces: int, head: int, tail: int, n_stages: int) -> list[tuple[int, int]]:
    """Stage ``s`` holds pieces ``[first, last)``: the middle ``n_pieces - head - tail`` balanced (the
    first ``n % n_stages`` stages get one more), the head pinned to stage 0, the tail to the last."""
    middle = n_pieces - head - tail
    size, extra = divmod(middle, n_stages)
    edges = [head]
    for s in range(n_stages):
        edges.append(edges[-1] + size + (s < extra))
    edges[0], edges[-1] = 0, n_pieces
    return list(zip(edges[:-1], edges[1:]))


def cut(spec: ModelSpec, n_stages: int, keep=None) -> list[Stage | None]:
    """The model cut into ``n_stages`` stages (``keep``: only build those indices, others None):
    the even cut of ``bounds``."""
    check_stages(spec, n_stages)
    pieces, head, tail = spec.pieces()
    return cut_pieces(pieces, n_stages, head, tail, keep)


def cut_pieces(pieces: list[nn.Module], n_stages: int, head: int = 0, tail: int = 0,
               keep=None) -> list[Stage | None]:
    """Any model given as its ordered ``pieces`` (a 3D run's tensor-parallel shard of the GPT, say)
    cut evenly into ``n_stages`` (``bounds``: the first ``head`` pieces pinned to stage 0, the last
    ``tail`` to the last stage); ``keep``: only build those stage indices, the others are None."""
    edges = bounds(len(pieces), head, tail, n_stages)
    return _stages(pieces, [first for first, _ in edges] + [len(pieces)], keep)


def cut_at(spec: ModelSpec, parts: Sequence[int], keep=None) -> list[Stage | None]:
    """The model of ``spec`` cut at ``parts``: boundaries over all its pieces, as in
    ``parallel_lab.pipeline.partition`` (stage ``s`` holds pieces ``parts[s]`` to ``parts[s + 1] - 1``);
    ``keep``: only build those stage indices, the others are None."""
    pieces, _, _ = spec.pieces()
    return _stages(pieces, check_parts(parts, len(pieces)), keep)


def _stages(pieces: list[nn.Module], parts: list[int], keep) -> list[Stage | None]:
    """One Stage per pair of boundaries. Parameter names are global (``"3.0.weight"``), as in the
    uncut model, so that gradients compare with ``reference`` by name."""
    stages: list[Stage | None] = []
    for s, (first, last) in enumerate(zip(parts[:-1], parts[1:])):
        if keep is not None and s not in keep:
            stages.append(None)
            continue
        module = nn.Sequential(*pieces[first:last])
        names = [f"{first + int(k.split('.', 1)[0])}.{k.split('.', 1)[1]}" for k, _ in module.named_parameters()]
        stages.append(Stage(s, module, first, last, names))
    return stages


def check_parts(parts: Sequence[int], n_pieces: int) -> list[int]:
    """``parts`` as a list, or ValueError: ``stages + 1`` strictly increasing integers from 0 to
    ``n_pieces`` (every stage holds at least one piece)."""
    parts = list(parts)
    if len(parts) < 2 or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) for b in parts):
        raise ValueError(f"parts must be a list of at least 2 integers, got parts {parts!r}")
    if parts[0] != 0 or parts[-1] != n_pieces:
        raise ValueError(f"parts must run from 0 to the number of pieces {n_pieces}, got parts {parts}")
    empty = [s for s, (a, b) in enumerate(zip(parts[:-1], parts[1:])) if b <= a]
    if empty:
        raise ValueError(f"parts must increase strictly: stage {empty[0]} would hold pieces "
                         f"{parts[empty[0]]}..{parts[empty[0] + 1] - 1} (parts {parts})")
    return [int(b) for b in parts]


def reference(spec: ModelSpec) -> dict:
    """The single-process answer: loss (mean over the whole batch) and every parameter's gradient by
    global name, from one forward and backward of the uncut model."""
    pieces, _, _ = spec.pieces()
    model = nn.Sequential(*pieces)
    x, target = spec.data()
    loss = spec.loss(model(x), target)
    loss.backward()
    return {"loss": loss.item(), "grads": {name: p.grad for name, p in model.named_parameters()}}
