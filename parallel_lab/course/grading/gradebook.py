"""Many submissions: match each to its lesson and student, grade the newest per student and lesson,
and write what an instructor and an LMS need.

    parallel-lab grade submissions/ --out grades.csv --roster roster.csv --jobs 2

Library functions (plain inputs and outputs; the command line and the course service call them):

- ``grade(submissions, out, ...)`` -> rows: grades every submission and writes every output below;
- ``summarize(rows, out, policy=, roster=, overrides=)``: the outputs from rows already graded
  (``read_gradebook(grades.csv)``), for a new policy or new overrides without grading again;
- ``standing(student, gradebook, policy=, overrides=)`` -> ``Standing``: one student's points,
  weighted score, lessons passed and checks passed, as certificates need them;
- ``apply_overrides(rows, overrides)``, ``summary_rows(rows, policy)``, ``read_gradebook(path)``.

Outputs, beside ``out``: ``grades.csv`` (one row per graded submission and check,
``GRADEBOOK_COLUMNS``: points after the policy and the overrides, the cases behind them, the
sandbox that graded it); ``grades-summary.csv`` (one row per student: points per lesson, each
category's share, the weighted score and the lessons passed); ``grades-canvas.csv`` and
``grades-moodle.csv`` (``grading.exports``: the LMSs' gradebook import formats, with the roster's
ids); ``submissions.csv`` (every file handed in, and which one was graded: the newest per student and
lesson); ``similarity.csv`` (pairs of students whose answers are near-identical after normalisation,
``grading.similarity``: a list to look at, not a verdict); ``feedback/<student>.md`` (each check,
why it failed, the quiz's explanations for wrong answers, regrades and their reasons). A progress
bar (tqdm) goes to stderr.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from parallel_lab.course import editions
from parallel_lab.course.grading import exports, similarity
from parallel_lab.course.grading.policy import CATEGORIES, Policy, lesson_number
from parallel_lab.course.grading.reference import ROOT, GradingError, Reference, load_reference, notebook_language
from parallel_lab.course.grading.roster import Override, Roster, load_overrides, student_for
from parallel_lab.course.grading.runner import Row, grade_submission
from parallel_lab.course.grading.sandbox import Limits, Sandbox
from parallel_lab.course.quiz.bank import load_all
from parallel_lab.i18n import DEFAULT, _, ngettext, using

GRADEBOOK_COLUMNS = ("student", "lesson", "exercise", "passed", "points", "max_points", "reason", "sandbox",
                     "cases_passed", "cases_tried", "category", "override", "submission", "lang")
SUBMISSION_COLUMNS = ("student", "folder", "lesson", "submission", "modified", "graded", "note")


# ----------------------------------------------------------------------------------------------
# Finding the submissions.


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
    """The English lessons and every translated edition's (``lessons/zh-Hant/``)."""
    folders = [ROOT / "lessons", *editions.EDITIONS.values()]
    return [path for folder in folders for path in sorted(folder.glob("*.ipynb"))]


