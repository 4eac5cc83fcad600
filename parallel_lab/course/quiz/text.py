"""The quiz as plain text: for a terminal, a notebook where widgets do not render, and for grading.

    from parallel_lab.course.quiz import show, answer, graded_quiz, check_quiz
    show("01")                                   # practice: every question with its options (no answers)
    answer("01", "ring-bytes", 112)              # practice: instant feedback on one answer, retry at will
    graded_quiz("01", "s1234567")                # the student's graded quiz: own option order, own numbers
    my_answers = {"collectives/identity": "b", ...}
    check_quiz("01", my_answers, "s1234567")     # the graded check: the score, not which answers are wrong

Everything printed is a pure function of the bank, the student id and the responses, so nbval can
compare it, and no answer key is printed unless the student's own practice answer earns its
explanation. The graded check scores the choice questions of the student's own quiz (how many
points, never which); its numeric questions carry numbers drawn for that student, and only the
instructor's grader scores them (``course.quiz.variant``): the notebook cannot be asked whether
a number is right for them.
"""

from __future__ import annotations

import json
import textwrap

from parallel_lab.i18n import _, _l, language, ngettext, using

from .bank import LANGUAGES, Bank, Item, load, localize
from .check import Feedback, Score, feedback, score_choices
from .variant import variant

WIDTH = 100
# How a question says what kind of answer it takes (the widget shows the same words).
KIND_NOTE = {"single": _l("one answer"), "multiple": _l("all that apply"), "numeric": _l("a number")}


def kind_note(kind: str, lang: str | None = None) -> str:
    """``one answer`` / ``all that apply`` / ``a number`` in ``lang`` (default: the process's)."""
    with using(lang or language()):
        return str(KIND_NOTE[kind])


def _bank(lesson) -> Bank:
    return lesson if isinstance(lesson, Bank) else load(str(lesson))


def _check_lang(bank: Bank, lang: str | None) -> str:
    """``lang`` (default: the process's language, ``parallel_lab.i18n``) when the bank has it."""
    lang = lang or language()
    if lang not in bank.languages:
        raise ValueError(f"quiz {bank.id} is available in {', '.join(bank.languages)}, not {lang!r}")
    return lang


def _wrap(text: str, indent: str) -> str:
    return "\n".join(textwrap.fill(p, WIDTH, initial_indent=indent, subsequent_indent=indent)
                     for p in text.split("\n"))


def item_text(item: Item, number: int, lang: str = "en", faq_question: str | None = None) -> str:
    """One question as text: number, id, kind, prompt and options (keys and texts only)."""
    with using(lang):
        unit = _(", in {unit}").format(unit=item.unit_text(lang)) if item.kind == "numeric" and item.unit else ""
        points = ngettext("{n} point", "{n} points", 1 if item.points == 1 else 2).format(n=f"{item.points:g}")
        head = _("Q{number} [{id}] ({kind}{unit}, {points})").format(
            number=number, id=item.id, kind=str(KIND_NOTE[item.kind]), unit=unit, points=points)
    lines = [head]
    if faq_question:
        lines.append(_wrap(f"FAQ {item.faq}: {faq_question}", "   "))
    lines.append(_wrap(item.prompt_text(lang), "   "))
    lines += [_wrap(f"({o.key}) {localize(o.text, lang)}", "     ") for o in item.options]
    return "\n".join(lines)


