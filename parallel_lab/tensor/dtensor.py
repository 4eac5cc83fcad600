"""The peer: PyTorch's own tensor parallelism (DTensor ``parallelize_module``) on the same dense
modules, to check ours against (``check_against_dtensor``) and to time ours beside it
(``parallel_lab.bench.tensor``)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from parallel_lab import models
from parallel_lab.tensor.plan import parallelize
from parallel_lab.tensor.run import DEFAULT_CONFIG, max_diff


def dtensor_parallelize(dense: nn.Module, tp: int) -> nn.Module:
    """A copy of ``dense`` (``models.MLP`` or ``models.Block``) split by PyTorch's tensor parallelism
    on a 1-D CPU mesh of ``tp`` ranks: Colwise for fc1 / q / k / v, Rowwise for fc2 / proj."""
    mesh = init_device_mesh("cpu", (tp,))
    mlp = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if isinstance(dense, models.MLP):
        plan = mlp
    else:  # models.Block: attention's view(B, T, -1, head_dim) then sees this rank's heads
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.proj": RowwiseParallel(), **{f"mlp.{k}": v for k, v in mlp.items()}}
    return parallelize_module(copy.deepcopy(dense), mesh, plan)


def _local(tensor):
    """A DTensor's local shard (a plain tensor is its own)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def check_against_dtensor(config=DEFAULT_CONFIG, dtype=torch.float64, seed: int = 0, batch: int = 2) -> dict:
    """Rank function: our MLP (``MLP_PLAN``) against PyTorch's DTensor tensor parallelism
    (``parallelize_module`` with ColwiseParallel / RowwiseParallel) on the same dense weights.
    Returns the largest differences of the outputs, every local weight gradient and the input's."""
    dense = models.MLP(config.hidden, seed).to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((batch, config.seq, config.hidden), generator=gen).to(dtype)
    grad = torch.randn(x.shape, generator=gen).to(dtype)
    runs = {}
    for name, model in (("ours", parallelize(dense)), ("dtensor", dtensor_parallelize(dense, dist.get_world_size()))):
        xi = x.clone().requires_grad_()
        out = model(xi)
        out.backward(grad)
        grads = {n: _local(p.grad) for n, p in model.named_parameters()}
        runs[name] = (out.detach(), grads, xi.grad)
    (out, grads, x_grad), (peer_out, peer_grads, peer_x_grad) = runs["ours"], runs["dtensor"]
    return {
        "output_diff": max_diff(out, peer_out),
        "grad_diffs": {n: max_diff(g, peer_grads[n]) for n, g in grads.items()},
        "input_grad_diff": max_diff(x_grad, peer_x_grad),
    }
