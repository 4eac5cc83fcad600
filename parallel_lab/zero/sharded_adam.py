"""ZeRO-1 for any list of parameters: Adam whose moments live only for this rank's slice.

    opt = ShardedAdam(params, group=dp_group, lr=1e-2)   # params: what this rank trains (a pipeline
    loss.backward()                                      #   stage's TP shard, in 3D)
    opt.step()       # reduce-scatter the gradients, Adam on my slice, all-gather the parameters
    opt.zero_grad()

Rajbhandari et al. 2020, "ZeRO", section 5.1 (P_os): the optimizer state is partitioned over the N
data-parallel ranks; each updates its 1/N of the parameters from its 1/N of the averaged gradient
and the updated slices are all-gathered, 2Ψ moved per step like the all-reduce it replaces (section
7.2.1). ``zero.engine.Zero`` does all four stages for the course GPT with per-unit hooks; this is
the hook-free stage 1 that needs nothing of the model, which is what 3D training uses
(``parallel3d.train3d``, ``Config(zero=1)``): its pipeline executor accumulates gradients over
micro-batches (and sets ``.grad`` to None between steps), so only the step itself communicates.

The parameters are copied into one flat fp buffer per dtype at each step (gradients likewise);
the copies are the price of leaving the model and its executor untouched. The arithmetic is
``zero.adam.adam_step``'s, torch.optim.Adam's, so the result equals one process to rounding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.zero.adam import AdamState, adam_step


class ShardedAdam:
    """Adam over ``params`` with its moments sharded over ``group`` (ZeRO-1). Every rank of the group
    must hold the same parameter shapes in the same order (data-parallel replicas do)."""

    def __init__(self, params, group=None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ShardedAdam needs at least one parameter that requires grad")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"ShardedAdam keeps one flat buffer: parameters mix dtypes {sorted(map(str, dtypes))}")
        self.group, self.lr, self.betas, self.eps = group, lr, betas, eps
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.n)  # ceil: the flat buffer is padded to N slices
        self.lo, self.hi = self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel
        first = self.params[0]
        self.like = dict(dtype=first.dtype, device=first.device)
        self.state = AdamState.zeros_like(torch.empty(self.shard_numel, **self.like))

    def _flat(self, tensors) -> torch.Tensor:
        flat = torch.zeros(self.shard_numel * self.n, **self.like)
        offset = 0
        for t in tensors:
            flat[offset:offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
        return flat

    @torch.no_grad()
    def step(self) -> None:
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise ValueError(f"parameters {missing[:5]} have no .grad: run backward first (every replica "
                             f"must contribute every gradient, or the reduce-scatter mismatches)")
        grad_shard = torch.empty(self.shard_numel, **self.like)
        dist.reduce_scatter_single(grad_shard, self._flat(p.grad for p in self.params), group=self.group)
        grad_shard.div_(self.n)  # the sum over replicas -> the gradient of the whole batch's mean loss
        flat = self._flat(self.params)
        shard = flat[self.lo:self.hi]
        adam_step(shard, grad_shard, self.state, self.lr, self.betas, self.eps)
        dist.all_gather_single(flat, shard.clone(), group=self.group)
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: both moments of its slice (1/N of Adam's 2Ψ)."""
        return sum(t.numel() * t.element_size() for t in (self.state.exp_avg, self.state.exp_avg_sq))