def submission_language(path: Path) -> str:
    """The language a submitted notebook says it is in (its metadata; English when unreadable)."""
    try:
        return notebook_language(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return DEFAULT


def choose_reference(path: Path, references: list[Reference], lang: str | None = None) -> Reference | None:
    """Among the references in the submission's language (``lang``, else read from its metadata;
    all of them when none is in it): the same file name, else the same two-digit lesson prefix,
    else the only reference."""
    lang = lang or submission_language(path)
    candidates = [ref for ref in references if ref.lang == lang] or list(references)
    for ref in candidates:
        if ref.path.name == path.name:
            return ref
    prefix = path.name[:2]
    same = [ref for ref in candidates if prefix.isdigit() and ref.path.name[:2] == prefix]
    if len(same) == 1:
        return same[0]
    return candidates[0] if len(candidates) == 1 else None


def student_of(path: Path, student_from: str = "parent") -> str:
    """The submission's folder (``submissions/ada/01_x.ipynb`` -> ada) or its file name without
    extension (``--student-from stem``): what the roster's ``folder`` column names."""
    if student_from == "stem":
        return path.stem
    if student_from != "parent":
        raise GradingError(f"student_from must be 'parent' or 'stem', got {student_from!r}")
    return path.resolve().parent.name


@dataclass(frozen=True)
class Submission:
    """One file handed in: whose (``student`` id, ``folder``), which lesson, and whether it is the
    one graded (the newest of that student and lesson)."""

    path: Path
    folder: str
    student: str
    reference: Reference | None
    modified: float
    graded: bool = True
    note: str = ""

    @property
    def lesson(self) -> str:
        return self.reference.lesson if self.reference else "?"


def newest_per_student(submissions: list[Submission]) -> list[Submission]:
    """Every submission, those that are not their student's newest for the lesson marked not graded
    (the newest by modification time, then by name)."""
    groups: dict = {}
    for s in submissions:
        groups.setdefault((s.student, s.lesson), []).append(s)
    out = []
    for s in submissions:
        group = groups[(s.student, s.lesson)]
        newest = max(group, key=lambda g: (g.modified, g.path.name))
        if s is newest or s.reference is None:
            out.append(s)
        else:
            out.append(replace(s, graded=False, note=f"not graded: {newest.path.name} is newer"))
    return out


# ----------------------------------------------------------------------------------------------
# Grading.


def load_references(references=None) -> list[Reference]:
    refs = [load_reference(p) for p in (references or [])]
    if not refs:
        for candidate in default_references():
            try:
                refs.append(load_reference(candidate))
            except GradingError:
                continue
    if not refs:
        raise GradingError("no reference lesson with check cells; pass --reference LESSON.ipynb")
    return refs


def capstone_lesson(policy: Policy) -> str | None:
    """The capstone's lesson number: the ``lesson`` of the bank the policy names."""
    return next((b.lesson for b in load_all() if b.id == policy.capstone), None)


def grade(submissions, out, references=None, feedback_dir=None, check_timeout: float = 60,
          notebook_timeout: float = 600, student_from: str = "parent", jobs: int = 1, summary=None,
          sandbox: Sandbox | None = None, modules=(), env=None, progress: bool = True, policy=None,
          roster=None, overrides=None) -> list[Row]:
    """Grade the newest submission of every student and lesson and write every output (see the
    module's docstring) beside ``out``; returns the rows.

    ``check_timeout`` bounds one run of an answer on its ranks; ``notebook_timeout`` one submission
    (the sandbox is stopped, every process of it killed). ``sandbox``: ``Sandbox.detect()`` by
    default (bubblewrap when it works here). ``policy``: a ``Policy``, a policy file or None (the
    defaults); ``roster`` and ``overrides``: their files (or loaded objects), optional; all three are
    read before anything is graded, so a mistake in them stops the run at once. ``modules``/``env``:
    extra exercise modules for the checker and their environment (tests)."""
    policy = policy if isinstance(policy, Policy) else Policy.load(policy)
    roster = roster if isinstance(roster, Roster) or roster is None else Roster.load(roster)
    overrides = load_overrides(overrides) if isinstance(overrides, (str, Path)) else list(overrides or [])
    paths = expand(submissions)
    if not paths:
        raise GradingError("no submissions to grade")
    refs = load_references(references)
    if check_timeout <= 0 or notebook_timeout <= 0 or jobs < 1:
        raise GradingError(f"timeouts must be > 0 and jobs >= 1, got check {check_timeout}, "
                           f"notebook {notebook_timeout}, jobs {jobs}")
    sandbox = sandbox or Sandbox.detect()
    if sandbox.missing:
        print(f"parallel-lab grade: WARNING: {sandbox.missing}", file=sys.stderr, flush=True)
    for lesson in policy.unpassable_without(lesson_maxima_of(refs, policy)):
        print(f"parallel-lab grade: WARNING: with the weights of {policy.source}, lesson {lesson} cannot be passed "
              f"without its predictions (certificate threshold {policy.threshold:g})", file=sys.stderr, flush=True)
    limits = Limits(wall_s=notebook_timeout)
    env = {"PARALLEL_LAB_CHECK_TIMEOUT": f"{check_timeout:g}", **(env or {})}
    capstone = capstone_lesson(policy)
    handed_in = newest_per_student([
        Submission(p, folder, student_for(folder, roster).id, choose_reference(p, refs), p.stat().st_mtime)
        for p in paths for folder in [student_of(p, student_from)]])

    def one(submission: Submission) -> list[Row]:
        if submission.reference is None:
            return [Row(submission.student, "?", "*", False, 0, 0, "cannot tell which lesson this is; pass --reference "
                        f"(references: {', '.join(sorted({r.path.name for r in refs}))})", str(submission.path),
                        sandbox=sandbox.kind)]
        return grade_submission(submission.path, submission.reference, submission.student, sandbox, limits,
                                modules, env, policy=policy, capstone_lesson=capstone)

    graded = [s for s in handed_in if s.graded]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        bar = tqdm(pool.map(one, graded), total=len(graded), desc="grading", unit="submission", file=sys.stderr,
                   disable=not progress)
        rows = [row for rows in bar for row in rows]
    out = Path(out)
    summarize(rows, out, policy=policy, roster=roster, overrides=overrides, summary=summary,
              feedback_dir=feedback_dir, submissions=handed_in, references=refs)
    return apply_overrides(rows, overrides)[0]


def lesson_maxima_of(refs, policy: Policy) -> dict:
    """``{lesson number: {category: max points}}`` of reference lessons."""
    capstone = capstone_lesson(policy)
    maxima: dict = {}
    for ref in {ref.lesson: ref for ref in reversed(refs)}.values():  # an edition's checks are its lesson's
        lesson = lesson_number(ref.lesson)
        for check in ref.checks:
            category = policy.category(check.id, lesson, capstone)
            maxima.setdefault(lesson, {}).setdefault(category, 0.0)
            maxima[lesson][category] += check.points
    return maxima


# ----------------------------------------------------------------------------------------------
# Overrides, summaries, standings.


def apply_overrides(rows, overrides) -> tuple[list[Row], list[Override]]:
    """``rows`` with each override's points (and ``override`` saying why), and the overrides that
    match no row (a typo in the student or the check)."""
    latest = {(o.student, o.check): o for o in overrides}
    used, out = set(), []
    for row in rows:
        o = latest.get((row.student, row.exercise))
        if o is None:
            out.append(row)
            continue
        used.add((o.student, o.check))
        if o.points > row.max_points + 1e-9:
            raise GradingError(f"overrides, line {o.line}: {o.points:g} points for {o.check} of {o.student}, "
                               f"which is worth at most {row.max_points:g}")
        out.append(replace(row, points=o.points, override=f"{o.reason} (was {row.points:g})"))
    return out, [o for key, o in latest.items() if key not in used]


def lesson_maxima(rows) -> dict:
    """``{lesson: {category: max points}}`` over every student's rows (the same for all of them)."""
    maxima: dict = {}
    seen = set()
    for r in rows:
        if (r.lesson, r.exercise) in seen or r.lesson == "?":
            continue
        seen.add((r.lesson, r.exercise))
        maxima.setdefault(r.lesson, {}).setdefault(r.category or "exercises", 0.0)
        maxima[r.lesson][r.category or "exercises"] += r.max_points
    return maxima


@dataclass(frozen=True)
class LessonStanding:
    points: float
    max_points: float
    score: float
    passed: bool


@dataclass(frozen=True)
class Standing:
    """One student's standing under a policy: points and maximum over the lessons of the gradebook
    (a lesson not handed in counts as 0), ``score`` (the weighted share, 0..1), ``passed`` (score at
    the certificate threshold), each lesson's standing, the lessons passed ("01", ...), the checks
    passed and the overrides applied."""

    student: str
    points: float
    max_points: float
    score: float
    passed: bool
    lessons: dict = field(default_factory=dict)
    lessons_passed: tuple = ()
    checks_passed: tuple = ()
    categories: dict = field(default_factory=dict)
    overrides: tuple = ()
    lesson_checks: dict = field(default_factory=dict)  # lesson number -> the checks passed in it


def _shares(rows, maxima_by_category) -> dict:
    earned = {c: 0.0 for c in maxima_by_category}
    for r in rows:
        earned[r.category or "exercises"] = earned.get(r.category or "exercises", 0.0) + r.points
    return {c: (earned.get(c, 0.0), m) for c, m in maxima_by_category.items()}


def categorized(rows, policy: Policy) -> list[Row]:
    """``rows`` with every category filled in (rows made elsewhere may leave it empty)."""
    capstone = capstone_lesson(policy) if any(not r.category for r in rows) else None
    return [r if r.category else replace(r, category=policy.category(r.exercise, r.lesson, capstone)) for r in rows]


def standings(rows, policy: Policy | None = None, overrides=()) -> dict:
    """``{student: Standing}`` for every student of ``rows`` (already graded rows; ``overrides``
    applied here)."""
    policy = policy or Policy()
    rows, _ = apply_overrides(categorized(rows, policy), overrides)
    maxima = lesson_maxima(rows)
    course = {}
    for categories in maxima.values():
        for c, m in categories.items():
            course[c] = course.get(c, 0.0) + m
    out = {}
    for student in dict.fromkeys(r.student for r in rows):
        mine = [r for r in rows if r.student == student and r.lesson != "?"]
        lessons = {}
        for lesson, categories in sorted(maxima.items()):
            graded = [r for r in mine if r.lesson == lesson]
            score = policy.score(_shares(graded, categories))
            lessons[lesson] = LessonStanding(sum(r.points for r in graded), sum(categories.values()), score,
                                             score >= policy.threshold - 1e-9)
        shares = _shares(mine, course)
        score = policy.score(shares)
        out[student] = Standing(
            student, sum(r.points for r in mine), sum(course.values()), score, score >= policy.threshold - 1e-9,
            lessons, tuple(lesson_number(lesson) for lesson, s in lessons.items() if s.passed),
            tuple(r.exercise for r in mine if r.passed), shares,
            tuple((r.exercise, r.override) for r in mine if r.override),
            {lesson_number(lesson): tuple(r.exercise for r in mine if r.lesson == lesson and r.passed)
             for lesson in lessons})
    return out


def standing(student: str, gradebook, policy=None, overrides=None) -> Standing:
    """One student's ``Standing``: ``gradebook`` is rows or a ``grades.csv`` written by ``grade``;
    ``policy`` a ``Policy``, a policy file or None (the defaults); ``overrides`` a file or a list of
    ``Override``. What certificates call (``course.certificate``)."""
    policy = policy if isinstance(policy, Policy) else Policy.load(policy)
    rows = read_gradebook(gradebook, policy) if isinstance(gradebook, (str, Path)) else list(gradebook)
    overrides = load_overrides(overrides) if isinstance(overrides, (str, Path)) else list(overrides or [])
    table = standings(rows, policy, overrides)
    if student not in table:
        raise ValueError(f"no rows for student {student!r} in")
    return table[student]


def summary_rows(rows, policy: Policy, roster: Roster | None = None) -> tuple[list[str], list[list]]:
    """The summary table: header and one row per student (``rows`` with overrides applied)."""
    table = standings(rows, policy)
    lessons = sorted(lesson_maxima(rows))
    header = ["student", "email", *(f"{lesson} {what}" for lesson in lessons for what in ("points", "max")),
              *(f"{c} %" for c in CATEGORIES), "total points", "total max", "score %", "lessons passed"]
    body = []
    for student, s in table.items():
        on_roster = roster.by_id(student) if roster else None
        cells = [student, on_roster.email if on_roster else ""]
        for lesson in lessons:
            cells += [f"{s.lessons[lesson].points:g}", f"{s.lessons[lesson].max_points:g}"]
        cells += [f"{100 * p / m:.1f}" if m else "" for p, m in (s.categories.get(c, (0, 0)) for c in CATEGORIES)]
        cells += [f"{s.points:g}", f"{s.max_points:g}", f"{100 * s.score:.1f}", " ".join(s.lessons_passed)]
        body.append(cells)
    return header, body


def summarize(rows, out, policy=None, roster=None, overrides=(), summary=None, feedback_dir=None,
              submissions=None, references=None) -> dict:
    """Write the gradebook, summary, LMS exports, similarity report and feedback for ``rows``
    beside ``out``; returns ``{what: path}``."""
    policy = policy if isinstance(policy, Policy) else Policy.load(policy)
    roster = roster if isinstance(roster, Roster) or roster is None else Roster.load(roster)
    overrides = load_overrides(overrides) if isinstance(overrides, (str, Path)) else list(overrides or [])
    out = Path(out)
    final, unmatched = apply_overrides(rows, overrides)
    for o in unmatched:
        print(f"parallel-lab grade: WARNING: override on line {o.line} ({o.student}, {o.check}) matches no graded "
              f"check", file=sys.stderr, flush=True)
    written = {"gradebook": write_gradebook(final, out)}
    header, body = summary_rows(final, policy, roster)
    written["summary"] = _write_csv(Path(summary) if summary else out.with_name(f"{out.stem}-summary.csv"),
                                    header, body)
    table = standings(final, policy)
    lessons = sorted(lesson_maxima(final))
    written["canvas"] = exports.write_canvas(out.with_name(f"{out.stem}-canvas.csv"), table, lessons, roster)
    written["moodle"] = exports.write_moodle(out.with_name(f"{out.stem}-moodle.csv"), table, lessons, roster)
    if submissions is not None:
        written["submissions"] = _write_csv(out.with_name("submissions.csv"), SUBMISSION_COLUMNS, [
            [s.student, s.folder, s.lesson, str(s.path),
             _dt.datetime.fromtimestamp(s.modified).isoformat(timespec="seconds"), "yes" if s.graded else "no", s.note]
            for s in submissions])
    written["similarity"] = similarity.write_report(out.with_name("similarity.csv"),
                                                    similarity.report(final, policy.similarity, references))
    written["feedback"] = write_feedback(final, Path(feedback_dir) if feedback_dir else out.parent / "feedback",
                                         submissions or ())
    if any(r.exercise in policy.rubric for r in final):
        written["analyses"] = write_analyses(final, out.with_name("capstone-analyses.md"), policy)
    return written


def analyses_text(rows, policy: Policy) -> str:
    """The texts a person scores (checks with a rubric in ``policy``), one section per student, with
    the rubric, the automatic verdict of the same lesson's other checks beside it, the points the
    text has so far and how to enter a score (an override)."""
    lines = ["# Written analyses to score", "",
             "Score each against its rubric and enter the points as an override (student, check, points, "
             "reason): docs/instructors.md, 'The capstone'.", ""]
    for check in dict.fromkeys(r.exercise for r in rows if r.exercise in policy.rubric):
        lines += [f"## {check}", "", "Rubric:", "", policy.rubric_text(check), ""]
        for r in (r for r in rows if r.exercise == check):
            beside = [o for o in rows if o.student == r.student and o.lesson == r.lesson and o.exercise != check
                      and not o.exercise.startswith("quiz:")]
            lines += [f"### {r.student} ({r.lesson}): {r.points:g} of {r.max_points:g} points"
                      + (f" (override: {r.override})" if r.override else ""), ""]
            for o in beside:
                lines += ["```", *(o.detail or o.reason or ("passed" if o.passed else "")).splitlines(), "```", ""]
            text = r.detail or r.answer
            lines += [*("> " + line for line in text.splitlines())] if text else [f"(nothing to score: {r.reason})"]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_analyses(rows, path: Path, policy: Policy) -> Path:
    path.write_text(analyses_text(rows, policy), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# Files.


def _write_csv(path: Path, header, body) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(body)
    return path


def write_summary(rows, path, policy=None, roster=None) -> Path:
    """The per-student summary (``summary_rows``) of graded rows, written to ``path``."""
    policy = policy if isinstance(policy, Policy) else Policy.load(policy)
    header, body = summary_rows(categorized(list(rows), policy), policy, roster)
    return _write_csv(Path(path), header, body)


def write_gradebook(rows, path) -> Path:
    return _write_csv(Path(path), GRADEBOOK_COLUMNS, [row.csv_row() for row in rows])


def read_gradebook(path, policy: Policy | None = None) -> list[Row]:
    """The rows of a ``grades.csv`` (an older one, without the policy's columns, too: its
    categories are inferred from the check ids)."""
    policy = policy or Policy()
    capstone = capstone_lesson(policy)
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            lesson, check = row["lesson"], row["exercise"]
            rows.append(Row(
                row["student"], lesson, check, row["passed"] == "true", float(row["points"] or 0),
                float(row["max_points"] or 0), row.get("reason", ""), row.get("submission", ""),
                sandbox=row.get("sandbox", ""),
                cases=(int(row.get("cases_passed") or 0), int(row.get("cases_tried") or 0)),
                category=row.get("category") or policy.category(check, lesson, capstone),
                override=row.get("override", ""), lang=row.get("lang") or DEFAULT))
    return rows


def feedback_text(student: str, rows, superseded=()) -> str:
    """A student's feedback: per submission, the score and every check with why it failed, the
    quiz's explanations for the questions answered wrong, and regrades with their reasons. Each
    submission's part is in its lesson's language (``Row.lang``), the head in the first one's."""
    with using(rows[0].lang if rows else DEFAULT):
        lines = [_("# Feedback for {student}").format(student=student), ""]
    for submission in dict.fromkeys(r.submission for r in rows):
        mine = [r for r in rows if r.submission == submission]
        with using(mine[0].lang):
            lines += _submission_feedback(submission, mine)
    later = [s for s in superseded if not s.graded]
    if later:
        with using(rows[0].lang if rows else DEFAULT):
            lines += [_("## Not graded"), ""]
        lines += [f"- {Path(s.path).name} ({s.lesson}): {s.note}" for s in later] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _submission_feedback(submission: str, mine: list) -> list[str]:
    got, total = sum(r.points for r in mine), sum(r.max_points for r in mine)
    lines = [f"## {mine[0].lesson} ({Path(submission).name})", "",
             _("Score: {points} of {total} points").format(points=f"{got:g}", total=f"{total:g}"), ""]
    for r in mine:
        verdict = _("passed") if r.passed else _("FAILED: {reason}").format(reason=r.reason)
        points = ngettext("{points} of {total} point", "{points} of {total} points", 1 if r.max_points == 1 else 2
                          ).format(points=f"{r.points:g}", total=f"{r.max_points:g}")
        if r.cases[1] > 1 and not r.passed:
            points = _("{points}, {passed} of {tried} cases").format(points=points, passed=r.cases[0],
                                                                    tried=r.cases[1])
        lines.append(_("- {check} ({points}): {verdict}").format(check=r.exercise, points=points, verdict=verdict))
        if r.override:
            lines.append(_("  Regraded by your instructor: {why}").format(why=r.override))
        if r.detail and not r.passed:
            lines += ["", "  ```", *("  " + line for line in r.detail.splitlines()), "  ```", ""]
        for item in r.feedback:
            lines += ["", *("  " + line for line in item.splitlines())]
    return lines + [""]


def write_feedback(rows, directory: Path, submissions=()) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for student in dict.fromkeys(r.student for r in rows):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in student) or "unknown"
        path = directory / f"{safe}.md"
        path.write_text(feedback_text(student, [r for r in rows if r.student == student],
                                      [s for s in submissions if s.student == student]), encoding="utf-8")
    return directory
