"""Data parallelism: every replica computes gradients on its slice of the batch, then they average.

    loss = cross_entropy(model(idx[my_rows]), targets[my_rows])   # this replica's batch / dp rows
    loss.backward()
    allreduce_gradients(model.parameters(), groups.dp_group)      # now every replica holds the
                                                                  # gradient of the whole batch

Averaging the replicas' gradients of their mean losses gives exactly the gradient of the mean loss
over the whole batch (equal slices), so data parallelism changes no number -- only who computes it.

One all-reduce per parameter would pay the latency α of the α-β model (``parallel_lab.runtime.collectives``)
hundreds of times; PyTorch DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating
Data Parallel Training") therefore packs gradients into **buckets** of about ``bucket_bytes``
(default 25 MiB, DDP's ``bucket_cap_mb``), in reverse parameter order -- the order backward produces
them, so a bucket can go as soon as it is full while backward goes on. Each bucket is flattened into
one tensor, all-reduced over the data-parallel group (``runtime.transport.all_reduce``, the
call tensor parallelism makes: through shared memory when it is small and the group on one host),
divided by its size and copied back.

The group is passed explicitly (``Groups.dp_group`` from ``parallel_lab.runtime.mesh``): with tensor or
pipeline parallelism too, a rank averages only with the replicas that hold the same shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.runtime import commlog, transport
from parallel_lab.runtime.mesh import ParallelDims, build_groups

# Lesson 09 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("allreduce_gradients",)
DEFAULT_BUCKET_BYTES = 25 * 2**20


def buckets(params, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Indices (into ``list(params)``) of the parameters in each bucket: reverse order, a new bucket
    when adding the next gradient would pass ``bucket_bytes`` or change the dtype. A parameter larger
    than ``bucket_bytes`` gets a bucket of its own. Parameters without ``requires_grad`` are skipped.
    Pure: the same on every rank for the same model, which is what keeps the all-reduces matched."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, got bucket_bytes {bucket_bytes!r}")
    params = list(params)
    out, size, dtype = [], 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        if not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        if not out or p.dtype != dtype or size + nbytes > bucket_bytes:
            out.append([])
            size, dtype = 0, p.dtype
        out[-1].append(i)
        size += nbytes
    return out


def allreduce_gradients(params, group=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Average ``.grad`` of ``params`` over the ranks of ``group``, bucket by bucket (flatten ->
    all_reduce -> divide by the group size -> unflatten). Every rank of the group must call it with
    the same parameters. Returns the number of buckets (= the number of all-reduces)."""
    params = list(params)
    plan = buckets(params, bucket_bytes)
    missing = [i for bucket in plan for i in bucket if params[i].grad is None]
    if missing:
        raise ValueError(f"parameters {missing[:5]} require grad but have no .grad: run backward first "
                         f"(every replica must contribute every gradient, or the all-reduces mismatch)")
    size = dist.get_world_size(group)
    for bucket in plan:
        grads = [params[i].grad for i in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one message instead of len(bucket)
        transport.all_reduce(flat, group)  # on one host a small bucket goes through shared memory
        flat.div_(size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return len(plan)


def batch_slice(batch: int, dp_rank: int, dp: int) -> slice:
    """Rows of a global batch that data-parallel rank ``dp_rank`` of ``dp`` trains on."""
    if batch % dp:
        raise ValueError(f"batch {batch} % dp {dp} != 0: replicas need equal slices for the average "
                         f"of their mean losses to be the mean loss of the batch")
    per = batch // dp
    return slice(dp_rank * per, (dp_rank + 1) * per)


SMALL_GPT = models.GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=2)


def check_against_reference(dp: int, tp: int = 1, batch: int = 4, bucket_bytes: int = 4096,
                            config: models.GPTConfig = SMALL_GPT, seed: int = 0) -> dict:
    """Rank function: data-parallel training step of the tiny GPT in fp64 over ``dp`` replicas (the
    world is dp x tp; the tp ranks of one replica here simply repeat its work, which checks that the
    all-reduce stays inside the explicit dp group), compared with the whole batch on one process.

    Returns ``max_grad_diff`` over every parameter, ``buckets`` and ``all_reduce_calls`` (counted by
    ``commlog``), and the names of the parameters checked.
    """
    dims = ParallelDims(dp=dp, pp=1, tp=tp)
    groups = build_groups(dims)
    try:
        idx, targets = models.random_tokens(config, batch, seed=seed + 1)
        reference = models.GPT(config, seed=seed).double()
        models.cross_entropy(reference(idx), targets).backward()

        model = models.GPT(config, seed=seed).double()
        rows = batch_slice(batch, groups.dp_rank, dp)
        models.cross_entropy(model(idx[rows]), targets[rows]).backward()
        with commlog.recording() as log:
            n_buckets = allreduce_gradients(model.parameters(), groups.dp_group, bucket_bytes)
        ref = dict(reference.named_parameters())
        diffs = {name: (p.grad - ref[name].grad).abs().max().item() for name, p in model.named_parameters()}
        return {"rank": groups.rank, "max_grad_diff": max(diffs.values()), "checked": sorted(diffs),
                "buckets": n_buckets, "all_reduce_calls": log.calls("all_reduce"),
                "expected_buckets": len(buckets(model.parameters(), bucket_bytes))}
    finally:
        dist.barrier()
        groups.destroy()
