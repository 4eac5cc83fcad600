"""How fast the grader grades a class: ``parallel-lab bench grading`` grades ``copies`` lesson-01
submissions (the lesson's solution in the answer cell, each student's own correct quiz sheet),
sandboxed, ``jobs`` at a time, and reports the seconds per submission and submissions per minute
(the whole run: grading, the gradebook, the exports, the similarity report and the feedback). No
peer grades these notebooks; the aim is at most 2 s per submission on 2 cores with the sandbox on."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import nbformat

from parallel_lab.bench.measure import row
from parallel_lab.course.grading.gradebook import grade
from parallel_lab.course.grading.reference import ROOT
from parallel_lab.course.grading.sandbox import Sandbox
from parallel_lab.course.quiz.bank import load
from parallel_lab.course.quiz.variant import variant

LESSON = "01_ranks_and_collectives"
MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.M)


def solution_cell() -> str:
    """Lesson 01's answer cell with its solution, read from the lesson's source."""
    source = (ROOT / "lessons" / "src" / f"{LESSON}.py").read_text(encoding="utf-8")
    cell = source.split('# %% tags=["answer:ring-all-reduce"]\n', 1)[1].split("\n# %%", 1)[0]
    return MARKERS.sub("", cell)


def right_sheet(student: str) -> str:
    answers = {}
    for item in variant(load("01"), student).items:
        if item.kind == "numeric":
            answers[item.id] = item.value()
        else:
            keys = sorted(item.correct_keys())
            answers[item.id] = keys[0] if item.kind == "single" else keys
    return f"my_answers = {answers!r}"


def submission(reference: Path, student: str):
    nb = nbformat.read(reference, as_version=4)
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "answer:ring-all-reduce" in tags:
            cell.source = solution_cell()
        elif "answer:quiz:01" in tags:
            cell.source = right_sheet(student)
    return nb


def bench_grading(copies: int = 100, jobs: int = 2) -> list[dict]:
    reference = ROOT / "lessons" / f"{LESSON}.ipynb"
    sandbox = Sandbox.detect()
    with tempfile.TemporaryDirectory(prefix="parallel-lab-bench-grading-") as tmp:
        root = Path(tmp) / "submissions"
        for k in range(copies):
            (root / f"student{k:03d}").mkdir(parents=True)
            nbformat.write(submission(reference, f"student{k:03d}"), root / f"student{k:03d}" / f"{LESSON}.ipynb")
        start = time.perf_counter()
        rows = grade([root], Path(tmp) / "grades.csv", [reference], jobs=jobs, sandbox=sandbox)
        seconds = time.perf_counter() - start
    passed = sum(r.passed for r in rows) / max(1, len(rows))
    return [row(f"grade {copies} lesson-01 submissions ({sandbox.kind}, {jobs} jobs), per submission",
                seconds / copies, "-", None, checks_passed=passed, per_minute=round(60 * copies / seconds, 1))]
