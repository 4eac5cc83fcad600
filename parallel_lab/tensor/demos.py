"""Rank functions that lesson 02 (lessons/02_tensor_parallelism.ipynb) runs and shows.

They are short on purpose: the lesson prints them with ``inspect.getsource``. Each builds the dense
layer from a seed, so every rank holds the same dense weights and input and can compare its own
piece of the result with the dense one (fp64: the only differences are rounding, ~1e-15).

    from parallel_lab.runtime import launcher
    from parallel_lab.tensor import demos as lesson
    launcher.run(lesson.column_and_row, 2)      # per rank: shapes, collectives, max difference
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab import models
from parallel_lab.runtime import commlog
from parallel_lab.tensor.layers import ColumnParallelLinear, RowParallelLinear
from parallel_lab.tensor.run import DEFAULT_CONFIG, check_case, reference

TOLERANCE = 1e-12  # fp64: a correct split differs from the dense layer by rounding only
# Lesson 02 prints this function (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("column_and_row",)


def column_and_row(seed: int = 0, batch: int = 2, tokens: int = 24, hidden: int = 192) -> dict:
    """One dense ``nn.Linear`` per split, cut for this rank; returns, per split, this rank's share of
    ``W`` (math orientation ``Y = X·W``: ``W`` is ``weight.T``), the shape of its output, the
    collectives it made and the largest difference from the dense output."""
    rank, tp = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(seed + 1)
    out = {}
    for split in ("column", "column + all-gather", "row"):
        n_in, n_out = (hidden, 2 * hidden) if split != "row" else (2 * hidden, hidden)
        dense = models.init_weights(nn.Linear(n_in, n_out), seed).double()  # same on every rank
        x = torch.randn(batch, tokens, n_in, generator=gen, dtype=torch.float64)  # same on every rank
        if split == "row":
            layer = RowParallelLinear.from_dense(dense)  # rows of W: weight[:, rank's slice]
            x_in = x.chunk(tp, dim=-1)[rank]  # this rank's slice of X's last dimension
        else:
            layer = ColumnParallelLinear.from_dense(dense, gather_output=split != "column")
            x_in = x  # every rank uses all of X
        with torch.no_grad(), commlog.recording() as log:
            y_mine = layer(x_in)
        y = dense(x).detach()
        expected = y.chunk(tp, dim=-1)[rank] if split == "column" else y  # Y_r, or all of Y
        out[split] = {
            "W": tuple(dense.weight.T.shape), "W_r": tuple(layer.weight.T.shape),
            "Y_r": tuple(y_mine.shape), "collectives": log.as_dict(),
            "max_diff": (y_mine - expected).abs().max().item(),
        }
    return out


_groups: dict = {}


def tp_group(tp: int):
    """This rank's tensor-parallel group when the world is cut into groups of ``tp`` consecutive
    ranks (``{0, 1}``, ``{2, 3}`` for tp 2 on 4 ranks). Every rank creates every group, in the same
    order, once per rank process."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % tp:
        raise ValueError(f"world size {world} is not divisible by tp {tp}")
    if (world, tp) not in _groups:
        _groups[world, tp] = [dist.new_group(list(range(first, first + tp))) for first in range(0, world, tp)]
    return _groups[world, tp][rank // tp]


def block_runs(tps=(2, 4), sequence_parallel=(False,), config=DEFAULT_CONFIG, batch: int = 2) -> list[dict]:
    """One transformer block (``models.Block``) on tensor-parallel groups of each size in ``tps``,
    with and without sequence parallelism: per run, the collectives of the forward and the backward
    (and of the sequence-parallel gradient sum), the shapes in and out of the block on this rank,
    the bytes autograd saved for the backward on this rank, and whether output and every gradient
    match the dense block."""
    ref = reference("block", config, batch=batch)
    runs = []
    for tp in tps:
        for sp in sequence_parallel:
            r = check_case("block", config, sequence_parallel=sp, batch=batch, ref=ref, group=tp_group(tp))
            runs.append({
                "tp": tp, "sequence_parallel": sp, "forward": r["forward"], "backward": r["backward"],
                "grad_sync": r["grad_sync"], "output_shape": tuple(r["output"].shape),
                "saved_bytes": r["saved_bytes"],
                "matches": r["output_diff"] < TOLERANCE and r["grad_diff"] < TOLERANCE,
            })
    return runs
