"""The course MLP's stages, run by hand: F, B, I and W of a chain of Linear and GELU modules.

    make_worker(stage, spec.loss, 8, first=True, last=False)   # ChainWorker for the MLP, else StageWorker

``worker.StageWorker`` runs a stage with autograd: F builds a graph, B (or I) walks it. On the small
micro-batches of the course that bookkeeping costs about as much as the arithmetic, and it makes an
action's cost depend on what ran before it, so a stage that is a chain of Linear and GELU modules
(the course MLP: lessons 03-08, ``parallel-lab run pipeline``, ``bench pipeline``) runs in
``ChainWorker`` instead: the same aten operations on the same tensors in the same order
(``F.linear``, ``F.gelu``, ``gelu_backward``, ``dY @ W`` for the input gradient,
``worker._weight_grads`` for W), hence the same numbers to the bit and the same counted bytes
(tests/test_bench.py), without a graph. Lesson 07 shows it as what it is. Every other stage (the
GPT's), and any stage with ``fuse=False``, runs ``StageWorker``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parallel_lab.pipeline.worker import StageWorker, Tap

# Lesson 07 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("ChainWorker._input_grads",)


class ChainWorker(StageWorker):
    """A StageWorker for a stage that applies nn.Linear and nn.GELU modules one after another (the
    course MLP; ``linear_gelu_chain``), with fused weight gradients: F, B, I and W by hand.

    It keeps what autograd would save -- each module's input -- and counts those tensors while
    ``counting``. Only the last stage's loss goes through autograd (any ``loss_fn``): B starts from
    its gradient w.r.t. the chain's output. Same arguments as StageWorker; raises ValueError for a
    stage that is not such a chain, or for ``fuse=False`` (``make_worker`` picks).
    """

    def __init__(self, stage, loss_fn, n_microbatches: int, first: bool, last: bool,
                 recompute: bool = False, split: bool = False, fuse: bool = True):
        chain = linear_gelu_chain(stage.module) if fuse else None
        global_hooks = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
        if not chain or global_hooks:
            raise ValueError(f"ChainWorker runs a stage of nn.Linear and nn.GELU modules only, none with hooks, "
                             f"with fused weight gradients; stage {stage.index} is not one (fuse {fuse})")
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
        if keep and self._counter is not None:  # what autograd would have saved, counted the same way
            for t in saved:
                self._counter.add(t)
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
    """The worker of ``stage`` (the Executor's default ``worker`` hook; arguments as StageWorker's):
    a ChainWorker when the weight gradients are fused and the stage is a chain of Linear and GELU
    modules (with no global module hooks), else a StageWorker."""
    chain = linear_gelu_chain(stage.module) if fuse else None
    global_hooks = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    kind = ChainWorker if chain and not global_hooks else StageWorker
    return kind(stage, loss_fn, n_microbatches, first, last, recompute, split, fuse)
