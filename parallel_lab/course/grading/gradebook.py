"""Many submissions: match each to its lesson, grade it, write the gradebook, the per-student
summary and the feedback.

    parallel-lab grade submissions/ --out grades.csv --jobs 2       # + grades-summary.csv, feedback/

Outputs (``grade``): ``grades.csv``, one row per submission and check (``GRADEBOOK_COLUMNS``, with
the sandbox that graded it); ``grades-summary.csv`` (or ``summary=``), one row per student with the
points of each lesson and in all, ready to import into an LMS; ``feedback/<student>.md``, each
failed check's reason and its verdict (expected against actual). A progress bar (tqdm) goes to
stderr.
"""

from __future__ import annotations

import csv
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from parallel_lab.course.grading.reference import ROOT, GradingError, Reference, load_reference
from parallel_lab.course.grading.runner import Row, grade_submission
from parallel_lab.course.grading.sandbox import Limits, Sandbox

GRADEBOOK_COLUMNS = ("student", "lesson", "exercise", "passed", "points", "max_points", "reason", "sandbox")


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


def grade(submissions, out, references=None, feedback_dir=None, check_timeout: float = 60,
          notebook_timeout: float = 600, student_from: str = "parent", jobs: int = 1, summary=None,
          sandbox: Sandbox | None = None, modules=(), env=None, progress: bool = True) -> list[Row]:
    """Grade every submission, write the gradebook CSV to ``out``, the per-student summary (default:
    ``<out stem>-summary.csv`` beside it) and one feedback file per student to ``feedback_dir``
    (default: ``feedback/`` beside ``out``). Returns the rows.

    ``check_timeout`` bounds one run of an answer on its ranks; ``notebook_timeout`` one submission
    (the sandbox is stopped, every process of it killed). ``sandbox``: ``Sandbox.detect()`` by
    default (bubblewrap when it works here). ``modules``/``env``: extra exercise modules for the
    checker and their environment (tests)."""
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
    if check_timeout <= 0 or notebook_timeout <= 0 or jobs < 1:
        raise GradingError(f"timeouts must be > 0 and jobs >= 1, got check {check_timeout}, "
                           f"notebook {notebook_timeout}, jobs {jobs}")
    sandbox = sandbox or Sandbox.detect()
    if sandbox.missing:
        print(f"parallel-lab grade: WARNING: {sandbox.missing}", file=sys.stderr, flush=True)
    limits = Limits(wall_s=notebook_timeout)
    env = {"PARALLEL_LAB_CHECK_TIMEOUT": f"{check_timeout:g}", **(env or {})}

    def one(path: Path) -> list[Row]:
        student, ref = student_of(path, student_from), choose_reference(path, refs)
        if ref is None:
            return [Row(student, "?", "*", False, 0, 0, "cannot tell which lesson this is; pass --reference "
                        f"(references: {', '.join(r.path.name for r in refs)})", str(path), sandbox=sandbox.kind)]
        return grade_submission(path, ref, student, sandbox, limits, modules, env)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        graded = pool.map(one, paths)
        bar = tqdm(graded, total=len(paths), desc="grading", unit="submission", file=sys.stderr,
                   disable=not progress)
        rows = [row for rows in bar for row in rows]
    write_gradebook(rows, out)
    write_summary(rows, summary or Path(out).with_name(f"{Path(out).stem}-summary.csv"))
    write_feedback(rows, Path(feedback_dir) if feedback_dir else Path(out).parent / "feedback")
    return rows


def write_summary(rows, path) -> Path:
    """One row per student: points per lesson and in all (``<lesson> points``, ``<lesson> max``)."""
    path = Path(path)
    lessons = sorted({r.lesson for r in rows})
    students = list(dict.fromkeys(r.student for r in rows))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["student", *(f"{lesson} {what}" for lesson in lessons for what in ("points", "max")),
                         "total points", "total max"])
        for student in students:
            mine = [r for r in rows if r.student == student]
            cells = []
            for lesson in lessons:
                graded = [r for r in mine if r.lesson == lesson]
                cells += [f"{sum(r.points for r in graded):g}" if graded else "",
                          f"{sum(r.max_points for r in graded):g}" if graded else ""]
            writer.writerow([student, *cells, f"{sum(r.points for r in mine):g}",
                             f"{sum(r.max_points for r in mine):g}"])
    return path


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
