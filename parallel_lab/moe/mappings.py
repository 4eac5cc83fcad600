"""The communication of expert parallelism: the all-to-all, as an autograd function.

Tokens go to their experts' ranks with one all-to-all (dispatch) and come back with another
(combine), as in GShard (Lepikhin et al. 2020) and Megatron-LM's ``MoEAlltoAllTokenDispatcher``. The
backward of an all-to-all is the reverse all-to-all: the gradient of the row a rank received goes
back to the rank that sent it, so the split sizes swap. Same three layers as
``parallel_lab.tensor.mappings``: a one-collective helper, a tiny ``autograd.Function``, a wrapper.
Collectives are called as ``dist.<name>`` at call time, so that ``runtime.commlog`` counts them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_to_all(x, output_splits: list[int], input_splits: list[int], group):
    """Rows ``x`` ``(sum(input_splits), ...)``: the first ``input_splits[0]`` go to rank 0, the next
    to rank 1, ...; returns the rows received, ``(sum(output_splits), ...)``, in rank order."""
    if dist.get_world_size(group) == 1:
        return x
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group
        return _all_to_all(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.input_splits, ctx.output_splits, ctx.group), None, None, None


def all_to_all(x, output_splits: list[int], input_splits: list[int], group=None):
    """All-to-all of the rows of ``x`` (``input_splits[r]`` rows to rank r; ``output_splits[r]`` rows
    come from rank r); backward, the reverse all-to-all."""
    return _AllToAll.apply(x, list(output_splits), list(input_splits), group)
