"""The service's one door to ``course.grading``: which lessons can be graded, one submission graded
in the sandbox, a course's policy and its learners' standings, the exports and the similarity report.

Everything here calls the course's grader and gradebook (``course.grading.runner``, ``.gradebook``,
``.policy``, ``.exports``, ``.similarity``, ``.roster``); nothing grades or scores a second way. The
course's policy (``CoursePolicy``) adds to the grading policy (weights, partial credit, the
credential's threshold: ``course.grading.policy.Policy``) what only the service knows: the lessons
the course grades, their deadlines and whether a late upload is accepted (marked late) or refused.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import tempfile
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import nbformat

from parallel_lab.course import tags as cell_tags
from parallel_lab.course.grading import exports as grading_exports
from parallel_lab.course.grading import gradebook, similarity
from parallel_lab.course.grading.policy import Policy as GradingPolicy
from parallel_lab.course.grading.policy import PolicyError
from parallel_lab.course.grading.reference import ROOT, GradingError, Reference, load_reference
from parallel_lab.course.grading.roster import Roster, Student
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
class CoursePolicy:
    """A course's policy (stored as JSON with the course): the lessons it grades, deadlines per
    lesson and what a late upload gets (``late``: ``accept`` and mark it late, or ``refuse``), and
    the grading policy of ``course.grading.policy`` (``grading``: what ``grading.yaml`` holds:
    weights, partial credit, the credential's threshold, the similarity report's)."""

    lessons: list[str]
    deadlines: dict[str, str] = field(default_factory=dict)  # lesson -> ISO date-time, UTC
    late: str = "accept"  # "accept" (graded, marked late) or "refuse"
    grading: dict = field(default_factory=dict)

    @classmethod
    def make(cls, lessons, threshold: float | None = None, deadlines=None, late: str = "accept",
             grading: dict | None = None) -> "CoursePolicy":
        grading = dict(grading or {})
        if threshold is not None:
            grading["certificate"] = {**grading.get("certificate", {}), "threshold": threshold}
        return cls(list(lessons), dict(deadlines or {}), late, grading)

    @property
    def rules(self) -> GradingPolicy:
        return GradingPolicy.from_dict(self.grading, "the course's grading policy")

    @property
    def threshold(self) -> float:
        return self.rules.threshold

    def check(self, known: dict) -> "CoursePolicy":
        if not self.lessons:
            raise Refused(400, N_("a course needs at least one lesson"))
        unknown = [x for x in self.lessons if x not in known]
        if unknown:
            raise Refused(400, N_("no graded lesson %(unknown)s (graded lessons: %(known)s)"),
                          unknown=", ".join(unknown), known=", ".join(known))
        try:
            self.rules
        except PolicyError as err:
            raise Refused(400, N_("the grading policy is wrong: %(why)s"), why=str(err)) from None
        if self.late not in ("accept", "refuse"):
            raise Refused(400, N_("late must be 'accept' or 'refuse', got %(late)r"), late=self.late)
        for lesson, when in self.deadlines.items():
            deadline(when)
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CoursePolicy":
        return cls(**json.loads(text))


def deadline(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Refused(400, N_("a deadline is YYYY-MM-DDTHH:MM (UTC), got %(text)r"), text=text) from None
    return when.astimezone(dt.timezone.utc).replace(tzinfo=None) if when.tzinfo else when


def is_late(policy: CoursePolicy, lesson: str, at: dt.datetime) -> bool:
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


def grade(content: bytes, lesson: Lesson, student: str, sandbox: Sandbox, limits: Limits, rules: GradingPolicy,
          modules=(), env=None) -> list[Row]:
    """Grade one upload with the course's grader (``runner.grade_submission``) in ``sandbox``, its
    points under the course's ``rules``; ``student`` (the learner's id) draws their graded quiz."""
    with tempfile.TemporaryDirectory(prefix="parallel-lab-service-") as tmp:
        path = Path(tmp) / f"{lesson.name}.ipynb"  # a name the service makes
        path.write_bytes(content)
        return grade_submission(path, lesson.reference, student, sandbox, limits, modules, env, policy=rules,
                                capstone_lesson=gradebook.capstone_lesson(rules))


def missing_rows(student: str, lesson: Lesson, rules: GradingPolicy) -> list[Row]:
    """A lesson not handed in: its checks at 0 points, so that it counts in the course's maximum."""
    capstone = gradebook.capstone_lesson(rules)
    return [Row(student, lesson.name, c.id, False, 0.0, c.points, "not handed in",
                category=rules.category(c.id, lesson.name, capstone)) for c in lesson.reference.checks]


def standings(policy: CoursePolicy, known: dict[str, Lesson], rows: list[Row], students, overrides=()) -> dict:
    """``{student: course.grading.gradebook.Standing}`` over the course's lessons: ``rows`` are the
    counted uploads' verdicts, a lesson a student has not handed in counts 0, ``overrides``
    (``roster.Override``) replace a check's points."""
    rules = policy.rules
    have = {(r.student, r.lesson) for r in rows}
    rows = list(rows)
    for student in students:
        for x in policy.lessons:
            if (student, known[x].name) not in have:
                rows += missing_rows(student, known[x], rules)
    return gradebook.standings(rows, rules, overrides)


def roster_of(users) -> Roster:
    """The course's learners as ``course.grading.roster`` knows students: id and email their address."""
    return Roster(tuple(Student(u.email, u.email, u.email, u.name) for u in users))


def exports(policy: CoursePolicy, known: dict, rows: list[Row], table: dict, roster: Roster) -> dict[str, str]:
    """Every export of the course's gradebook, by file name: ``grades.csv`` (one row per check, overrides
    applied), ``grades-summary.csv``, ``canvas.csv`` and ``moodle.csv`` (the LMSs' import formats),
    ``similarity.csv`` -- the files ``parallel-lab grade`` writes, by ``course.grading``."""
    rules = policy.rules
    lessons = [known[x].name for x in policy.lessons]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gradebook.write_gradebook(rows, tmp / "grades.csv")
        header, body = gradebook.summary_rows(rows, rules, roster)
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([header, *body])
        (tmp / "grades-summary.csv").write_text(text.getvalue(), encoding="utf-8")
        grading_exports.write_canvas(tmp / "canvas.csv", table, lessons, roster)
        grading_exports.write_moodle(tmp / "moodle.csv", table, lessons, roster)
        similarity.write_report(tmp / "similarity.csv", similar(policy, known, rows))
        return {p.name: p.read_text(encoding="utf-8") for p in tmp.iterdir()}


def similar(policy: CoursePolicy, known: dict, rows: list[Row]) -> list:
    """The similarity report (``course.grading.similarity``): near-identical answers and quiz sheets
    written for another learner's quiz, at the policy's threshold."""
    return similarity.report(rows, policy.rules.similarity, [known[x].reference for x in policy.lessons])
