"""The same rank functions on real machines, under torchrun (NCCL on GPUs, gloo on CPUs).

    torchrun --standalone --nproc-per-node 4 -m parallel_lab.runtime.torchrun parallel_lab.runtime.demos:hello

``init_from_env`` is the only place, besides the launcher's own ranks, that sets up
torch.distributed, and with ``session`` the only code that reads torchrun's RANK / WORLD_SIZE /
LOCAL_RANK. ``report`` is the common tail of every torchrun entry (this module's ``main`` and
``parallel-lab run 3d``): gather every rank's result, print one JSON object on rank 0, leave together.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from parallel_lab.runtime import commlog
from parallel_lab.runtime.allocator import keep_freed_memory
from parallel_lab.runtime.rank_process import backend_and_device


def under_torchrun(environ=None) -> bool:
    """True when torchrun (or any launcher setting RANK and WORLD_SIZE) started this process."""
    environ = os.environ if environ is None else environ
    return "RANK" in environ and "WORLD_SIZE" in environ


def world_size_from_env() -> int:
    return int(os.environ["WORLD_SIZE"])


def init_from_env(timeout: float = 300.0):
    """Initialise torch.distributed from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK...).
    Returns ``(rank, world_size, device)``."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend, device = backend_and_device(local_world, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    keep_freed_memory()  # as the launcher's ranks do
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    commlog.install()
    return rank, world_size, device


@contextmanager
def session(timeout: float = 300.0):
    """``init_from_env`` and, whatever happens, ``destroy_process_group`` at the end."""
    try:
        yield init_from_env(timeout)
    finally:
        dist.destroy_process_group()


def report(result, summarize=None) -> None:
    """Gather every rank's ``result``; rank 0 prints one JSON object on stdout,
    ``summarize(gathered)`` or ``{"world_size", "results"}``; then all ranks leave together (a
    barrier, so that no rank tears down while another still talks)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        out = summarize(gathered) if summarize else {"world_size": len(gathered), "results": gathered}
        print(json.dumps(out, default=str), flush=True)
    dist.barrier()


def main(argv=None) -> int:
    """``torchrun --standalone --nproc-per-node N -m parallel_lab.runtime.torchrun MODULE:FUNCTION [JSON_KWARGS]``:
    every rank runs ``FUNCTION(**JSON_KWARGS)``; rank 0 prints ``{"world_size", "results"}``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0
    module, _, name = argv[0].partition(":")
    fn = getattr(importlib.import_module(module), name)
    kwargs = json.loads(argv[1]) if len(argv) > 1 else {}
    with session():
        report(fn(**kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
