"""Running one pipeline stage on its rank: F, B, I and W, and what they keep in between.

    worker = StageWorker(stages[0], spec.loss, n_microbatches=8, first=True, last=False)
    out = worker.forward(0, x0)            # F of microbatch 0; its activations stay in ``stash``
    dx = worker.backward(0, grad)          # B of microbatch 0 (or input_grad then weight_grad)

The executor (``pipeline.executor``) decides when each action runs and moves tensors between ranks;
the worker does the arithmetic of one stage and its memory accounting.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Tap(NamedTuple):
    """A module that owns parameters, as one forward saw it: its ``output`` (where I stops) and, for
    a Linear, its ``input``, which is all W needs there (dW = dY^T X, db = sum of dY)."""

    params: list
    output: torch.Tensor
    linear: nn.Linear | None
    input: torch.Tensor | None


class StageWorker:
    """Runs F, B, I, W of one model stage and keeps what they need between them.

    stash[j]: microbatch j's (input, output, taps) from its F until its B or I (the simulator's
              activation count); with recompute only (input, target)
    held[j]:  the taps and their output gradients from I until W

    With ``fuse`` (default) a backward is I then W at once, and W adds a Linear's weight gradient
    straight into ``.grad`` with one ``addmm_`` (Megatron-LM's gradient-accumulation fusion)
    instead of autograd's separate product and sum; other modules' parameters (LayerNorm,
    Embedding) get theirs from autograd, from the tap's output back to its own parameters only.
    """

    def __init__(self, stage, loss_fn, n_microbatches: int, first: bool, last: bool,
                 recompute: bool = False, split: bool = False, fuse: bool = True):
        self.index, self.module, self.names = stage.index, stage.module, stage.names
        self.params = list(self.module.parameters())
        self.loss_fn, self.scale = loss_fn, 1.0 / n_microbatches
        self.first, self.last, self.recompute, self.fuse = first, last, recompute, fuse
        self.stash: dict[int, tuple] = {}
        self.held: dict[int, tuple] = {}
        self.saved_bytes: dict[int, int] = {}  # microbatch -> bytes its activations take (recording only)
        self._taps: list | None = None
        self.uses_taps, self.generic = split or fuse, False
        for m in self.module.modules() if self.uses_taps else ():
            params = list(m.parameters(recurse=False))
            if params:
                linear = m if fuse and isinstance(m, nn.Linear) else None
                self.generic |= linear is None  # W needs this tap's graph: I must keep it
                m.register_forward_hook(self._tap_hook(params, linear))

    def _tap_hook(self, params, linear):
        def hook(module, inputs, output):
            if self._taps is not None and output.requires_grad:
                self._taps.append(Tap(params, output, linear, None if linear is None else inputs[0]))
        return hook

    def _forward(self, x, target):
        self._taps = [] if self.uses_taps else None
        out = self.module(x)
        taps, self._taps = self._taps, None
        return (self.loss_fn(out, target) * self.scale if self.last else out), taps

    def forward(self, j: int, x, target=None):
        """F of microbatch j: returns the output to send (detached), or the scaled loss on the last stage."""
        if not self.first:
            x.requires_grad_()
        if self.recompute:
            with torch.no_grad():
                out, _ = self._forward(x, target)
            self.stash[j] = (x, target)
            return out
        out, taps = self._forward(x, target)
        self.stash[j] = (x, out, taps)
        return out.detach()

    def _take(self, j: int):
        """Microbatch j's (input, output, taps), running its forward again under recompute."""
        saved = self.stash.pop(j)
        if not self.recompute:
            return saved
        x, target = saved
        return (x, *self._forward(x, target))

    def _input_grads(self, j: int, grad):
        """One autograd pass from the output to the stage input and every tap output; it computes
        no weight gradient. Returns (input gradient or None, taps, their output gradients)."""
        x, out, taps = self._take(j)
        wanted = ([] if self.first else [x]) + [t.output for t in taps]
        grads = torch.autograd.grad(out, wanted, grad, retain_graph=self.generic, allow_unused=True)
        return (None, taps, grads) if self.first else (grads[0], taps, grads[1:])

    def backward(self, j: int, grad):
        """B: full backward of microbatch j; returns the input gradient (None on the first stage)."""
        if not self.fuse:  # the textbook way: autograd accumulates into every .grad
            x, out, _ = self._take(j)
            torch.autograd.backward(out, grad)
            return None if self.first else x.grad
        dx, taps, grads = self._input_grads(j, grad)
        _weight_grads(taps, grads)
        return dx

    def input_grad(self, j: int, grad):
        """I: gradient w.r.t. the stage input, now; what W needs is kept in ``held``."""
        dx, taps, grads = self._input_grads(j, grad)
        self.held[j] = (taps, grads)
        return dx

    def weight_grad(self, j: int) -> None:
        """W: the weight gradients of microbatch j, accumulated into .grad."""
        _weight_grads(*self.held.pop(j))

    def held_bytes(self, j: int) -> int:
        """Bytes microbatch j keeps between its I and W: the taps' gradients and the Linear inputs
        (or, when a tap needs autograd, the whole graph of its forward)."""
        taps, grads = self.held[j]
        kept = list(grads) + [t.input for t in taps if t.input is not None]
        return _storage_bytes(kept) + (self.saved_bytes.get(j, 0) if self.generic else 0)

    def stashed(self) -> int:
        return len(self.stash)


def _weight_grads(taps: list[Tap], grads) -> None:
    for tap, grad in zip(taps, grads):
        if grad is None:
            continue
        if tap.linear is None:  # only this tap's own parameters: nothing flows on to other layers
            torch.autograd.backward(tap.output, grad, inputs=tap.params)
            continue
        with torch.no_grad():
            dy = grad.reshape(-1, grad.shape[-1])  # (rows, out)
            x = tap.input.reshape(-1, tap.input.shape[-1])  # (rows, in)
            weight, bias = tap.linear.weight, tap.linear.bias
            if weight.grad is None:
                weight.grad = dy.t() @ x  # (out, in)
            else:
                weight.grad.addmm_(dy.t(), x)
            if bias is not None:
                bias.grad = dy.sum(0) if bias.grad is None else bias.grad.add_(dy.sum(0))


def _storage_bytes(tensors) -> int:
    """Bytes the tensors hold: each its own size (a micro-batch slice counts its slice, not the whole
    batch's storage), views of one storage counted once at the largest."""
    sizes: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            ptr = t.untyped_storage().data_ptr()
            sizes[ptr] = max(sizes.get(ptr, 0), t.numel() * t.element_size())
    return sum(sizes.values())
