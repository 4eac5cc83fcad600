"""Per-layer cost of a model, measured on this CPU: time and memory, the input to stage balancing.

    from parallel_lab import models
from parallel_lab.pipeline.activation_bytes import ByteCounter
    from parallel_lab.pipeline import profile
    cfg = models.GPTConfig(layers=4)
    records = profile.profile_layers(models.GPT(cfg), models.random_tokens(cfg, batch=4)[0])
    [r.name for r in records]      # ['0', '1', ..., '5']: embed, blocks 0..3, head
    records[1].as_dict()           # name, type, params, param_bytes, fwd_s, bwd_s, activation_bytes

Each layer of ``model.as_sequential()`` (or of an ``nn.Sequential``, or of a list of modules applied
in order) runs forward and backward on the output of the previous one:

- **time**: thread CPU time (``time.thread_time``) of the forward and of the backward, median of
  ``repeats`` runs after a warm-up, with torch limited to one thread -- one simulated device, as on
  a rank. CPU time, not wall time, so other processes on the machine do not inflate it.
- **memory**: parameter bytes, and the bytes of the tensors autograd saves for the backward pass,
  counted by ``activation_bytes.ByteCounter`` (a storage once, parameters left out), as a pipeline
  stage's worker counts what it stashes per micro-batch until its backward.

Used by ``parallel_lab.pipeline.partition.by_time`` to cut stages of equal time (the DeepSpeed "profile"
method that DeepSpeed itself leaves unimplemented).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import nn

from parallel_lab import models
from parallel_lab.pipeline.activation_bytes import ByteCounter


@dataclass(frozen=True)
class LayerProfile:
    """One layer's measured costs. Times in seconds (CPU time of one thread), sizes in bytes."""

    index: int
    name: str
    type: str
    params: int
    param_bytes: int
    fwd_s: float
    bwd_s: float
    activation_bytes: int

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    def as_dict(self) -> dict:
        return asdict(self)


def layers_of(model) -> list[tuple[str, nn.Module]]:
    """``[(name, module), ...]`` in execution order: ``model.as_sequential()`` when the model has it
    (the course GPT), the children of an ``nn.Sequential``, or a list of modules as given."""
    if hasattr(model, "as_sequential"):
        model = model.as_sequential()
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
    if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
        return [(str(i), m) for i, m in enumerate(model)]
    raise TypeError(f"cannot list the layers of {type(model).__name__}: pass a model with "
                    f"as_sequential(), an nn.Sequential or a list of modules applied in order")


@contextmanager
def one_thread():
    """Run torch on one intra-op thread inside the block (a rank is one device); restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def saved_activation_bytes(module: nn.Module, *inputs) -> int:
    """Bytes saved for backward by one forward of ``module`` on ``inputs`` (parameters excluded)."""
    with ByteCounter(exclude=module.parameters()).saved() as counter:
        module(*inputs)
    return counter.total


def _fresh(x):
    """A leaf copy of the previous layer's output, so that each layer's backward stops at its input."""
    x = x.detach()
    return x.requires_grad_() if x.is_floating_point() else x


def _time_layer(layer, x, upstream, repeats, warmup):
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        x_in = _fresh(x)
        start = time.thread_time()
        y = layer(x_in)
        mid = time.thread_time()
        y.backward(upstream)
        end = time.thread_time()
        if i >= warmup:
            fwd.append(mid - start)
            bwd.append(end - mid)
    layer.zero_grad(set_to_none=True)
    return statistics.median(fwd), statistics.median(bwd)


def profile_layers(model, inputs, repeats: int = 5, warmup: int = 1, seed: int = 0) -> list[LayerProfile]:
    """Measure every layer of ``model`` (see ``layers_of``) on ``inputs``: token ids ``(B, T)`` for the
    GPT, activations ``(B, ..., H)`` otherwise. The upstream gradient of each layer is a fixed
    random tensor of its output's shape. Returns one ``LayerProfile`` per layer, in order."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats {repeats}, warmup {warmup}")
    gen = torch.Generator().manual_seed(seed)
    records, x = [], inputs
    with one_thread():
        for index, (name, layer) in enumerate(layers_of(model)):
            params = list(layer.parameters())
            with ByteCounter(exclude=params).saved() as saved:
                y = layer(_fresh(x))
            upstream = torch.randn(y.shape, generator=gen, dtype=y.dtype)
            fwd_s, bwd_s = _time_layer(layer, x, upstream, repeats, warmup)
            records.append(LayerProfile(
                index=index, name=name, type=type(layer).__name__,
                params=sum(p.numel() for p in params),
                param_bytes=sum(p.numel() * p.element_size() for p in params),
                fwd_s=fwd_s, bwd_s=bwd_s, activation_bytes=saved.total))
            x = y.detach()
    return records


def profile_course_model(kind: str = "gpt", batch: int = 4, repeats: int = 5, **config) -> list[LayerProfile]:
    """Profile a course model from ``parallel_lab.models``: ``"gpt"`` (``GPTConfig(**config)``) or
    ``"mlp"`` (an ``nn.Sequential`` of ``layers`` MLP blocks of width ``hidden``)."""
    if kind == "gpt":
        cfg = models.GPTConfig(**config)
        return profile_layers(models.GPT(cfg), models.random_tokens(cfg, batch)[0], repeats=repeats)
    if kind == "mlp":
        hidden, layers = config.get("hidden", 64), config.get("layers", 4)
        model = nn.Sequential(*(models.MLP(hidden, seed=i) for i in range(layers)))
        x = torch.randn(batch, hidden, generator=torch.Generator().manual_seed(0))
        return profile_layers(model, x, repeats=repeats)
    raise ValueError(f"unknown model kind {kind!r}; choose 'gpt' or 'mlp'")