def quiz_text(lesson, lang: str | None = None, practice: bool = True) -> str:
    """The whole quiz as text, with how to answer it (in practice: with ``answer``; graded: in the
    answer sheet)."""
    bank = _bank(lesson)
    lang = _check_lang(bank, lang)
    faq = {e["entry"]: localize(e["question"], lang) for e in bank.faq}
    name = bank.lesson or bank.id
    with using(lang):
        parts = [_("Quiz: {title} — {questions} questions, {points} points, pass mark {needed}").format(
            title=localize(bank.title, lang), questions=len(bank.items), points=f"{bank.total_points:g}",
            needed=f"{bank.points_needed():g}")]
        if len(bank.languages) > 1:
            how = f"show({name!r}" if practice else f"graded_quiz({name!r}, my_student_id"
            parts.append(_("Languages: {languages}; e.g. {call})").format(
                languages=", ".join(f"{code} ({LANGUAGES[code]})" for code in bank.languages),
                call=f"{how}, lang={bank.languages[-1]!r}"))
        parts += [item_text(item, n, lang, faq.get(item.faq)) for n, item in enumerate(bank.items, 1)]
        if practice:
            parts.append(_wrap(_("Practise one question: {call}. Your graded quiz ({graded}) asks the same questions "
                                 "with the options in your own order and your own numbers.").format(
                call=f"answer({name!r}, \"{bank.items[0].id}\", <your answer>)",
                graded=f"graded_quiz({name!r}, my_student_id)"), ""))
        else:
            parts.append(_wrap(_("Hand in: write your answers in the answer sheet (my_answers); {call} prints your "
                                 "points on the choice questions.").format(
                call=f"check_quiz({name!r}, my_answers, my_student_id)"), ""))
    return "\n\n".join(parts)


def show(lesson, lang: str | None = None) -> None:
    """Print the quiz as text (questions and options, never the answers)."""
    print(quiz_text(lesson, lang))


def answer(lesson, item_id: str, response, lang: str | None = None) -> Feedback:
    """Check one answer and print the feedback; retry as often as you like. Returns the Feedback."""
    bank = _bank(lesson)
    item = bank.item(item_id)
    result = feedback(item, response, _check_lang(bank, lang))
    print(f"{item.id}: {result.message or _('no answer given')}")
    return result


def sheet_template(lesson) -> str:
    """The answer-sheet cell for a lesson: every question id, unanswered."""
    bank = _bank(lesson)
    width = max(len(item.id) for item in bank.items) + 3
    what = {"single": _("one option key"), "multiple": _("a list of option keys"), "numeric": _("a number")}
    rows = [f"    {json.dumps(item.id) + ':':{width}} None,  # {what[item.kind]}" for item in bank.items]
    return "my_answers = {\n" + "\n".join(rows) + "\n}"


# What the graded quiz says (``graded_quiz``, ``check_quiz``); translated (parallel_lab.i18n).
GRADED = {
    "no_id": _l("Your graded quiz is drawn from your student id: write it in my_student_id, exactly as your "
                "instructor's roster has it (e.g. my_student_id = \"s1234567\"), and run this cell again."),
    "head": _l("Your graded quiz, drawn for student id {student}: the practice quiz's questions, with the options "
               "in your own order and your own numbers. Answer it in the answer sheet below (my_answers)."),
    "check_no_id": _l("quiz {bank}: no student id yet: set my_student_id in the cell above the answer sheet, then "
                      "run that cell, fill in the sheet and run this check again"),
    "check": _l("quiz {bank}, student {student}: {points} of {choice_total} points on the choice questions; "
                "{numeric_total} points of numeric answers are scored by your instructor's grader; pass mark "
                "{needed} of {total} points"),
    "check_choice_only": _l("quiz {bank}, student {student}: {points} of {choice_total} points; pass mark {needed}"),
    "unreadable": _l("  {item}: answer not readable"),
    "unknown": _l("  {key}: no such question in this quiz"),
}


def graded_quiz(lesson, student, lang: str | None = None) -> None:
    """Print ``student``'s graded quiz (``course.quiz.variant``): the questions with the options in
    their own order and their own numbers; with no student id yet, what to do."""
    bank = _bank(lesson)
    if student in (None, ""):
        print(_wrap(str(GRADED["no_id"]), ""))
        return
    print(_wrap(str(GRADED["head"]).format(student=student), "") + "\n")
    print(quiz_text(variant(bank, str(student)), _check_lang(bank, lang), practice=False))


