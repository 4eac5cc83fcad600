"""The similarity report: pairs of students whose answers are near-identical, for the instructor to
look at. It is a list, not a verdict: two students may reach the same short answer on their own,
and the report says how much each pair wrote beyond the lesson's scaffold so that a reader can
weigh it.

    pairs = report(rows, threshold=0.9, references=refs)   # rows of one grading run
    write_report("similarity.csv", pairs)

**Exercises.** Each answer cell is normalised as the copy check normalises it
(``exercises.copies``: names, layout, comments and docstrings set aside); what the lesson's own
answer cell already holds (the signature, the stub's surroundings) is trimmed from both ends, so
that only what the student wrote is compared; answers that are still the stub, or whose own part
is shorter than ``MIN_OWN_TOKENS``, are left out (every right answer to a two-line exercise looks
alike). Pairs at least ``threshold`` alike (difflib's ratio) are listed.

**Written answers and runs.** An answer that is prose (the capstone's analysis, a markdown cell)
is compared word by word (lowercased; at least ``MIN_OWN_WORDS`` words beyond the lesson's
placeholder). A capstone hand-in is listed with another when both hold the record of one and the
same run (its random nonce: ``exercises.capstone``), whatever their plans.

**Quizzes.** Every student's graded quiz is their own variant (``course.quiz.variant``): options
in their own order, numbers drawn for them. A sheet that scores more on another student's variant
than on its owner's, and at least that variant's pass mark, was written for the other student's
quiz; the pair is listed with both scores.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from parallel_lab.course import tags
from parallel_lab.exercises import REGISTRY
from parallel_lab.exercises.copies import similarity, tokens

MIN_OWN_TOKENS = 20
MIN_OWN_WORDS = 20
REPORT_COLUMNS = ("lesson", "check", "student_a", "student_b", "similarity", "own_tokens_a", "own_tokens_b", "note")


@dataclass(frozen=True)
class Pair:
    lesson: str
    check: str
    student_a: str
    student_b: str
    similarity: float
    own_a: int
    own_b: int
    note: str = ""


def own_tokens(source: str, scaffold: tuple) -> tuple:
    """The answer's normalised tokens less the scaffold's common prefix and suffix; () when it does
    not parse."""
    try:
        mine = tokens(source)
    except (SyntaxError, ValueError, RecursionError):
        return ()
    start = 0
    while start < min(len(mine), len(scaffold)) and mine[start] == scaffold[start]:
        start += 1
    end = 0
    while end < min(len(mine), len(scaffold)) - start and mine[-1 - end] == scaffold[-1 - end]:
        end += 1
    return mine[start:len(mine) - end]


def scaffolds(references) -> dict:
    """``{(lesson, check): normalised tokens of the reference's answer cell}``."""
    out = {}
    for ref in references or ():
        nb = nbformat.read(ref.path, as_version=4)
        for cell in nb.cells:
            check = tags.answer(cell)
            if check:
                try:
                    out[(ref.lesson, check)] = tokens(cell.source)
                except (SyntaxError, ValueError):
                    out[(ref.lesson, check)] = ()
    return out


def unwritten(row) -> bool:
    """Whether a row's answer is still its lesson's stub: its exercise says "not yet" from the source
    alone (``Exercise.screen``), whatever language the verdict was written in."""
    exercise = REGISTRY.get(row.exercise)
    if exercise is None:
        return False
    try:
        screened = exercise.screen(row.answer)
    except (SyntaxError, ValueError):
        return False
    return screened is not None and screened.not_yet


def code_pairs(rows, threshold: float, references=None) -> list[Pair]:
    """Near-identical exercise answers, per lesson and check, most alike first."""
    frames = scaffolds(references)
    by_check: dict = {}
    for r in rows:
        if r.category == "quizzes" or r.exercise.startswith(("quiz:", "predict:")) or not r.answer:
            continue
        if unwritten(r):
            continue
        own = own_tokens(r.answer, frames.get((r.lesson, r.exercise), ()))
        if len(own) >= MIN_OWN_TOKENS:
            by_check.setdefault((r.lesson, r.exercise), []).append((r.student, own))
    pairs = []
    for (lesson, check), answers in sorted(by_check.items()):
        for i, (a, own_a) in enumerate(answers):
            for b, own_b in answers[i + 1:]:
                ratio = similarity(own_a, own_b)
                if ratio >= threshold:
                    pairs.append(Pair(lesson, check, a, b, ratio, len(own_a), len(own_b)))
    return sorted(pairs, key=lambda p: (-p.similarity, p.lesson, p.check, p.student_a, p.student_b))


def sheet_pairs(rows) -> list[Pair]:
    """Quiz sheets that fit another student's variant better than their own (``course.quiz.variant``)."""
    from parallel_lab.course.grading.runner import answer_sheet
    from parallel_lab.course.quiz.bank import load
    from parallel_lab.course.quiz.variant import score_for

    by_quiz: dict = {}
    for r in rows:
        if r.exercise.startswith("quiz:") and r.answer:
            sheet = answer_sheet(r.answer)
            if isinstance(sheet, dict) and any(v not in (None, "", []) for v in sheet.values()):
                by_quiz.setdefault((r.lesson, r.exercise), []).append((r.student, sheet))
    pairs = []
    for (lesson, check), sheets in sorted(by_quiz.items()):
        bank = load(check.split(":", 1)[1])
        for owner, sheet in sheets:
            own = score_for(bank, sheet, owner)
            for other, _ in sheets:
                if other == owner:
                    continue
                theirs = score_for(bank, sheet, other)
                if theirs.points > own.points and theirs.passed:
                    pairs.append(Pair(lesson, check, owner, other, theirs.points / theirs.total, 0, 0,
                                      f"{owner}'s sheet scores {theirs.points:g} of {theirs.total:g} on {other}'s "
                                      f"quiz and {own.points:g} on its own"))
    return pairs


def _words(text: str) -> list:
    return re.findall(r"\w+", text.lower())


def _parses(source: str) -> bool:
    try:
        tokens(source)
        return True
    except (SyntaxError, ValueError, RecursionError):
        return False


def text_pairs(rows, threshold: float, references=None) -> list[Pair]:
    """Near-identical prose answers (written analyses), per lesson and check."""
    placeholders = {}
    for ref in references or ():
        for check, text in getattr(ref, "texts", {}).items():
            placeholders[(ref.lesson, check)] = _words(text)
    by_check: dict = {}
    for r in rows:
        if not r.answer or r.exercise.startswith(("quiz:", "predict:")) or _parses(r.answer):
            continue
        words = _words(r.answer)
        if words != placeholders.get((r.lesson, r.exercise)) and len(words) >= MIN_OWN_WORDS:
            by_check.setdefault((r.lesson, r.exercise), []).append((r.student, words))
    pairs = []
    for (lesson, check), answers in sorted(by_check.items()):
        for (a, words_a), (b, words_b) in itertools.combinations(answers, 2):
            ratio = similarity(words_a, words_b)
            if ratio >= threshold:
                pairs.append(Pair(lesson, check, a, b, ratio, len(words_a), len(words_b), "written answers alike, "
                                  "word by word"))
    return pairs


def _run_of(answer: str) -> str | None:
    """The nonce of the run whose record a capstone hand-in holds, or None."""
    from parallel_lab.exercises.capstone import read_record

    try:
        hand = json.loads(answer)
    except ValueError:
        return None
    record = read_record(hand.get("record", "")) if isinstance(hand, dict) else None
    return record.get("nonce") if isinstance(record, dict) and isinstance(record.get("nonce"), str) else None


def run_pairs(rows) -> list[Pair]:
    """Capstone hand-ins that hold the record of the same run."""
    by_run: dict = {}
    for r in rows:
        nonce = _run_of(r.answer) if r.answer.startswith("{") else None
        if nonce:
            by_run.setdefault((r.lesson, r.exercise, nonce), []).append(r.student)
    pairs = []
    for (lesson, check, _nonce), students in sorted(by_run.items()):
        for a, b in itertools.combinations(sorted(students), 2):
            pairs.append(Pair(lesson, check, a, b, 1.0, 0, 0, "the record of the same run (its nonce) in both "
                              "hand-ins"))
    return pairs


def report(rows, threshold: float = 0.9, references=None) -> list[Pair]:
    """Every pair the instructor should look at: near-identical exercise answers and written answers,
    hand-ins with the record of one run, and quiz sheets written for another student's quiz."""
    return code_pairs(rows, threshold, references) + text_pairs(rows, threshold, references) + run_pairs(rows) + \
        sheet_pairs(rows)


def write_report(path, pairs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(REPORT_COLUMNS)
        for p in pairs:
            writer.writerow([p.lesson, p.check, p.student_a, p.student_b, f"{p.similarity:.3f}", p.own_a or "",
                             p.own_b or "", p.note])
    return path
