"""Grade one student notebook with nbval against a reference lesson's check cells.

    parallel-lab grade submissions/*/01_ranks_and_collectives.ipynb --out grades.csv

**Graded cells.** The reference lesson marks each check cell with tags (the percent-format source
writes them as ``# %% tags=["check:ring-all-reduce", "points:2"]``): ``check:ID`` names the
exercise in the gradebook, ``points:N`` its weight (default 1). Cell metadata
``{"parallel_lab": {"check": "ID", "points": N}}`` works too. A quiz check is ``check:quiz:LESSON``.

**How a submission is graded** (each one in isolation, in a scratch folder):

1. The submission is read as a notebook; anything else fails every check ("not a notebook").
2. Each reference check cell is found in the submission by its tag, else by its cell id. A missing
   cell fails its check ("deleted"); a cell whose source differs from the reference's fails too
   ("edited") and runs as an ordinary cell.
3. A copy is run by ``python -m pytest --nbval-lax`` in a subprocess (its own kernel, this Python):
   every cell runs in order, and only the check cells are compared (tag ``nbval-check-output``),
   with the reference's source and the reference's outputs. A quiz check expects the quiz's pass
   line (``parallel_lab.course.quiz.check.passing_verdict``): the lesson itself stores the verdict of an
   empty answer sheet, so the answer key never sits in it. Outputs are sanitised with
   ``lessons/sanitize.cfg``.
4. Limits: ``--cell-timeout`` per cell (nbval interrupts the kernel and goes on), and
   ``--timeout`` per notebook (the whole process tree is killed; checks not reached fail).
   A dead kernel is noticed within a second, not at the cell timeout.

The gradebook has one row per (submission, check): ``student, lesson, exercise, passed, points,
max_points, reason``; the feedback folder one Markdown file per student saying what failed and why.

Trust: grading runs the students' code. Run it as an unprivileged user or in a container. The
check cells are restored from the reference, but a determined student could still fake a verdict
from another cell (e.g. by replacing ``parallel_lab.exercises.check_ring_all_reduce``); nbval
grading proves that the reference's checks printed the reference's verdicts, nothing more.

The bottom of this module is a small pytest plugin (``-p parallel_lab.course.grading``) that runs inside
the nbval subprocess: it logs each cell's result and actual outputs (JSON lines, flushed, so a
killed run keeps what it finished) and notices a dead kernel quickly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from parallel_lab.course.grading.plugin import LOG_ENV, first_line, output_text
from parallel_lab.course.grading.reference import DEFAULT_SANITIZE, Check, Reference, check_tags


@dataclass(frozen=True)
class Row:
    """One gradebook row; ``detail`` (expected and actual output) goes to the feedback file only."""

    student: str
    lesson: str
    exercise: str
    passed: bool
    points: float
    max_points: float
    reason: str
    submission: str = ""
    detail: str = ""

    def csv_row(self) -> list:
        return [self.student, self.lesson, self.exercise, "true" if self.passed else "false",
                f"{self.points:g}", f"{self.max_points:g}", self.reason]


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def match_checks(nb, checks) -> dict:
    """check id -> index of its cell in ``nb``, or a reason string (deleted / edited)."""
    by_tag = {check_tags(c)[0]: i for i, c in enumerate(nb.cells) if check_tags(c)[0]}
    by_id = {c.get("id"): i for i, c in enumerate(nb.cells) if c.get("id")}
    found = {}
    for check in checks:
        index = by_tag.get(check.id, by_id.get(check.cell_id) if check.cell_id else None)
        if index is None or nb.cells[index].cell_type != "code":
            found[check.id] = "check cell deleted"
        elif _norm(nb.cells[index].source) != _norm(check.source):
            found[check.id] = "check cell edited (its code must stay as in the lesson)"
        else:
            found[check.id] = index
    return found


def build_test_notebook(nb, checks, found) -> tuple[object, dict]:
    """The notebook nbval runs: the submission's cells in order, its check cells restored from the
    reference (source, expected outputs, ``nbval-check-output``), every other cell unchecked.
    Returns it and {code cell number: check id}."""
    graded = {index: check for check in checks if isinstance(index := found[check.id], int)}
    cells, numbers, code_number = [], {}, 0
    for index, cell in enumerate(nb.cells):
        cell = nbformat.from_dict(json.loads(json.dumps(cell)))
        if cell.cell_type == "code":
            tags = [t for t in cell.metadata.get("tags", []) if isinstance(t, str)
                    and not t.startswith(("nbval-", "raises-exception", "check:", "points:"))]
            if index in graded:
                check = graded[index]
                cell.source, cell.outputs, cell.execution_count = check.source, list(check.outputs), 1
                tags.append("nbval-check-output")
                numbers[code_number] = check.id
            else:
                cell.outputs, cell.execution_count = [], None
            cell.metadata = {"tags": tags} if tags else {}
            code_number += 1
        cells.append(cell)
    test = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}})
    return test, numbers


def run_nbval(test_nb, workdir: Path, cell_timeout: float, notebook_timeout: float,
              sanitize: Path | None) -> tuple[dict, bool, str]:
    """Run nbval on ``test_nb`` in ``workdir``. Returns ({code cell: log record}, whether the
    notebook limit was hit, the tail of pytest's output)."""
    nb_path, log = workdir / "submission.ipynb", workdir / "cells.jsonl"
    nbformat.write(test_nb, nb_path)
    (workdir / "pytest.ini").write_text("[pytest]\naddopts =\n")
    (workdir / "home").mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pytest", nb_path.name, "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout", f"{cell_timeout:g}",
               "--nbval-kernel-startup-timeout", f"{max(1, min(60, notebook_timeout)):g}",
               "-c", "pytest.ini", "--rootdir", str(workdir), "-p", "no:cacheprovider",
               "-p", "parallel_lab.course.grading.plugin", "-q", "--color=no"]
    if sanitize:
        command += ["--nbval-sanitize-with", str(sanitize)]
    env = {**os.environ, LOG_ENV: str(log), "PARALLEL_LAB_HOME": str(workdir / "home"),
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if env.get("PARALLEL_LAB_QUIZZES"):  # the kernel runs in workdir: relative paths would break
        env["PARALLEL_LAB_QUIZZES"] = str(Path(env["PARALLEL_LAB_QUIZZES"]).resolve())
    with open(workdir / "pytest.out", "wb") as out:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=notebook_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_tree(process, str(log))
    records = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            records.setdefault(record["cell"], record)
    tail = (workdir / "pytest.out").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
    return records, timed_out, "\n".join(tail)


def _kill_tree(process, token: str) -> None:
    """Kill the pytest process, its kernel and anything they started (found as descendants, and by
    the grading token in their environment, which orphans keep)."""
    victims = []
    try:
        victims = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(LOG_ENV) == token:
                victims.append(proc)
        except (psutil.Error, OSError):
            continue
    for proc in [*victims]:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if process.poll() is None:
        process.kill()
    process.wait()
    psutil.wait_procs(victims, timeout=5)


def _reason(check: Check, record: dict | None, records: dict, timed_out: bool, limits: tuple,
            tail: str) -> tuple[str, str]:
    """(reason, detail) for a check that did not pass."""
    cell_timeout, notebook_timeout = limits
    if record is None:
        if timed_out:
            return f"not run: the notebook exceeded its {notebook_timeout:g} s limit", ""
        last = tail.splitlines()[-1].strip() if tail.strip() else "no output"
        return f"not run: the grader could not run the notebook ({last})", tail
    expected = output_text(check.outputs)
    got = record.get("outputs_text", "")
    detail = f"expected:\n{_indent(expected)}\ngot:\n{_indent(got or '(nothing)')}"
    kind = record["kind"]
    if kind == "differ":
        first = next((line for line in got.splitlines() if line not in expected.splitlines()), "")
        return ("output differs from the reference" + (f": {first.strip()}" if first.strip() else ""), detail)
    if kind == "exception":
        return f"the check raised {record.get('ename')}: {first_line(record.get('evalue', ''))}", detail
    if kind == "timeout":
        return f"timed out after {cell_timeout:g} s", detail
    if kind == "died":
        return "the kernel died while running this check", detail
    if kind == "dead":  # the kernel died in an earlier cell, or nbval stopped it after a hang
        for cause, what in (("died", "died"), ("timeout", "was stopped after a hang")):
            cells = [n for n, r in sorted(records.items()) if r["kind"] == cause]
            if cells:
                return f"not run: the kernel {what} in code cell {cells[0] + 1}", ""
        return "not run: the kernel was not running", ""
    if kind == "skipped":
        return "check cell skipped", ""
    return f"the grader could not run this check: {record.get('error', '')}", detail


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines()) or "    (nothing)"


