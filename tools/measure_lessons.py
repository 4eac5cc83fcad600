#!/usr/bin/env python3
"""Run each lesson top to bottom as a student would and check it fits the course's budgets.

    .venv/bin/python tools/measure_lessons.py                      # every lessons/NN_*.ipynb
    .venv/bin/python tools/measure_lessons.py 00 01                # lessons whose name starts with 00 or 01
    .venv/bin/python tools/measure_lessons.py --markdown artifacts/budgets.md --json artifacts/budgets.json
    .venv/bin/python tools/measure_lessons.py --lang zh-Hant        # the Traditional Chinese edition (lessons/zh-Hant/)

Each notebook is executed with nbclient in a fresh kernel (nothing is written back), with the
course's settings (one thread per process). Wall time counts from the kernel's start to the last
cell's end. Memory is the total PSS (proportional set size: shared pages split between the processes
sharing them) of the kernel and all its descendants (forkserver and rank processes), sampled every
0.2 s; the peak is reported. ``--source`` builds the notebooks from lessons/src/*.py instead of the
committed ones.

Budgets (a Binder pod: 1 CPU, 1-2 GB; the development machine: 2 cores): each lesson at most 90 s,
the whole course at most 8 minutes, peak memory at most 1.5 GB (10^9 bytes). Prints a markdown table
and exits 1 when a budget is broken.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from notebook_client import notebook_client  # tools/, beside this file: nbclient that cannot miss a kernel reply

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
GB = 1e9
BUDGETS = {"lesson_s": 90.0, "course_s": 8 * 60.0, "peak_gb": 1.5}


class PeakPss:
    """Samples the total PSS of a process and its descendants in a thread; ``peak`` in bytes."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak, self.samples = interval, 0, 0
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, pid: int) -> None:
        self._pid = pid
        if not self._thread.is_alive():
            self._thread.start()

    def sample(self) -> int:
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for process in processes:
            try:
                total += process.memory_full_info().pss
            except psutil.Error:  # exited between listing and reading
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.sample())
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def load(path: Path, from_source: bool, lang: str = "en") -> nbformat.NotebookNode:
    if not from_source:
        return nbformat.read(path, as_version=4)
    sys.path.insert(0, str(ROOT / "tools"))
    from build_lessons import notebook  # the same cells as the build (its edition's language)

    return notebook(LESSONS / "src" / f"{path.stem}.py", "student", lang)


def measure(path: Path, from_source: bool = False, timeout: int = 600, lang: str = "en") -> dict:
    """Execute one lesson in a fresh kernel, in its edition's folder; seconds, peak PSS, and the
    slowest cell."""
    notebook = load(path, from_source, lang)
    client = notebook_client(notebook, timeout=timeout, resources={"metadata": {"path": str(path.parent)}})
    sampler = PeakPss()
    cells: list[tuple[float, str]] = []
    start = time.perf_counter()
    try:
        with client.setup_kernel():
            sampler.watch(client.km.provisioner.process.pid)
            for index, cell in enumerate(notebook.cells):
                began = time.perf_counter()
                client.execute_cell(cell, index)
                if cell.cell_type == "code":
                    cells.append((time.perf_counter() - began, cell.get("id", str(index))))
            sampler.peak = max(sampler.peak, sampler.sample())  # the last state, before shutdown
    finally:
        seconds = time.perf_counter() - start
        sampler.stop()
    slowest = max(cells, default=(0.0, "-"))
    return {"lesson": path.name, "seconds": round(seconds, 1), "peak_pss_gb": round(sampler.peak / GB, 3),
            "slowest_cell": slowest[1], "slowest_cell_s": round(slowest[0], 1),
            "pss_samples": sampler.samples}


def check(rows: list[dict]) -> list[str]:
    """Broken budgets, one line each (empty when all fit)."""
    broken = []
    for row in rows:
        if row["seconds"] > BUDGETS["lesson_s"]:
            broken.append(f"{row['lesson']}: {row['seconds']} s > {BUDGETS['lesson_s']:g} s per lesson")
        if row["peak_pss_gb"] > BUDGETS["peak_gb"]:
            broken.append(f"{row['lesson']}: peak {row['peak_pss_gb']} GB > {BUDGETS['peak_gb']:g} GB")
    total = sum(row["seconds"] for row in rows)
    if total > BUDGETS["course_s"]:
        broken.append(f"course: {total:.1f} s > {BUDGETS['course_s']:g} s in all")
    return broken


def table(rows: list[dict]) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {platform.node() or 'this machine'} "
             f"({os.cpu_count()} cores) with `tools/measure_lessons.py`; budgets: "
             f"{BUDGETS['lesson_s']:g} s per lesson, {BUDGETS['course_s'] / 60:g} min in all, "
             f"{BUDGETS['peak_gb']:g} GB peak PSS (kernel + ranks).", "",
             "| lesson | seconds | peak PSS (GB) | slowest cell (s) |", "|---|---:|---:|---|"]
    for row in rows:
        lines.append(f"| {row['lesson']} | {row['seconds']:.1f} | {row['peak_pss_gb']:.2f} | "
                     f"{row['slowest_cell']} ({row['slowest_cell_s']:.1f}) |")
    total = sum(row["seconds"] for row in rows)
    peak = max((row["peak_pss_gb"] for row in rows), default=0.0)
    lines.append(f"| **course** | **{total:.1f}** | **{peak:.2f}** | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="only lessons whose file name starts with one of these")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--json", type=Path, help="write the rows, totals and budgets as JSON to this file")
    parser.add_argument("--source", action="store_true", help="build from lessons/src/*.py instead")
    parser.add_argument("--lang", default="en", choices=("en", "zh-Hant"),
                        help="the edition: lessons/ (en) or lessons/zh-Hant/")
    args = parser.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = "1"  # as course.py and binder/start do
    folder = LESSONS if args.lang == "en" else LESSONS / args.lang
    lessons = [p for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))
               if not args.prefixes or any(p.name.startswith(prefix) for prefix in args.prefixes)]
    if not lessons:
        print(f"no lesson matches {args.prefixes}", file=sys.stderr)
        return 2
    rows = []
    for path in lessons:
        print(f"[measure] {path.name} ...", file=sys.stderr, flush=True)
        rows.append(measure(path, args.source, lang=args.lang))
        print(f"[measure] {path.name}: {rows[-1]['seconds']} s, {rows[-1]['peak_pss_gb']} GB",
              file=sys.stderr, flush=True)
    text, broken = table(rows), check(rows)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "rows": rows, "total_s": round(sum(r["seconds"] for r in rows), 1),
            "peak_pss_gb": max(r["peak_pss_gb"] for r in rows), "budgets": BUDGETS,
            "cores": os.cpu_count(), "broken": broken}, indent=2) + "\n")
    for line in broken:
        print(f"[measure] over budget: {line}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
