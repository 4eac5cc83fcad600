"""Who is who: the roster maps submission folders to student ids and emails; the overrides file
holds the instructor's regrades.

    roster = Roster.load("roster.csv")    # folder,student_id,email[,first_name,last_name,section]
    roster.student("ada")                  # -> Student(folder="ada", id="s1001", email=..., ...)
    overrides = load_overrides("overrides.csv")   # student,check,points,reason

**Roster** (CSV with a header): ``folder`` is the name of the student's folder under the
submissions (``submissions/ada/01_*.ipynb``), ``student_id`` the id the LMS knows (Canvas' SIS User
ID, Moodle's ID number), ``email`` their address (Canvas' SIS Login ID where logins are emails,
Moodle's Email address); ``first_name``, ``last_name`` and ``section`` are optional. The student id
is also what a notebook's graded quiz is drawn for (``course.quiz.variant``): students write it in
the lesson, the grader takes it from here. Without a roster, a student's id is their folder's name.

**Overrides** (CSV with a header): ``student`` (the student id, or the folder), ``check`` (a check
id of the gradebook: ``ring-all-reduce``, ``quiz:01``, ``predict:gpipe-bubble``), ``points`` (what
the check is worth for this student from now on, 0 to its maximum) and ``reason`` (shown in the
gradebook and the student's feedback). A later line for the same student and check wins.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

ROSTER_COLUMNS = ("folder", "student_id", "email")
ROSTER_OPTIONAL = ("first_name", "last_name", "section")
OVERRIDE_COLUMNS = ("student", "check", "points", "reason")


class RosterError(ValueError):
    """A roster or overrides file breaks an invariant; the message names the file, line and value."""


@dataclass(frozen=True)
class Student:
    folder: str
    id: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    section: str = ""

    @property
    def sortable_name(self) -> str:
        """``Lovelace, Ada`` (Canvas' Student column), or the id when the roster has no name."""
        if self.last_name or self.first_name:
            return ", ".join(p for p in (self.last_name, self.first_name) if p)
        return self.id


def _rows(path: Path, required: tuple, what: str) -> list[tuple[int, dict]]:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark from a spreadsheet is fine
    except OSError as err:
        raise RosterError(f"cannot read the {what} {path}: {err.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in required if c not in header]
    if missing:
        raise RosterError(f"{Path(path).name}: the {what} needs the column(s) {', '.join(missing)}; its header is "
                          f"{', '.join(header) or 'empty'} (expected {', '.join(required)})")
    rows = []
    for number, row in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in row.items() if k is not None}
        if any(row.values()):
            rows.append((number, row))
    return rows


@dataclass(frozen=True)
class Roster:
    students: tuple
    path: str = ""

    @classmethod
    def load(cls, path) -> "Roster":
        students, folders, ids = [], {}, {}
        for line, row in _rows(path, ROSTER_COLUMNS, "roster"):
            if not row["folder"] or not row["student_id"]:
                raise RosterError(f"{Path(path).name}, line {line}: folder and student_id must not be empty "
                                  f"(got folder {row['folder']!r}, student_id {row['student_id']!r})")
            for key, seen in (("folder", folders), ("student_id", ids)):
                if row[key] in seen:
                    raise RosterError(f"{Path(path).name}, line {line}: {key} {row[key]!r} is also on line "
                                      f"{seen[row[key]]}")
                seen[row[key]] = line
            students.append(Student(row["folder"], row["student_id"], row["email"],
                                    *(row.get(k, "") for k in ROSTER_OPTIONAL)))
        return cls(tuple(students), str(path))

    def student(self, folder: str) -> Student | None:
        return next((s for s in self.students if s.folder == folder), None)

    def by_id(self, student_id: str) -> Student | None:
        return next((s for s in self.students if s.id == student_id), None)


def student_for(folder: str, roster: Roster | None) -> Student:
    """The roster's student for a submission folder; without a roster (or off it), the folder is the id."""
    found = roster.student(folder) if roster else None
    return found or Student(folder, folder)


@dataclass(frozen=True)
class Override:
    student: str
    check: str
    points: float
    reason: str
    line: int = 0


def load_overrides(path) -> list[Override]:
    """The overrides of ``path``; RosterError for a malformed line (checked before any grading)."""
    found = []
    for line, row in _rows(path, OVERRIDE_COLUMNS, "overrides file"):
        where = f"{Path(path).name}, line {line}"
        try:
            points = float(row["points"])
        except ValueError:
            raise RosterError(f"{where}: points must be a number, got {row['points']!r}") from None
        if not math.isfinite(points) or points < 0:
            raise RosterError(f"{where}: points must be >= 0, got {row['points']}")
        if not row["student"] or not row["check"]:
            raise RosterError(f"{where}: student and check must not be empty")
        if not row["reason"]:
            raise RosterError(f"{where}: give a reason (the student's feedback shows it)")
        found.append(Override(row["student"], row["check"], points, row["reason"], line))
    return found
