"""Grade student notebooks with nbval against a reference lesson's check cells.

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
   line (``parallel_lab.quiz.check.passing_verdict``): the lesson itself stores the verdict of an
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

The bottom of this module is a small pytest plugin (``-p parallel_lab.grading``) that runs inside
the nbval subprocess: it logs each cell's result and actual outputs (JSON lines, flushed, so a
killed run keeps what it finished) and notices a dead kernel quickly.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

LOG_ENV = "PARALLEL_LAB_GRADE_LOG"
if os.environ.get(LOG_ENV) and "jsonschema" not in sys.modules:
    # Inside the nbval subprocess only: jsonschema imports rfc3987_syntax when it is installed (it
    # comes with JupyterLab) to check IRI formats, and that builds a parser at import -- about 5 s
    # per graded notebook. Neither nbformat nor nbval checks IRIs, so the probe hides the module.
    sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SANITIZE = ROOT / "lessons" / "sanitize.cfg"
GRADEBOOK_COLUMNS = ("student", "lesson", "exercise", "passed", "points", "max_points", "reason")


class GradingError(ValueError):
    """The grading job itself is wrong (no reference, a reference without checks, ...)."""


# ----------------------------------------------------------------------------------------------
# The reference: which cells are graded.


@dataclass(frozen=True)
class Check:
    """A graded cell of the reference lesson."""

    id: str
    points: float
    cell_id: str | None
    source: str
    outputs: tuple

    @property
    def quiz(self) -> str | None:
        return self.id.split(":", 1)[1] if self.id.startswith("quiz:") else None


@dataclass(frozen=True)
class Reference:
    path: Path
    notebook: object = field(repr=False)
    checks: tuple

    @property
    def lesson(self) -> str:
        return self.path.stem


def check_tags(cell) -> tuple[str | None, float]:
    """``(check id, points)`` of a cell, or ``(None, 0)`` when it is not a check cell."""
    meta = cell.get("metadata", {})
    own = meta.get("parallel_lab", {}) if isinstance(meta.get("parallel_lab"), dict) else {}
    check, points = own.get("check"), own.get("points")
    for tag in meta.get("tags", []) if isinstance(meta.get("tags", []), list) else []:
        if isinstance(tag, str) and tag.startswith("check:"):
            check = tag[len("check:"):]
        elif isinstance(tag, str) and tag.startswith("points:"):
            points = tag[len("points:"):]
    if not check or cell.get("cell_type") != "code":
        return None, 0
    try:
        return check, float(1 if points is None else points)
    except ValueError:
        raise GradingError(f"check {check}: points must be a number, got {points!r}") from None


def load_reference(path) -> Reference:
    """The reference lesson and its check cells; raises GradingError if it has none."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    checks, seen = [], set()
    for cell in nb.cells:
        check, points = check_tags(cell)
        if check is None:
            continue
        if check in seen:
            raise GradingError(f"{path.name}: check {check!r} is tagged on two cells; check ids must be unique")
        seen.add(check)
        checks.append(Check(check, points, cell.get("id"), cell.source, tuple(expected_outputs(check, cell))))
    if not checks:
        raise GradingError(f"{path.name}: no check cells (tag a cell 'check:ID' and 'points:N')")
    return Reference(path, nb, tuple(checks))


def expected_outputs(check: str, cell) -> list:
    """What a passing submission prints in a check cell: the reference's outputs, or for a quiz
    check the quiz's pass line."""
    if check.startswith("quiz:"):
        from parallel_lab.quiz.bank import load
        from parallel_lab.quiz.check import passing_verdict

        try:
            bank = load(check.split(":", 1)[1])
        except KeyError as exc:  # the lesson names a quiz the banks do not have
            raise GradingError(f"check {check!r}: {exc.args[0]}") from None
        text = passing_verdict(bank) + "\n"
        return [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return list(cell.outputs)


# ----------------------------------------------------------------------------------------------
# One submission.


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
               "-p", "parallel_lab.grading", "-q", "--color=no"]
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
    import psutil

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


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "").strip()


