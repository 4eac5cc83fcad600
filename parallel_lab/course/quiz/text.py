"""The quiz as plain text: for a terminal, a notebook where widgets do not render, and for grading.

    from parallel_lab.course.quiz import show, answer, check_quiz
    show("01")                                   # every question with its options (no answers)
    answer("01", "ring-bytes", 112)              # instant feedback on one answer, retry at will
    my_answers = {"collectives/identity": "b", ...}
    check_quiz("01", my_answers)                 # the deterministic verdict nbval compares

Everything printed is a pure function of the bank and the responses, so nbval can compare it, and
no answer key is printed unless the student's own answer earns its explanation.
"""

from __future__ import annotations

import json
import textwrap

from parallel_lab.i18n import _, language

from . import progress
from .bank import LANGUAGES, Bank, Item, load, localize
from .check import Feedback, Score, feedback, score, verdict

WIDTH = 100
KIND_NOTE = {
    "en": {"single": "one answer", "multiple": "all that apply", "numeric": "a number",
           "unit": ", in {unit}", "points": "{n:g} point{s}"},
    "zh-Hant": {"single": "單選", "multiple": "多選（選出所有正確選項）", "numeric": "填入數字",
                "unit": "，單位：{unit}", "points": "{n:g} 分"},
}


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
    notes = KIND_NOTE.get(lang, KIND_NOTE["en"])
    unit = notes["unit"].format(unit=item.unit) if item.kind == "numeric" and item.unit else ""
    points = notes["points"].format(n=item.points, s="s" * (item.points != 1))
    head = f"Q{number} [{item.id}] ({notes[item.kind]}{unit}, {points})"
    lines = [head]
    if faq_question:
        lines.append(_wrap(f"FAQ {item.faq}: {faq_question}", "   "))
    lines.append(_wrap(item.prompt_text(lang), "   "))
    lines += [_wrap(f"({o.key}) {localize(o.text, lang)}", "     ") for o in item.options]
    return "\n".join(lines)


def quiz_text(lesson, lang: str | None = None) -> str:
    """The whole quiz as text, with how to answer it in text mode."""
    bank = _bank(lesson)
    lang = _check_lang(bank, lang)
    faq = {e["entry"]: localize(e["question"], lang) for e in bank.faq}
    name = bank.lesson or bank.id
    parts = [f"Quiz: {localize(bank.title, lang)} — {len(bank.items)} questions, "
             f"{bank.total_points:g} points, pass mark {bank.points_needed():g}"]
    if len(bank.languages) > 1:
        parts.append("Languages: " + ", ".join(f"{code} ({LANGUAGES[code]})" for code in bank.languages)
                     + f"; e.g. show({name!r}, lang={bank.languages[-1]!r})")
    parts += [item_text(item, n, lang, faq.get(item.faq)) for n, item in enumerate(bank.items, 1)]
    parts.append(f"Answer one question: answer({name!r}, \"{bank.items[0].id}\", <your answer>).\n"
                 f"Hand in: put your answers in the answer-sheet cell; check_quiz({name!r}, my_answers) "
                 f"prints the verdict.")
    return "\n\n".join(parts)


def show(lesson, lang: str | None = None) -> None:
    """Print the quiz as text (questions and options, never the answers)."""
    print(quiz_text(lesson, lang))


def answer(lesson, item_id: str, response, lang: str | None = None) -> Feedback:
    """Check one answer and print the feedback; retry as often as you like. Returns the Feedback."""
    bank = _bank(lesson)
    item = bank.item(item_id)
    result = feedback(item, response, _check_lang(bank, lang))
    print(f"{item.id}: {result.message or 'no answer given'}")
    return result


def sheet_template(lesson) -> str:
    """The answer-sheet cell for a lesson: every question id, unanswered."""
    bank = _bank(lesson)
    width = max(len(item.id) for item in bank.items) + 3
    what = {"single": "one option key", "multiple": "a list of option keys", "numeric": "a number"}
    rows = [f"    {json.dumps(item.id) + ':':{width}} None,  # {what[item.kind]}" for item in bank.items]
    return "my_answers = {\n" + "\n".join(rows) + "\n}"


def check_quiz(lesson, sheet: dict | None, pass_mark: float | None = None) -> Score:
    """Score an answer sheet and print the verdict (the line nbval compares). A pass is recorded in the
    learner's progress (``progress``; ``parallel_lab.show.progress.my_progress`` shows it). Returns the Score."""
    bank = _bank(lesson)
    result = score(bank, sheet, pass_mark)
    print(verdict(result, pass_mark))
    if result.passed:
        progress.record_pass(bank.id, bank.lesson, result.points, result.total)
    return result


def lesson_cells(lesson, points: int = 3) -> str:
    """The percent-format cells that end a lesson source with its quiz (see ``tools/build_lessons.py``):
    the widget (output ignored by nbval), the text form, the answer sheet, and the graded check. The
    text is in the process's language (the build sets the edition's); the code cells are the same."""
    bank = _bank(lesson)
    name = bank.lesson or bank.id
    switch = _("\nThe quiz has a language switch (English / 中文); the text form in Traditional Chinese is "
               "`show(\"{name}\", lang=\"zh-Hant\")`.").format(name=name) if len(bank.languages) > 1 else ""
    intro = _("## Quiz\n"
              "Answer in the quiz below: each answer gets instant feedback with its explanation, and you can\n"
              "retry as often as you like. Where widgets do not show (a terminal, a static view), the text form\n"
              "under it has the same questions; answer one with `answer(\"{name}\", \"<question id>\", <answer>)`."
              "{switch}\n"
              "\n"
              "**To hand in**, write your answers in the answer sheet (the quiz shows it filled in, ready to\n"
              "paste) and run the check cell: it prints the verdict your instructor's grader compares. Passing\n"
              "records the quiz on this computer (`from parallel_lab.show.progress import my_progress`, then\n"
              "`my_progress()`). That record is yours, not a credential: a credential anyone can verify comes from\n"
              "whoever grades your notebook (hand it in, or submit it to the course's grading service).").format(
        name=name, switch=switch)
    markdown = "\n".join(f"# {line}".rstrip() for line in intro.split("\n"))
    return f'''# %% [markdown]
{markdown}

# %% tags=["nbval-ignore-output"]
from parallel_lab.show.quizbox import quiz

quiz("{name}")

# %%
from parallel_lab.course.quiz import show

show("{name}")

# %% tags=["answer:quiz:{name}"]
{sheet_template(bank)}

# %% tags=["check:quiz:{name}", "points:{points}"]
from parallel_lab.course.quiz import check_quiz

quiz_verdict = check_quiz("{name}", my_answers)
'''
