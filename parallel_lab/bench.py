"""``parallel-lab bench``: our pieces side by side with the peers, in one run, reported as ratios.

Each suite returns rows ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (ratio = ours / peer, so
below 1 is faster). Absolute times depend on the machine; the ratios are what we quote. Tests never
time anything: benchmarks live here.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from datetime import timedelta

import psutil


def row(name, ours_s, peer, peer_s, **extra) -> dict:
    return {"name": name, "ours_s": ours_s, "peer": peer, "peer_s": peer_s,
            "ratio": ours_s / peer_s if peer_s else None, **extra}


def _median_time(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# ----------------------------------------------------------------------------------------------
# Launcher: our persistent forkserver pool against torch.multiprocessing.spawn, the usual way.


def _spawned_rank(rank, world_size, port):
    """What torch.multiprocessing.spawn users write: init, one all-reduce, tear down."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()


def _spawn_once(world_size: int) -> None:
    import socket

    import torch.multiprocessing as tmp

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
    import subprocess

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True)
    return time.perf_counter() - start


def bench_launcher(world_size: int = 4, repeats: int = 3) -> list[dict]:
    from parallel_lab import demos, launcher

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
    warm = _median_time(lambda: launcher.run(demos.rank_id, world_size), 30)
    me = psutil.Process()
    pss = _pss_bytes([me.pid] + [p.pid for p in me.children(recursive=True)])
    torch_import = statistics.median(_fresh_import_torch() for _ in range(repeats))
    spawn = _median_time(lambda: _spawn_once(world_size), max(1, repeats - 1))
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


# ----------------------------------------------------------------------------------------------
# Collectives: the lesson's ring all-reduce against gloo's own.


def bench_collectives(world_size: int = 4, n_bytes: int = 4 * 2**20, repeats: int = 7) -> list[dict]:
    from parallel_lab import collectives, launcher

    rows = []
    for size in (64 * 2**10, n_bytes):
        gloo = launcher.run(collectives.time_all_reduce, world_size, args=([size], repeats))[0][0]
        ring = launcher.run(collectives.time_all_reduce, world_size, args=([size], repeats),
                            kwargs={"algorithm": "ring"})[0][0]
        rows.append(row(f"ring all-reduce (lesson 01), {world_size} ranks, {size // 2**10} KB", ring,
                        "gloo all_reduce", gloo))
    return rows


# ----------------------------------------------------------------------------------------------
# Simulator: it sits behind sliders, so it must answer at the course's caps (p = 64, m = 512).
# No peer simulates schedules; the reference is the pure-Python list scheduler it replaced
# (tests/test_simulate.py keeps an independent one for correctness).


def bench_simulator(stages: int = 64, microbatches: int = 512, repeats: int = 5) -> list[dict]:
    from parallel_lab.schedules import build
    from parallel_lab.simulate import simulate

    rows = []
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"):
        schedule = build(name, stages, microbatches)
        actions = sum(map(len, schedule.ranks))
        rows.append(row(f"simulate {name}, p={stages}, m={microbatches} ({actions:,} actions)",
                        _median_time(lambda: simulate(schedule), repeats), "-", None))
        rows.append(row(f"build {name}, p={stages}, m={microbatches}",
                        _median_time(lambda: build(name, stages, microbatches), repeats), "-", None))
    return rows


SUITES = {
    "launcher": "parallel_lab.bench:bench_launcher",
    "collectives": "parallel_lab.bench:bench_collectives",
    "simulator": "parallel_lab.bench:bench_simulator",
    "tensor": "parallel_lab.tensor.bench:bench_tensor",
    "pipeline": "parallel_lab.pipeline.bench:bench_pipeline",
}


def run_suites(names) -> list[dict]:
    rows = []
    for name in names or SUITES:
        if name not in SUITES:
            raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(SUITES)}")
        module, _, fn = SUITES[name].partition(":")
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        for result in getattr(importlib.import_module(module), fn)():
            rows.append({"suite": name, **result})
    return rows


def format_table(rows) -> str:
    lines = ["| suite | benchmark | ours | peer | peer time | ratio |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = r.get("unit")
        ours = f"{r['ours_s']:.2f} {unit}" if unit else f"{r['ours_s'] * 1e3:.2f} ms"
        peer = "-" if r["peer_s"] is None else f"{r['peer_s'] * 1e3:.2f} ms"
        ratio = "-" if r["peer_s"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['suite']} | {r['name']} | {ours} | {r['peer']} | {peer} | {ratio} |")
    return "\n".join(lines)
