"""The communication of tensor parallelism: conjugate pairs of collectives as autograd functions.

Shoeybi et al. 2019, "Megatron-LM" (section 3): a layer split across ``p`` ranks needs only two
operators, each the other's conjugate:

- **f** ``copy_to_tensor_parallel_region``: identity forward, all-reduce backward. It sits where a
  replicated activation enters a split layer: every rank uses all of ``X``, so the gradient of ``X``
  is the sum of the ranks' partial gradients.
- **g** ``reduce_from_tensor_parallel_region``: all-reduce forward, identity backward. It sits where
  the split layer's partial sums leave it.

Splitting and gathering along the last (hidden) dimension are the other pair. Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models" (sequence parallelism), keep
the LayerNorm/dropout regions split along the sequence and replace each all-reduce by the two halves
it is made of: g becomes a reduce-scatter (and its backward an all-gather) and f an all-gather (and
its backward a reduce-scatter); same volume, activations ``p`` times smaller between the layers.

Each op has three layers, as in Megatron-LM's ``core/tensor_parallel/mappings.py``: a private
helper doing one collective, a tiny ``torch.autograd.Function`` and a snake_case wrapper. Every op
takes an explicit ``group`` (a ProcessGroup, or None for the whole world) and is free when the group
has one rank. Collectives are called as ``dist.<name>`` at call time, so ``parallel_lab.runtime.commlog``
can count them; the all-reduce goes through ``parallel_lab.runtime.transport.all_reduce``, which
sums a small tensor through shared memory on one host, or one shot on gloo beyond 2 ranks (one step
instead of a ring's 2(p-1)), counted as the one all_reduce it is. Sequence ops take the sequence dimension ``dim`` (1 in
``models``' ``(B, T, H)`` layout; Megatron's ``(T, B, H)`` uses 0, which needs no reordering copy around the
collective).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.runtime import transport

# Lesson 02 prints f (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("_CopyToTensorParallelRegion",)

# ----------------------------------------------------------------------------------------------
# Helpers: one collective (or none) each.


def _all_reduce(x, group):
    """Sum ``x`` over the group, in place; returns ``x`` (``transport.all_reduce``: the fastest way
    this machine has for its size)."""
    return transport.all_reduce(x, group)


def _split(x, dim, group):
    """This rank's chunk of ``x`` along ``dim`` (a view: no copy, no communication)."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    size = x.shape[dim]
    if size % world:
        raise ValueError(f"dimension {dim} of size {size} is not divisible by the group size {world}")
    return x.narrow(dim, dist.get_rank(group) * (size // world), size // world)


def _all_gather(x, dim, group):
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    dim %= x.dim()
    out = x.new_empty((world * x.shape[0], *x.shape[1:]))  # the ranks' x, stacked along dim 0
    dist.all_gather_single(out, x.contiguous(), group=group)
    if dim == 0:
        return out
    # (p*n0, ...) -> (p, n0, ...) -> (..., p, n, ...) -> (..., p*n, ...): the one copy
    return out.unflatten(0, (world, -1)).movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter(x, dim, group):
    """Sum ``x`` over the group and keep this rank's chunk along ``dim``."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    dim %= x.dim()
    if x.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not divisible by the group size {world}")
    # (..., p*n, ...) -> (p, ..., n, ...): the collective hands out contiguous chunks of dim 0
    chunks = x.unflatten(dim, (world, -1)).movedim(dim, 0).contiguous()  # no copy when dim == 0
    out = x.new_empty(chunks.shape[1:])
    dist.reduce_scatter_single(out, chunks.flatten(0, 1), group=group)
    return out


# ----------------------------------------------------------------------------------------------
# Autograd functions: forward and backward are the two halves of a conjugate pair.


class _CopyToTensorParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        # Reduce a copy: autograd may hand this very gradient tensor to a sibling branch too
        # (an addition passes one tensor to both of its inputs), which must not see it summed.
        return _all_reduce(grad.clone(memory_format=torch.contiguous_format), ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        # In place: x is a fresh partial sum (a matmul output nothing else saved); mark_dirty makes
        # autograd refuse the rare caller for whom that is not true instead of computing garbage.
        ctx.mark_dirty(x)
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTensorParallelRegion(torch.autograd.Function):
    """Split the last dimension forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class _GatherFromTensorParallelRegion(torch.autograd.Function):
    """All-gather the last dimension forward, split it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Split the sequence forward, all-gather it backward (enter the sequence-parallel region)."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather the sequence forward, reduce-scatter backward: SP's f, before a column split.

    The backward sums because the gathered activation feeds a split layer whose ranks each produce
    a partial gradient of it (Megatron's ``tensor_parallel_output_grad=True``, the only case here).
    """

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter the sequence forward, all-gather backward: SP's g, after a row split."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


# ----------------------------------------------------------------------------------------------
# The public ops. Shapes: X is (..., H) replicated; X_i is this rank's (..., H/p) slice.


def copy_to_tensor_parallel_region(x, group=None):
    """f. ``X -> X`` (replicated); backward sums the ranks' gradients (all-reduce)."""
    return _CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x, group=None):
    """g. Partial sums ``(..., H)`` -> their sum over ranks ``(..., H)``, in place; backward identity."""
    return _ReduceFromTensorParallelRegion.apply(x, group)


def scatter_to_tensor_parallel_region(x, group=None):
    """``(..., H)`` -> this rank's ``(..., H/p)`` slice; backward all-gathers."""
    return _ScatterToTensorParallelRegion.apply(x, group)


def gather_from_tensor_parallel_region(x, group=None):
    """``(..., H/p)`` slices -> ``(..., H)`` (all-gather); backward keeps this rank's slice."""
    return _GatherFromTensorParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x, group=None, dim=1):
    """``(B, T, H)`` -> this rank's ``(B, T/p, H)``; backward all-gathers."""
    return _ScatterToSequenceParallelRegion.apply(x, group, dim)


def gather_from_sequence_parallel_region(x, group=None, dim=1):
    """``(B, T/p, H)`` -> ``(B, T, H)`` (all-gather); backward reduce-scatters. SP's f."""
    return _GatherFromSequenceParallelRegion.apply(x, group, dim)


def reduce_scatter_to_sequence_parallel_region(x, group=None, dim=1):
    """Partial sums ``(B, T, H)`` -> this rank's summed ``(B, T/p, H)``; backward all-gathers. SP's g."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group, dim)
