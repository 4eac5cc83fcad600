"""The memory model against the course GPT's real tensors (lesson 15, lessons/15_cost_model.ipynb):
parameters per pipeline stage, and the bytes one transformer block saves for backward."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from parallel_lab import models
from parallel_lab.pipeline.activation_bytes import ByteCounter
from parallel_lab.pipeline.stages import ModelSpec, cut
from parallel_lab.planning import memory, memory_model


def param_check(config=None, pps=(1, 2, 4)) -> list[dict]:
    """Parameters per pipeline stage: ``memory_model`` against the modules of the course GPT cut by
    ``pipeline.stages.cut`` (embedding on the first stage, head on the last). One row per stage."""
    spec = ModelSpec("gpt", **(config or dict(hidden=32, layers=4, heads=2, seq=8, vocab=96)))
    model = memory.ModelConfig("course GPT", spec.layers, spec.hidden, spec.heads, spec.vocab, spec.seq)
    rows = []
    for pp in pps:
        for stage in cut(spec, pp):
            real = sum(p.numel() for p in stage.module.parameters())
            rows.append({"pp": pp, "stage": stage.index, "model": memory_model.stage_params(model, pp, 1, stage.index),
                         "real": real})
    return rows


def activation_check(config=None, batch: int = 3) -> list[dict]:
    """Bytes one transformer block saves for backward: ``memory_model.activation_bytes_per_layer``
    (fp32 values, no dropout) against the tensors autograd really saves (counted by
    ``pipeline.activation_bytes.ByteCounter``), for the three recomputation modes:

    - none: attention computed the plain way (``SDPBackend.MATH``): the s x s scores are saved;
    - selective: PyTorch's fused attention on the CPU, which recomputes the scores in backward --
      selective recomputation by construction -- and saves a log-sum-exp per head and token;
    - full: ``torch.utils.checkpoint`` keeps only the block's input.

    ``stats`` is what the paper's formula leaves out: each LayerNorm's mean and 1/std per token
    (2 x 2 values) and the fused kernel's log-sum-exp (one value per head and token)."""
    cfg = models.GPTConfig(**(config or dict(vocab=96, seq=32, hidden=64, heads=4, layers=1)))
    block = models.GPT(cfg).blocks[0]
    x = torch.randn(batch, cfg.seq, cfg.hidden, requires_grad=True, generator=torch.Generator().manual_seed(0))
    tokens = cfg.seq * batch

    def measure(run):
        with ByteCounter(exclude=block.parameters()).saved() as saved:
            run()
        return saved.total

    def plain():
        with sdpa_kernel(SDPBackend.MATH):
            block(x)

    measured = {"none": measure(plain), "selective": measure(lambda: block(x)),
                "full": measure(lambda: checkpoint(block, x, use_reentrant=False))}
    stats = {"none": 4 * tokens * 4, "selective": (4 + cfg.heads) * tokens * 4, "full": 0}
    rows = []
    for mode in memory_model.RECOMPUTE:
        formula = memory_model.activation_bytes_per_layer(cfg.seq, batch, cfg.hidden, cfg.heads,
                                                          recompute=mode, value_bytes=4, dropout=False)
        rows.append({"recompute": mode, "formula": int(formula), "measured": measured[mode], "stats": stats[mode]})
    return rows