def grade_submission(path, reference: Reference, student: str, cell_timeout: float = 60,
                     notebook_timeout: float = 600, sanitize: Path | None = DEFAULT_SANITIZE) -> list[Row]:
    """Grade one submission against ``reference``: one Row per check, in the reference's order."""
    path = Path(path)

    def row(check, passed, reason="", detail=""):
        return Row(student, reference.lesson, check.id, passed, check.points if passed else 0,
                   check.points, reason, str(path), detail)

    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("it has no list of cells")
    except Exception as exc:  # anything unreadable is "not a notebook", with the parser's words
        words = first_line(str(exc)).split(": '")[0] or type(exc).__name__  # not the file's content
        reason = f"not a notebook: {words[:120]}"
        return [row(check, False, reason) for check in reference.checks]
    found = match_checks(nb, reference.checks)
    test_nb, numbers = build_test_notebook(nb, reference.checks, found)
    records, timed_out, tail = {}, False, ""
    if numbers:
        with tempfile.TemporaryDirectory(prefix="parallel-lab-grade-") as tmp:
            records, timed_out, tail = run_nbval(test_nb, Path(tmp), cell_timeout, notebook_timeout, sanitize)
    cell_of = {check_id: n for n, check_id in numbers.items()}
    rows = []
    for check in reference.checks:
        if isinstance(found[check.id], str):
            rows.append(row(check, False, found[check.id]))
            continue
        record = records.get(cell_of[check.id])
        if record is not None and record["kind"] == "passed":
            rows.append(row(check, True))
        else:
            rows.append(row(check, False, *_reason(check, record, records, timed_out,
                                                   (cell_timeout, notebook_timeout), tail)))
    return rows
