"""The gradebook in the import formats of two LMSs, one column per lesson and one for the weighted
score, students identified by the roster.

**Canvas** (Grades → Import): the header of Canvas's own gradebook export, which its importer reads
back -- ``Student, ID, SIS User ID, SIS Login ID, Section``, then one column per assignment -- and a
second row ``Points Possible`` giving each new assignment's maximum (instructure/canvas-lms,
``Course#gradebook_to_csv``; the Instructor Guide's "How do I import grades in the Gradebook?" and
Ohio State's "Import a CSV file to Carmen grades": a student is found by name, ID or SIS User ID,
and the SIS Login ID and Section columns must be there). ``Student`` is "Last, First" from the
roster; ``ID`` (Canvas's internal user id) is left empty; ``SIS User ID`` is the roster's
``student_id`` and ``SIS Login ID`` its ``email``. A column whose name matches no assignment
creates one.

**Moodle** (Grades → Import → CSV file): a header row, one student per row, an identifier column
the import maps to a user field ("Map from" / "Map to": ``useridnumber`` or ``useremail``), and a
column per grade item, mapped to an existing item or "New grade item" (moodle/moodle,
``grade/import/csv/classes/load_data.php``; its fixture ``grade_import_multiple_mappings.csv``:
``First name,Last name,Email address,Grade A,...``). The columns follow Moodle's own export:
``First name, Last name, ID number, Email address``, then the items.

A student on the roster without a graded submission gets 0 for every lesson of the gradebook (what
the policy counts); a graded student off the roster is exported under their folder's name.
"""

from __future__ import annotations

import csv
from pathlib import Path

from parallel_lab.course.grading.roster import Roster, Student

CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS_POSSIBLE = "Points Possible"
MOODLE_IDENTITY = ("First name", "Last name", "ID number", "Email address")
SCORE_COLUMN = "parallel-lab score (%)"


def lesson_column(lesson: str) -> str:
    """``01_ranks_and_collectives`` -> ``parallel-lab 01 ranks and collectives`` (an assignment's name)."""
    return "parallel-lab " + lesson.replace("_", " ")


def _students(table: dict, roster: Roster | None) -> list[tuple[Student, object]]:
    """(student, standing or None) for every student on the roster, then every graded one off it."""
    out, seen = [], set()
    for student in roster.students if roster else ():
        out.append((student, table.get(student.id)))
        seen.add(student.id)
    for student_id, standing in table.items():
        if student_id not in seen:
            out.append((Student(student_id, student_id), standing))
    return out


def _grades(standing, lessons) -> list[str]:
    if standing is None:
        return ["0" for _ in lessons] + ["0"]
    return [f"{standing.lessons[lesson].points:g}" if lesson in standing.lessons else "0" for lesson in lessons] + \
        [f"{100 * standing.score:.2f}"]


def _maxima(table: dict, lessons) -> list[str]:
    any_standing = next(iter(table.values()), None)
    return [f"{any_standing.lessons[lesson].max_points:g}" if any_standing else "" for lesson in lessons] + ["100"]


def canvas_rows(table: dict, lessons, roster: Roster | None = None) -> list[list[str]]:
    """Header, Points Possible row and one row per student, as Canvas's importer reads them."""
    header = [*CANVAS_IDENTITY, *(lesson_column(lesson) for lesson in lessons), SCORE_COLUMN]
    rows = [header, [CANVAS_POINTS_POSSIBLE, "", "", "", "", *_maxima(table, lessons)]]
    for student, standing in _students(table, roster):
        rows.append([student.sortable_name, "", student.id, student.email, student.section,
                     *_grades(standing, lessons)])
    return rows


def moodle_rows(table: dict, lessons, roster: Roster | None = None) -> list[list[str]]:
    """Header and one row per student, as Moodle's CSV grade import reads them."""
    rows = [[*MOODLE_IDENTITY, *(lesson_column(lesson) for lesson in lessons), SCORE_COLUMN]]
    for student, standing in _students(table, roster):
        rows.append([student.first_name, student.last_name or student.id, student.id, student.email,
                     *_grades(standing, lessons)])
    return rows


def _write(path, rows) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return path


def write_canvas(path, table: dict, lessons, roster: Roster | None = None) -> Path:
    """``table``: ``{student id: Standing}`` (``gradebook.standings``); ``lessons``: reference stems."""
    return _write(path, canvas_rows(table, lessons, roster))


def write_moodle(path, table: dict, lessons, roster: Roster | None = None) -> Path:
    return _write(path, moodle_rows(table, lessons, roster))
