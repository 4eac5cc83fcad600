"""The service's one door to ``course.grading``: which lessons can be graded, one submission graded
in the sandbox, a course's policy and a learner's standing, the gradebook exports.

Everything here calls the course's grader and gradebook (``course.grading.runner``,
``course.grading.gradebook``); nothing grades a second way. The policy is the course's: the lessons
it grades, the share of their points that earns the credential (``threshold``), optional deadlines
per lesson and what a late upload gets (``late``: ``accept`` and mark it late, or ``refuse``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import nbformat

from parallel_lab.course import tags as cell_tags
from parallel_lab.course.grading import gradebook
from parallel_lab.course.grading.reference import ROOT, GradingError, Reference, load_reference
from parallel_lab.course.grading.runner import Row, grade_submission, read_notebook
from parallel_lab.course.grading.sandbox import Limits, Sandbox
from parallel_lab.service.auth import N_, Refused

LESSONS = ROOT / "lessons"


@dataclass(frozen=True)
class Lesson:
    id: str  # "01"
    name: str  # "01_ranks_and_collectives"
    title: str
    reference: Reference

    @property
    def max_points(self) -> float:
        return sum(c.points for c in self.reference.checks)


def _title(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


@lru_cache(maxsize=8)
def catalog(lessons_dir: str | None = None) -> dict[str, Lesson]:
    """Every lesson of ``lessons_dir`` (default: the course's ``lessons/``) that has graded checks,
    by its two-digit id."""
    found = {}
    for path in sorted(Path(lessons_dir or LESSONS).glob("[0-9][0-9]_*.ipynb")):
        try:
            ref = load_reference(path)
        except GradingError:
            continue
        found[path.name[:2]] = Lesson(path.name[:2], path.stem, _title(path), ref)
    return found


@dataclass
class Policy:
    """A course's grading policy (stored as JSON with the course)."""

    lessons: list[str]
    threshold: float = 0.8  # share of the course's points that earns the credential
    deadlines: dict[str, str] = field(default_factory=dict)  # lesson -> ISO date-time, UTC
    late: str = "accept"  # "accept" (graded, marked late) or "refuse"

    def check(self, known: dict) -> "Policy":
        if not self.lessons:
            raise Refused(400, N_("a course needs at least one lesson"))
        unknown = [x for x in self.lessons if x not in known]
        if unknown:
            raise Refused(400, N_("no graded lesson %(unknown)s (graded lessons: %(known)s)"),
                          unknown=", ".join(unknown),
                          known=", ".join(known))
        if not 0 < self.threshold <= 1:
            raise Refused(400, N_("the threshold is a share of the points in (0, 1], got %(threshold)g"),
                          threshold=self.threshold)
        if self.late not in ("accept", "refuse"):
            raise Refused(400, N_("late must be 'accept' or 'refuse', got %(late)r"), late=self.late)
        for lesson, when in self.deadlines.items():
            deadline(when)
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Policy":
        return cls(**json.loads(text))


def deadline(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Refused(400, N_("a deadline is YYYY-MM-DDTHH:MM (UTC), got %(text)r"), text=text) from None
    return when.astimezone(dt.timezone.utc).replace(tzinfo=None) if when.tzinfo else when


def is_late(policy: Policy, lesson: str, at: dt.datetime) -> bool:
    return lesson in policy.deadlines and at > deadline(policy.deadlines[lesson])


def screen_upload(filename: str, content: bytes, lesson: Lesson, limit: int) -> str:
    """Why the upload cannot be stored for ``lesson`` (Refused), else its SHA-256. The file name is
    only looked at, never used to store anything."""
    if not filename or any(c in filename for c in "/\\\0") or filename in (".", "..") or ".." in filename:
        raise Refused(400, N_("the file name must be a plain notebook name, without folders, got %(name)r"),
                      name=filename[:80])
    if not filename.endswith(".ipynb"):
        raise Refused(400, N_("only notebooks (.ipynb) are graded, got %(name)r"), name=filename[:80])
    if len(content) > limit:
        raise Refused(413, N_("the notebook is %(size)s bytes, over the limit of %(limit)s"),
                      size=format(len(content), ","),
                      limit=format(limit, ","))
    with tempfile.NamedTemporaryFile(suffix=".ipynb") as f:
        f.write(content)
        f.flush()
        nb = read_notebook(Path(f.name))
    if isinstance(nb, str):
        raise Refused(400, N_("%(name)s is not a notebook (%(why)s)"), name=filename,
                      why=nb.removeprefix("not a notebook: "))
    tags = {cell_tags.answer(c) for c in nb.cells} - {None}
    wanted = [c.id for c in lesson.reference.checks]
    if not tags & set(wanted):
        raise Refused(400, N_("%(name)s is not lesson %(lesson)s (%(title)s): none of its cells is tagged %(tags)s"),
                      name=filename, lesson=lesson.id, title=lesson.title,
                      tags=" or ".join(f"answer:{w}" for w in wanted))
    return hashlib.sha256(content).hexdigest()


def grade(content: bytes, lesson: Lesson, student: str, sandbox: Sandbox, limits: Limits, modules=(),
          env=None) -> list[Row]:
    """Grade one upload with the course's grader (``runner.grade_submission``) in ``sandbox``."""
    with tempfile.TemporaryDirectory(prefix="parallel-lab-service-") as tmp:
        path = Path(tmp) / f"{lesson.name}.ipynb"  # a name the service makes
        path.write_bytes(content)
        return grade_submission(path, lesson.reference, student, sandbox, limits, modules, env)


@dataclass(frozen=True)
class Standing:
    points: float
    max_points: float
    lessons: dict  # lesson -> (points, max_points, source: "graded" | "override" | "none")

    @property
    def share(self) -> float:
        return self.points / self.max_points if self.max_points else 0.0

    def passed(self, policy: Policy) -> bool:
        return self.max_points > 0 and self.share >= policy.threshold - 1e-12

    def lessons_passed(self, policy: Policy) -> list[str]:
        return [x for x, (p, m, _) in self.lessons.items() if m and p / m >= policy.threshold - 1e-12]


def standing(policy: Policy, known: dict[str, Lesson], graded: dict[str, float],
             overrides: dict[str, float]) -> Standing:
    """A learner's points in the course: per lesson the override if any, else the latest graded
    submission's points (``graded``: lesson -> points), else 0."""
    lessons = {}
    for x in policy.lessons:
        top = known[x].max_points
        if x in overrides:
            lessons[x] = (overrides[x], top, "override")
        elif x in graded:
            lessons[x] = (graded[x], top, "graded")
        else:
            lessons[x] = (0.0, top, "none")
    return Standing(sum(p for p, _, _ in lessons.values()), sum(m for _, m, _ in lessons.values()), lessons)


def gradebook_csv(rows: list[Row], directory: Path) -> tuple[Path, Path]:
    """The course's gradebook (one row per check) and its per-student summary, written by
    ``course.grading.gradebook``: the same files ``parallel-lab grade`` writes."""
    book = gradebook.write_gradebook(rows, directory / "grades.csv")
    summary = gradebook.write_summary(rows, directory / "grades-summary.csv")
    return book, summary
