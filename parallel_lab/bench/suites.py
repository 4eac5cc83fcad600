"""``parallel-lab bench``: our pieces side by side with the peers, in one run, reported as ratios.

Each suite returns rows ``{"name", "ours_s", "peer", "peer_s", "ratio"}`` (ratio = ours / peer, so
below 1 is faster). Absolute times depend on the machine; the ratios are what we quote. Rows that run
on several ranks (tensor, pipeline) also carry ``limit_s``, the shortest wall time this machine
could do their work in (its CPU seconds over the cores the ranks get), and ``limit_ratio`` = ours /
limit (1 would be the machine's limit). Tests never time anything: benchmarks live here.
"""

from __future__ import annotations

import sys

from parallel_lab.bench.collectives import bench_collectives
from parallel_lab.bench.context import bench_context
from parallel_lab.bench.grading import bench_grading
from parallel_lab.bench.launcher import bench_launcher
from parallel_lab.bench.pipeline import bench_pipeline
from parallel_lab.bench.search import bench_search, gap_table
from parallel_lab.bench.simulator import bench_simulator
from parallel_lab.bench.tensor import bench_tensor
from parallel_lab.bench.zero import bench_zero

SUITES = {
    "launcher": bench_launcher,
    "collectives": bench_collectives,
    "simulator": bench_simulator,
    "search": bench_search,
    "search-gap": gap_table,  # CP-SAT on 54 small cases: minutes (ON_REQUEST)
    "tensor": bench_tensor,
    "pipeline": bench_pipeline,
    "grading": bench_grading,
    "zero": bench_zero,
    "context": bench_context,
}


ON_REQUEST = ("search-gap",)  # left out of "all": they run only when named


def run_suites(names) -> list[dict]:
    rows = []
    for name in names or [n for n in SUITES if n not in ON_REQUEST]:
        if name not in SUITES:
            raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(SUITES)}")
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        for result in SUITES[name]():
            rows.append({"suite": name, **result})
    return rows


def format_table(rows) -> str:
    lines = ["| suite | benchmark | ours | peer | peer time | ratio | limit | ours / limit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unit = r.get("unit")
        ours = f"{r['ours_s']:.2f} {unit}" if unit else f"{r['ours_s'] * 1e3:.2f} ms"
        peer = ("-" if r["peer_s"] is None else f"{r['peer_s']:.2f} {unit}" if unit
                else f"{r['peer_s'] * 1e3:.2f} ms")
        ratio = "-" if r["peer_s"] is None else f"{r['ratio']:.2f}"
        limit = "-" if r.get("limit_s") is None else f"{r['limit_s'] * 1e3:.2f} ms"
        over = "-" if r.get("limit_ratio") is None else f"{r['limit_ratio']:.2f}"
        lines.append(f"| {r['suite']} | {r['name']} | {ours} | {r['peer']} | {peer} | {ratio} | {limit} | {over} |")
    return "\n".join(lines)