def graded_verdict(bank: Bank, sheet: dict | None, student, pass_mark: float | None = None) -> tuple[str, Score]:
    """The graded check's text and the choice questions' score for ``student``'s quiz: how many
    points, never which answers are wrong."""
    if student in (None, ""):
        return str(GRADED["check_no_id"]).format(bank=bank.label()), score_choices(bank, {}, pass_mark)
    result = score_choices(variant(bank, str(student)), sheet, pass_mark)
    numeric = sum(item.points for item in bank.items if item.kind == "numeric")
    fields = {"bank": bank.label(), "student": student, "points": f"{result.points:g}",
              "choice_total": f"{bank.total_points - numeric:g}", "numeric_total": f"{numeric:g}",
              "needed": f"{result.needed:g}", "total": f"{bank.total_points:g}"}
    lines = [str(GRADED["check" if numeric else "check_choice_only"]).format(**fields)]
    lines += [str(GRADED["unreadable"]).format(item=item_id) for item_id, s in result.status.items() if s == "invalid"]
    lines += [str(GRADED["unknown"]).format(key=key) for key in result.unknown]
    return "\n".join(lines), result


def check_quiz(lesson, sheet: dict | None, student=None, pass_mark: float | None = None) -> Score:
    """The notebook's graded check: score the choice questions of ``student``'s quiz and print how
    many points they earn (never which answers are wrong); the numeric ones are the grader's.
    Returns the Score of the choice questions. (Passing the practice quiz in the widget is what
    ``progress`` records on this computer.)"""
    bank = _bank(lesson)
    text, result = graded_verdict(bank, sheet, student, pass_mark)
    print(text)
    return result


def lesson_cells(lesson, points: int = 3) -> str:
    """The percent-format cells that end a lesson source with its quiz (see ``tools/build_lessons.py``):
    the practice widget (output ignored by nbval), the student id and the graded quiz drawn for it,
    the answer sheet, and the graded check. The text is in the process's language (the build sets
    the edition's); the code cells are the same."""
    bank = _bank(lesson)
    name = bank.lesson or bank.id
    switch = _("\nThe quiz has a language switch (English / 中文); `show(\"{name}\", lang=\"zh-Hant\")` prints it in "
               "Traditional Chinese.").format(name=name) if len(bank.languages) > 1 else ""
    intro = _("## Quiz\n"
              "**Practise** in the quiz below: each answer gets instant feedback with its explanation, and you\n"
              "can retry as often as you like. Where widgets do not show (a terminal, a static view), it shows\n"
              "as text; answer a question with `answer(\"{name}\", \"<question id>\", <answer>)`.{switch}\n"
              "Passing the practice quiz is recorded on this computer (`from parallel_lab.show.progress import\n"
              "my_progress`, then `my_progress()`): a record for you, not a credential.\n"
              "\n"
              "**Your graded quiz** asks the same questions with the options in your own order and your own\n"
              "numbers, drawn from your student id. Write your id in `my_student_id` exactly as your\n"
              "instructor's roster has it and run the cell: it prints your quiz. Write your answers in the\n"
              "answer sheet and run the check cell: it tells you your points on the choice questions (not\n"
              "which answers are wrong); your instructor's grader scores the numeric ones. A credential anyone\n"
              "can verify comes from whoever grades your notebook (hand it in, or submit it to the course's\n"
              "grading service).").format(name=name, switch=switch)
    markdown = "\n".join(f"# {line}".rstrip() for line in intro.split("\n"))
    student_id = _("your student id, as on your instructor's roster, e.g. \"{example}\"").format(example="s1234567")
    return f'''# %% [markdown]
{markdown}

# %% tags=["nbval-ignore-output"]
from parallel_lab.show.quizbox import quiz

quiz("{name}")

# %% tags=["student-id"]
from parallel_lab.course.quiz import graded_quiz

my_student_id = None  # {student_id}
graded_quiz("{name}", my_student_id)

# %% tags=["answer:quiz:{name}"]
{sheet_template(bank)}

# %% tags=["check:quiz:{name}", "points:{points}"]
from parallel_lab.course.quiz import check_quiz

quiz_verdict = check_quiz("{name}", my_answers, my_student_id)
'''
