"""Running one pipeline stage on its rank: F, B, I and W, and what they keep in between.

    worker = StageWorker(stages[0], spec.loss, n_microbatches=8, first=True, last=False)
    out = worker.forward(0, x0)            # F of microbatch 0; its activations stay in ``stash``
    dx = worker.backward(0, grad)          # B of microbatch 0 (or input_grad then weight_grad)

The executor (``pipeline.executor``) decides when each action runs and moves tensors between ranks;
the worker does the arithmetic of one stage and its memory accounting. ``make_worker`` picks the
worker for a stage: a ``ChainWorker`` for a chain of Linear and GELU modules (the course MLP), which
runs the same operations by hand instead of through autograd, else a ``StageWorker``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
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
        self.count_kept = None  # set by the executor while it counts saved bytes (ChainWorker reports to it)
        self.uses_taps, self.generic = split or fuse, False
        self._register_taps()

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

    def held_bytes(self, j: int) -> int:
        """Bytes microbatch j keeps between its I and W: the taps' gradients and the Linear inputs
        (or, when a tap needs autograd, the whole graph of its forward)."""
        taps, grads = self.held[j]
        kept = list(grads) + [t.input for t in taps if t.input is not None]
        return _storage_bytes(kept) + (self.saved_bytes.get(j, 0) if self.generic else 0)

    def stashed(self) -> int:
        return len(self.stash)


class ChainWorker(StageWorker):
    """A StageWorker for a stage that applies nn.Linear and nn.GELU modules one after another (the
    course MLP; ``linear_gelu_chain``), with fused weight gradients: F, B, I and W by hand.

    The same operations autograd runs on the same tensors (``F.linear``, ``F.gelu``, ``gelu_backward``,
    ``dY @ W`` for the input gradient, ``_weight_grads`` for W), hence the same numbers, without
    building a graph in F and walking it in B, which on small micro-batches costs about as much as
    the arithmetic. It keeps what autograd would save -- each module's input -- and reports those
    tensors to ``count_kept`` when the executor counts bytes. Only the last stage's loss goes
    through autograd (any ``loss_fn``): B starts from its gradient w.r.t. the chain's output.
    """

    def __init__(self, stage, loss_fn, n_microbatches: int, first: bool, last: bool, chain: list,
                 recompute: bool = False, split: bool = False):
        self.chain = chain
        super().__init__(stage, loss_fn, n_microbatches, first, last, recompute, split, fuse=True)
        self.uses_taps = False
        self._tap_params = [list(m.parameters(recurse=False)) for m in chain]

    def _register_taps(self) -> None:  # no hooks: _forward keeps what W needs itself
        pass

    def _forward(self, x, target):
        """The chain's output (or the scaled loss) and ``saved``: each module's input, and on the last
        stage the chain's output last. Without grad mode (recompute's first forward) it keeps nothing."""
        keep = torch.is_grad_enabled()
        saved = []
        with torch.no_grad():
            a = x
            for m in self.chain:
                if keep:
                    saved.append(a)
                a = F.linear(a, m.weight, m.bias) if isinstance(m, nn.Linear) else F.gelu(a, approximate=m.approximate)
        if keep and self.count_kept is not None:
            for t in saved:
                self.count_kept(t)
        if not self.last:
            return a, saved
        if keep:
            a.requires_grad_()
            saved.append(a)
        return self.loss_fn(a, target) * self.scale, saved

    def _input_grads(self, j: int, grad):
        """The chain walked backwards from the output gradient (the last stage: the loss's): GELU's
        ``gelu_backward``, a Linear's ``dY @ W``; no ``dX`` for the first stage's input. Returns
        (input gradient or None, a Tap per Linear, their output gradients) for ``_weight_grads``."""
        x, out, saved = self._take(j)
        if self.last:
            (grad,) = torch.autograd.grad(out, saved[-1])
        taps, grads = [], []
        with torch.no_grad():
            for i in range(len(self.chain) - 1, -1, -1):
                m = self.chain[i]
                if isinstance(m, nn.Linear):
                    taps.append(Tap(self._tap_params[i], None, m, saved[i]))
                    grads.append(grad)
                    grad = None if i == 0 and self.first else grad @ m.weight
                else:
                    grad = torch.ops.aten.gelu_backward(grad, saved[i], approximate=m.approximate)
        return (None if self.first else grad), taps, grads


def linear_gelu_chain(module: nn.Module) -> list | None:
    """The modules ``module`` applies one after another when it is nn.Sequential's (nested) of
    nn.Linear and nn.GELU only, none with hooks; else None."""
    if type(module) is not nn.Sequential or module._forward_hooks or module._forward_pre_hooks:
        return None
    chain = []
    for m in module:
        if type(m) is nn.Sequential:
            inner = linear_gelu_chain(m)
            if inner is None:
                return None
            chain += inner
        elif type(m) in (nn.Linear, nn.GELU) and not (m._forward_hooks or m._forward_pre_hooks
                                                       or m._backward_hooks or m._backward_pre_hooks):
            chain.append(m)
        else:
            return None
    return chain or None


def make_worker(stage, loss_fn, n_microbatches: int, first: bool, last: bool, recompute: bool = False,
                split: bool = False, fuse: bool = True) -> StageWorker:
    """The worker of ``stage`` (arguments as StageWorker's): a ChainWorker when the weight gradients
    are fused and the stage is a chain of Linear and GELU modules, else a StageWorker."""
    chain = linear_gelu_chain(stage.module) if fuse else None
    no_global_hooks = not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
    if chain and no_global_hooks:
        return ChainWorker(stage, loss_fn, n_microbatches, first, last, chain, recompute, split)
    return StageWorker(stage, loss_fn, n_microbatches, first, last, recompute, split, fuse)


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