def _output_text(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
        else:
            parts.append(out.get("data", {}).get("text/plain", "") + "\n")
    return "".join(parts)


def _reason(check: Check, record: dict | None, records: dict, timed_out: bool, limits: tuple,
            tail: str) -> tuple[str, str]:
    """(reason, detail) for a check that did not pass."""
    cell_timeout, notebook_timeout = limits
    if record is None:
        if timed_out:
            return f"not run: the notebook exceeded its {notebook_timeout:g} s limit", ""
        last = tail.splitlines()[-1].strip() if tail.strip() else "no output"
        return f"not run: the grader could not run the notebook ({last})", tail
    expected = _output_text(check.outputs)
    got = record.get("outputs_text", "")
    detail = f"expected:\n{_indent(expected)}\ngot:\n{_indent(got or '(nothing)')}"
    kind = record["kind"]
    if kind == "differ":
        first = next((line for line in got.splitlines() if line not in expected.splitlines()), "")
        return ("output differs from the reference" + (f": {first.strip()}" if first.strip() else ""), detail)
    if kind == "exception":
        return f"the check raised {record.get('ename')}: {_first_line(record.get('evalue', ''))}", detail
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
        words = _first_line(str(exc)).split(": '")[0] or type(exc).__name__  # not the file's content
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


# ----------------------------------------------------------------------------------------------
# Many submissions: the gradebook and the feedback.


def expand(submissions) -> list[Path]:
    """Files as given; folders are searched for ``*.ipynb`` (checkpoints skipped)."""
    paths = []
    for item in map(Path, submissions):
        if not item.exists():  # a typo in the command line, not a student's failing submission
            raise GradingError(f"no such submission file or folder: {item}")
        if item.is_dir():
            paths += sorted(p for p in item.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            paths.append(item)
    return paths


def default_references() -> list[Path]:
    return sorted((ROOT / "lessons").glob("*.ipynb"))


def choose_reference(path: Path, references: list[Reference]) -> Reference | None:
    """Same file name, else the same two-digit lesson prefix, else the only reference."""
    for ref in references:
        if ref.path.name == path.name:
            return ref
    prefix = path.name[:2]
    same = [ref for ref in references if prefix.isdigit() and ref.path.name[:2] == prefix]
    if len(same) == 1:
        return same[0]
    return references[0] if len(references) == 1 else None


def student_of(path: Path, student_from: str = "parent") -> str:
    """The student's name: the submission's folder (``submissions/ada/01_x.ipynb`` -> ada) or its
    file name without extension (``--student-from stem``)."""
    if student_from == "stem":
        return path.stem
    if student_from != "parent":
        raise GradingError(f"student_from must be 'parent' or 'stem', got {student_from!r}")
    return path.resolve().parent.name


def grade(submissions, out, references=None, feedback_dir=None, cell_timeout: float = 60,
          notebook_timeout: float = 600, student_from: str = "parent", jobs: int = 1,
          sanitize: Path | None = DEFAULT_SANITIZE) -> list[Row]:
    """Grade every submission, write the gradebook CSV to ``out`` and one feedback file per
    student to ``feedback_dir`` (default: ``feedback/`` beside ``out``). Returns the rows."""
    paths = expand(submissions)
    if not paths:
        raise GradingError("no submissions to grade")
    refs = [load_reference(p) for p in (references or [])]
    if not refs:
        for candidate in default_references():
            try:
                refs.append(load_reference(candidate))
            except GradingError:
                continue
    if not refs:
        raise GradingError("no reference lesson with check cells; pass --reference LESSON.ipynb")
    if cell_timeout <= 0 or notebook_timeout <= 0 or jobs < 1:
        raise GradingError(f"timeouts must be > 0 and jobs >= 1, got cell {cell_timeout}, "
                           f"notebook {notebook_timeout}, jobs {jobs}")

    def one(path: Path) -> list[Row]:
        student, ref = student_of(path, student_from), choose_reference(path, refs)
        if ref is None:
            return [Row(student, "?", "*", False, 0, 0, "cannot tell which lesson this is; pass --reference "
                        f"(references: {', '.join(r.path.name for r in refs)})", str(path))]
        return grade_submission(path, ref, student, cell_timeout, notebook_timeout, sanitize)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = [row for rows in pool.map(one, paths) for row in rows]
    write_gradebook(rows, out)
    write_feedback(rows, Path(feedback_dir) if feedback_dir else Path(out).parent / "feedback")
    return rows


def write_gradebook(rows, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(GRADEBOOK_COLUMNS)
        writer.writerows(row.csv_row() for row in rows)
    return path


def feedback_text(student: str, rows) -> str:
    """A student's feedback: per submission, the score and every check with why it failed."""
    lines = [f"# Feedback for {student}", ""]
    for submission in dict.fromkeys(r.submission for r in rows):
        mine = [r for r in rows if r.submission == submission]
        got, total = sum(r.points for r in mine), sum(r.max_points for r in mine)
        lines += [f"## {mine[0].lesson} ({Path(submission).name})", "", f"Score: {got:g} of {total:g} points", ""]
        for r in mine:
            verdict = "passed" if r.passed else f"FAILED: {r.reason}"
            lines.append(f"- {r.exercise} ({r.max_points:g} point{'s' * (r.max_points != 1)}): {verdict}")
            if r.detail and not r.passed:
                lines += ["", "  ```", *("  " + line for line in r.detail.splitlines()), "  ```", ""]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_feedback(rows, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for student in dict.fromkeys(r.student for r in rows):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in student) or "unknown"
        path = directory / f"{safe}.md"
        path.write_text(feedback_text(student, [r for r in rows if r.student == student]), encoding="utf-8")
        written.append(path)
    return written


# ----------------------------------------------------------------------------------------------
# The probe: a pytest plugin loaded inside the nbval subprocess (``-p parallel_lab.grading``).
# It does nothing unless $PARALLEL_LAB_GRADE_LOG names the log file.

_died_seen = False


def pytest_configure(config):
    if not os.environ.get(LOG_ENV):
        return
    try:
        from nbval.kernel import RunningKernel
    except ImportError:
        return
    original = RunningKernel.get_message

    def get_message(self, stream, timeout=None):
        """nbval waits the whole cell timeout for a reply, even from a dead kernel: poll in short
        slices and give up at once when the kernel process is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                return original(self, stream, timeout=left)
            except Exception as exc:  # queue.Empty
                if type(exc).__name__ != "Empty":
                    raise
                if not self.is_alive():
                    self._parallel_lab_died = True
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    RunningKernel.get_message = get_message


def pytest_runtest_makereport(item, call):
    """Log one line per cell: {"cell", "kind": passed|differ|exception|timeout|died|dead|skipped|
    error, "outputs_text", "ename", "evalue"}; setup errors (kernel did not start) too."""
    global _died_seen
    log = os.environ.get(LOG_ENV)
    if not log or not hasattr(item, "cell_num") or call.when == "teardown":
        return
    if call.when == "setup" and call.excinfo is None:
        return
    exc = call.excinfo.value if call.excinfo else None
    message = str(exc) if exc is not None else ""
    kernel = getattr(item.parent, "kernel", None)
    died = bool(getattr(kernel, "_parallel_lab_died", False))
    if exc is None:
        kind = "passed"
    elif type(exc).__name__ == "Skipped":
        kind = "skipped"
    elif died and not _died_seen:
        kind = "died"
    elif "Kernel dead" in message or (died and _died_seen):
        kind = "dead"
    elif "Timeout" in message:
        kind = "timeout"
    elif "Cell outputs differ" in message:
        kind = "differ"
    elif "caused an exception" in message:
        kind = "exception"
    else:
        kind = "error"
    _died_seen = _died_seen or died
    outputs = list(getattr(item, "test_outputs", None) or [])
    error = next((o for o in outputs if o.get("output_type") == "error"), {})
    record = {"cell": item.cell_num, "kind": kind, "outputs_text": _output_text(outputs),
              "ename": error.get("ename", ""), "evalue": error.get("evalue", ""),
              "error": _first_line(message)}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
