"""Running one pipeline stage on its rank: F, B, I and W, and what they keep in between.

    worker = StageWorker(stages[0], spec.loss, n_microbatches=8, first=True, last=False)
    out = worker.act("F", 0, x0)           # F of microbatch 0; its activations stay in ``stash``
    dx = worker.act("B", 0, grad)          # B of microbatch 0 (or "I" then "W")
    worker.memory()                        # (micro-batches stashed, held for W, bytes they keep)

The executor (``pipeline.executor``) decides when each action runs and moves tensors between ranks;
the worker does the arithmetic of one stage with autograd and keeps its own memory accounting: while
``counting`` (the executor turns it on for a recorded step), ``bytes[j]`` is what microbatch j keeps,
counted by ``activation_bytes.ByteCounter``. ``pipeline.chain.ChainWorker`` runs the same arithmetic
by hand for a chain of Linear and GELU modules (the course MLP; ``chain.make_worker`` picks).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import nn

from parallel_lab.pipeline.activation_bytes import ByteCounter, tensor_bytes

# Lessons 07 and 08 print these (``i18n.source``): their docstrings and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("StageWorker.forward", "StageWorker._take", "StageWorker.input_grad", "StageWorker.weight_grad",
                    "_weight_grads")


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
    bytes[j]: while ``counting``, the bytes microbatch j keeps: after F its input and everything
              autograd saved (parameters excluded); after I what W needs (``held_bytes``)
    w_bytes:  over the I's since ``start_step``: [bytes kept for W, bytes of the graph before]

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
        self.counting, self.bytes, self.w_bytes = False, {}, [0, 0]
        self._counter: ByteCounter | None = None  # while an action counts: what it keeps outside autograd goes here
        self._taps: list | None = None
        self.uses_taps, self.generic = split or fuse, False
        self._register_taps()

    def start_step(self, counting: bool) -> None:
        """A new step: count bytes in it or not, and the I's tally (``w_bytes``) from zero."""
        self.counting, self.w_bytes = counting, [0, 0]

    def act(self, kind: str, j: int, data=None, target=None):
        """Run action ``kind`` (F, B, I or W) of microbatch j on ``data`` (F: the stage input; B, I:
        the output gradient, None on the last stage). F returns the output to send (the scaled loss
        on the last stage), B and I the input gradient (None on the first stage), W None."""
        if kind == "W":
            self.weight_grad(j)
            self.bytes.pop(j, None)
            return None
        counter = ByteCounter(self.params) if self.counting and (kind == "F" or self.recompute) else None
        self._counter = counter
        try:
            with counter.saved() if counter else nullcontext():
                out = self.forward(j, data, target) if kind == "F" else \
                    self.backward(j, data) if kind == "B" else self.input_grad(j, data)
        finally:
            self._counter = None
        if self.counting:
            self._count(kind, j, counter)
        return out

    def _count(self, kind: str, j: int, counter: ByteCounter | None) -> None:
        if kind == "F":  # the graph (or, under recompute, nothing) and the input kept beside it
            counter.add(self.stash[j][0])
            self.bytes[j] = counter.total
        elif kind == "B":
            self.bytes.pop(j, None)
        else:  # I: from here on j keeps only what W needs, M_W of its M_B (simulate.Timeline)
            graph = counter.total if counter else self.bytes.get(j, 0)  # under recompute: the second forward's
            self.bytes[j] = self.held_bytes(j, graph)
            self.w_bytes[0] += self.bytes[j]
            self.w_bytes[1] += graph

    def memory(self) -> tuple[int, int, int]:
        """(micro-batches stashed, micro-batches held for their W, bytes they keep while counting)."""
        return len(self.stash), len(self.held), sum(self.bytes.values())

    def _register_taps(self) -> None:
        for m in self.module.modules() if self.uses_taps else ():
            params = list(m.parameters(recurse=False))
            if params:
                linear = m if self.fuse and isinstance(m, nn.Linear) else None
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

    def held_bytes(self, j: int, graph: int = 0) -> int:
        """Bytes microbatch j keeps between its I and W: the taps' gradients and the Linear inputs
        (and, when a tap needs autograd, the whole ``graph`` of its forward, in bytes)."""
        taps, grads = self.held[j]
        kept = list(grads) + [t.input for t in taps if t.input is not None]
        return tensor_bytes(kept) + (graph if self.generic else 0)


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
