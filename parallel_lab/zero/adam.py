"""Adam on a flat tensor (a rank's shard, or a whole flat unit): ``torch.optim.Adam``'s arithmetic.

    state = AdamState.zeros_like(shard)
    adam_step(shard, grad_shard, state, lr=1e-2)

Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1. Every operation is
element-wise, so a rank that holds 1/N of the parameters, their gradients and both moments updates
exactly its slice of what one process would (Rajbhandari et al. 2020, "ZeRO", section 5.1). The
operations and their order are those of ``torch.optim.Adam`` with its defaults (no weight decay, no
amsgrad, the single-tensor path PyTorch takes on the CPU), so a single-process reference can use
``torch.optim.Adam`` itself and agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdamState:
    """The two moments of one flat tensor (``exp_avg`` m and ``exp_avg_sq`` v) and the step count."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: int = 0

    @classmethod
    def zeros_like(cls, t: torch.Tensor) -> "AdamState":
        return cls(torch.zeros_like(t), torch.zeros_like(t))


@torch.no_grad()
def adam_step(param: torch.Tensor, grad: torch.Tensor, state: AdamState, lr: float = 1e-3,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam update of ``param`` in place from ``grad`` (same shape), advancing ``state``."""
    beta1, beta2 = betas
    state.step += 1
    m, v = state.exp_avg, state.exp_avg_sq
    m.lerp_(grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
    step = float(state.step)  # torch keeps the step as a float tensor
    step_size = lr / (1 - beta1**step)
    denom = (v.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    param.addcdiv_(m, denom, value=-step_size)
