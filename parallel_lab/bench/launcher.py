"""Our launcher (persistent forkserver pool) against ``torch.multiprocessing.spawn``, the usual way."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from parallel_lab.bench.measure import median_time, row
from parallel_lab.runtime import demos, launcher


def _spawned_rank(rank, world_size, port):
    """What torch.multiprocessing.spawn users write: init, one all-reduce, tear down."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()


def _spawn_once(world_size: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.start_processes(_spawned_rank, args=(world_size, port), nprocs=world_size, join=True,
                        start_method="spawn")


def _pss_bytes(pids) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _fresh_import_torch() -> float:
    """Seconds for a new interpreter to import torch: what any first rank start pays somewhere."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True)
    return time.perf_counter() - start


def bench_launcher(world_size: int = 4, repeats: int = 3) -> list[dict]:
    cold, first = [], []
    for _ in range(repeats):
        launcher.shutdown()  # no ranks and no forkserver: a fresh kernel
        start = time.perf_counter()
        launcher.run(demos.hello, world_size)
        first.append(time.perf_counter() - start)
        launcher.shutdown()
        launcher.warm(wait=True)  # what notebook.setup() starts while the student reads
        start = time.perf_counter()
        launcher.run(demos.hello, world_size)
        cold.append(time.perf_counter() - start)
    warm = median_time(lambda: launcher.run(demos.rank_id, world_size), 30)
    me = psutil.Process()
    pss = _pss_bytes([me.pid] + [p.pid for p in me.children(recursive=True)])
    torch_import = statistics.median(_fresh_import_torch() for _ in range(repeats))
    spawn = median_time(lambda: _spawn_once(world_size), max(1, repeats - 1))
    peer = "torch.multiprocessing.spawn + init_process_group"
    return [
        row(f"pool cold start, {world_size} ranks (forkserver started by setup())", statistics.median(cold),
            peer, spawn),
        row(f"first run in a fresh kernel, {world_size} ranks (forkserver imports torch first)",
            statistics.median(first), peer, spawn),
        row("import torch in a new interpreter (part of either)", torch_import, "-", None),
        row(f"warm re-run of a trivial function, {world_size} ranks", warm, peer, spawn),
        row(f"memory: this process + forkserver + {world_size} ready ranks (PSS, GB)", pss / 1e9, "-", None,
            unit="GB"),
    ]
