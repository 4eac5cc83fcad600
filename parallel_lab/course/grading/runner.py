"""Grade one submitted notebook: read its answer cells, check them out of the submission's reach.

    rows = grade_submission("submissions/ada/01_ranks_and_collectives.ipynb", reference, "ada", sandbox)

**What runs, and where.** The submission is read as data (nbformat); none of its cells is executed
by the grader. For each check of the reference lesson the grader takes the source of the matching
answer cell (by tag ``answer:ID``, else by the reference's cell id):

- an **exercise**'s answer goes, with the others of the submission, to one fresh checking process
  (``grading.checker``) inside the sandbox (``grading.sandbox``): the process reviews each answer,
  runs it only on rank processes, and computes each verdict itself; verdicts come back on a pipe
  no rank holds;
- a **quiz**'s answer sheet is read as a literal (``ast.literal_eval``: a dict of answers; never
  executed) and scored here against the student's own graded quiz (``course.quiz.variant``: the
  options in their order, their numbers, drawn from the student id the roster gives);
- a graded **prediction**'s ``my_prediction`` is read as data (``course.predictions.read_prediction``)
  and scored here against the reference the grader computes (never the submission's outputs);
- the **capstone** (``exercises.capstone``) is an exercise whose answer also holds the record its
  run printed (read from the submission's outputs as text, never executed); its checking process
  recomputes the prediction and runs the plan itself;
- a check with a **rubric** in the policy (the capstone's written analysis, a markdown cell) is
  scored by a person: its row has no points and carries the text (``detail``) for the instructor.

So no other cell, no edited output, no patch of the library or of torch in the student's kernel
changes a grade: the kernel never runs. A submission is graded in its reference lesson's language
(``Reference.lang``: a zh-Hant edition's checks and points are the English one's): the verdicts,
reasons and feedback are written under ``i18n.using`` that language, and the checking process is
told it in its job. What a grade proves, and what it does not: docs/instructors.md, "What the
checks test".
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from parallel_lab.course import tags
from parallel_lab.course.grading.policy import Policy
from parallel_lab.course.grading.reference import Check, Reference
from parallel_lab.course.grading.sandbox import Limits, Sandbox
from parallel_lab.course.predictions import grade as grade_prediction
from parallel_lab.course.quiz.bank import load
from parallel_lab.course.quiz.check import InvalidResponse, feedback, format_value, normalise, score, verdict
from parallel_lab.course.quiz.variant import variant
from parallel_lab.exercises import REGISTRY
from parallel_lab.i18n import DEFAULT, _, language, using

CHECKER = [sys.executable, "-m", "parallel_lab.course.grading.checker"]


@dataclass(frozen=True)
class Row:
    """One gradebook row: the student (their id), the lesson, the check (``exercise``), whether it
    passed, the points under the grading policy (``cases``: cases passed and tried, which partial
    credit counts), why it failed. ``detail`` (the verdict, with expected and actual) and
    ``feedback`` (the quiz's explanations of wrong answers) go to the student's feedback;
    ``answer`` (the answer cell's source) to the similarity report; ``override`` says why an
    instructor changed the points."""

    student: str
    lesson: str
    exercise: str
    passed: bool
    points: float
    max_points: float
    reason: str
    submission: str = ""
    detail: str = ""
    sandbox: str = ""
    cases: tuple = (0, 0)
    category: str = ""
    override: str = ""
    answer: str = ""
    feedback: tuple = ()
    lang: str = DEFAULT

    def csv_row(self) -> list:
        return [self.student, self.lesson, self.exercise, "true" if self.passed else "false",
                f"{self.points:g}", f"{self.max_points:g}", self.reason, self.sandbox, self.cases[0], self.cases[1],
                self.category, self.override, self.submission, self.lang]


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "").strip()


def read_notebook(path: Path):
    """The submission as a notebook, or the reason it is not one (never its content)."""
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("it has no list of cells")
        return nb
    except Exception as exc:  # anything unreadable is "not a notebook", with the parser's words
        words = first_line(str(exc)).split(": '")[0] or type(exc).__name__  # not the file's content
        return _("not a notebook: {why}").format(why=words[:120])


class Missing(str):
    """Why a check has no answer to read (a reason, not a source)."""


def answer_sources(nb, checks, written=()) -> dict:
    """check id -> the source of its answer cell in ``nb``, or ``Missing(reason)``. The checks of
    ``written`` (scored by a person) answer in a markdown cell; the others in a code cell."""
    by_tag = {tags.answer(c): c for c in nb.cells if tags.answer(c)}
    by_id = {c.get("id"): c for c in nb.cells if c.get("id")}
    found = {}
    for check in checks:
        cell = by_tag.get(check.id) or by_id.get(check.answer_cell_id)
        if cell is None:
            found[check.id] = Missing(_("answer cell deleted (the cell tagged answer:{check})").format(check=check.id))
        elif cell.get("cell_type") != ("markdown" if check.id in written else "code"):
            found[check.id] = Missing((_("answer cell answer:{check} is not a markdown cell") if check.id in written
                                       else _("answer cell answer:{check} is not a code cell")).format(check=check.id))
        else:
            found[check.id] = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    return found


def answer_sheet(source: str):
    """The quiz answers of an answer-sheet cell (``my_answers = {...}``), read as a literal, or the
    reason it cannot be read. Nothing in the cell is executed."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return _("the answer sheet does not parse: {message} (line {line})").format(message=err.msg, line=err.lineno)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "my_answers" for t in node.targets):
            try:
                sheet = ast.literal_eval(node.value)
            except ValueError:
                return _("the answer sheet is not a plain dict of answers (the grader reads it, it never runs "
                         "it): write only strings, numbers, lists and None in it")
            return sheet if isinstance(sheet, dict) else _("my_answers is not a dict")
    return _("the answer sheet cell defines no my_answers")


def claimed_student(nb) -> str | None:
    """The ``my_student_id`` a submission's student-id cell holds (read as a literal), or None."""
    for cell in nb.cells:
        if "student-id" in tags.of(cell):
            try:
                for node in ast.parse(cell.source if isinstance(cell.source, str) else "".join(cell.source)).body:
                    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "my_student_id"
                                                            for t in node.targets):
                        value = ast.literal_eval(node.value)
                        return None if value is None else str(value)
            except (SyntaxError, ValueError):
                return None
    return None


def _wrong_line(item, response) -> str:
    """One wrong quiz answer for the feedback, in the process's language: the item, a numeric answer
    with the item's unit (``3 個區塊`` in a zh-Hant edition), and the quiz's explanation."""
    message = feedback(item, response).message or _("not answered")
    if item.kind == "numeric" and response not in (None, ""):
        try:
            value = normalise(item, response)
        except InvalidResponse:
            return f"{item.id}: {message}"
        return f"{item.id} ({format_value(item, value, language())}): {message}"
    return f"{item.id}: {message}"


def quiz_row(check: Check, source, row, student: str, claimed: str | None = None):
    """The quiz's row: the sheet scored against ``student``'s graded quiz (``course.quiz.variant``;
    the roster's id, never the one the notebook claims), with the practice quiz's explanation of
    each wrong answer for the feedback."""
    if isinstance(source, Missing):
        return row(check, False, source)
    sheet = answer_sheet(source)
    if isinstance(sheet, str):
        return row(check, False, sheet)
    bank = variant(load(check.quiz), student)
    result = score(bank, sheet)
    text = verdict(result)
    if claimed is not None and claimed != student:
        text += "\n" + _("  (this notebook's my_student_id is {claimed!r}; the quiz was graded as {student!r}'s, the "
                         "id your instructor's roster gives this submission)").format(claimed=claimed, student=student)
    wrong = tuple(_wrong_line(item, result.responses.get(item.id)) for item in bank.items
                  if result.status[item.id] != "correct")
    return row(check, result.passed, "" if result.passed else first_line(text), text,
               cases=(int(result.points), int(result.total)), feedback=wrong)


def prediction_row(check: Check, source, row):
    if isinstance(source, Missing):
        return row(check, False, source)
    verdict = grade_prediction(check.prediction, str(source))
    return row(check, verdict.passed, verdict.reason, str(verdict), cases=(int(verdict.passed), 1))


def written_row(check: Check, source, row, policy: Policy, reference_text: str = ""):
    """The row of a check a person scores (its rubric in ``policy``): no points until the
    instructor's override; the text goes to the feedback and the analyses file."""
    if isinstance(source, Missing):
        return row(check, False, source)
    text = str(source).strip()
    if not text or text == reference_text.strip():
        return row(check, False, _("no analysis written (the cell still holds the lesson's placeholder)"))
    why = _("to be scored by your instructor ({points:g} points, rubric in the grading policy)")
    return row(check, False, why.format(points=policy.rubric_points(check.id)), text, cases=(0, 1))


def run_checks(jobs: list[dict], sandbox: Sandbox, limits: Limits, modules=(), env=None,
               lang: str = DEFAULT) -> tuple[dict, str]:
    """Run the exercise checks ``[{"id", "source"}]`` in one sandboxed checking process, whose
    verdicts are in ``lang``: ``({id: verdict record}, why the process stopped early or "")``."""
    with tempfile.TemporaryDirectory(prefix="parallel-lab-grade-") as tmp:
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        job = json.dumps({"checks": jobs, "modules": list(modules), "lang": lang}).encode()
        # Ranks fork from the checking process, which runs torch on one thread (see runtime.pool.start_method).
        result = sandbox.run(CHECKER, job, scratch, limits, env={"PARALLEL_LAB_START_METHOD": "fork", **(env or {})})
    records = {}
    for line in result.data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
            records[record["id"]] = record
        except (ValueError, KeyError, TypeError):
            continue
    why = ""
    if len(records) < len(jobs):
        if result.killed_for:
            why = _("the submission {what}").format(what=result.killed_for)
        else:
            last = first_line(result.stderr.decode(errors="replace").strip().splitlines()[-1]) \
                if result.stderr.strip() else "no output"
            why = _("the checking process ended with exit status {status} ({last})").format(
                status=result.returncode, last=last[:160])
    return records, why


def grade_submission(path, reference: Reference, student: str, sandbox: Sandbox, limits: Limits = Limits(),
                     modules=(), env=None, policy: Policy | None = None,
                     capstone_lesson: str | None = None) -> list[Row]:
    """Grade one submission against ``reference``: one Row per check, in the reference's order, its
    points under ``policy`` (default: ``Policy()``; partial credit counts the verdict's cases), its
    words in the reference's language."""
    with using(reference.lang):
        return _grade_submission(Path(path), reference, student, sandbox, limits, modules, env,
                                 policy, capstone_lesson)


def _grade_submission(path: Path, reference: Reference, student: str, sandbox: Sandbox, limits: Limits,
                      modules, env, policy: Policy | None, capstone_lesson: str | None) -> list[Row]:
    policy = policy or Policy()
    sources: dict = {}

    def row(check, passed, reason="", detail="", cases=None, feedback=()):
        category = policy.category(check.id, reference.lesson, capstone_lesson)
        cases = cases if cases is not None else (int(passed), 1)
        answer = sources.get(check.id)
        return Row(student, reference.lesson, check.id, passed, policy.points(category, check.points, passed, cases),
                   check.points, reason, str(path), detail, sandbox.kind, tuple(cases), category,
                   answer="" if answer is None or isinstance(answer, Missing) else str(answer), feedback=feedback,
                   lang=reference.lang)

    nb = read_notebook(path)
    if isinstance(nb, str):
        return [row(check, False, nb) for check in reference.checks]
    written = set(policy.rubric)
    sources.update(answer_sources(nb, reference.checks, written))
    for c in reference.checks:  # an exercise whose answer also reads the notebook (the capstone's record)
        gather = getattr(REGISTRY.get(c.id), "gather", None)
        if gather is not None and not isinstance(sources[c.id], Missing):
            sources[c.id] = gather(nb, str(sources[c.id]))
    # What the source alone decides (a stub, a refused import) needs no process: an untouched
    # notebook is graded at once. Everything else goes to the sandboxed checker.
    records, jobs = {}, []
    for c in reference.checks:
        if c.quiz or c.prediction or c.id in written or isinstance(sources[c.id], Missing):
            continue
        exercise = REGISTRY.get(c.id)
        screened = exercise.screen(str(sources[c.id])) if exercise is not None else None
        if screened is not None:
            records[c.id] = {"id": c.id, "passed": False, "not_yet": screened.not_yet, "lines": screened.lines,
                             "cases": list(screened.cases), "reason": screened.reason}
        else:
            jobs.append({"id": c.id, "source": str(sources[c.id])})
    checked, why = run_checks(jobs, sandbox, limits, modules, env, reference.lang) if jobs else ({}, "")
    records.update(checked)
    rows = []
    for check in reference.checks:
        source = sources[check.id]
        if check.quiz:
            rows.append(quiz_row(check, source, row, student, claimed_student(nb)))
        elif check.prediction:
            rows.append(prediction_row(check, source, row))
        elif check.id in written:
            rows.append(written_row(check, source, row, policy, reference.texts.get(check.id, "")))
        elif check.id in records:
            record = records[check.id]
            text = "\n".join(record["lines"])
            # The verdict's own reason (Verdict.reason: the line made as a failure), never a search for
            # words, which are in the submission's language.
            reason = "" if record["passed"] else str(record.get("reason") or first_line(text))
            rows.append(row(check, bool(record["passed"]), reason, text, tuple(record.get("cases") or (0, 0))))
        elif any(j["id"] == check.id for j in jobs):
            rows.append(row(check, False, _("not checked: {why}").format(why=why)))
        else:
            rows.append(row(check, False, str(source)))
    return rows
