"""How long a lesson takes a student, by one written rule (docs/students.md gives it with its sources).

    minutes = words / 130          reading the lesson's prose: 130 words a minute
            + 1   x code cells     reading a cell, running it, reading what it prints or draws
            + 2   x predictions    thinking before a run and writing the number down
            + 10  x exercise points writing, running and fixing an exercise (a 2-point one: 20 min)
            + 1.5 x quiz items     answering the quiz at the end
    rounded up to the next 5 minutes.

130 words a minute is the rate of the Rice University Center for Teaching Excellence's course
workload estimator (Barre 2016, after Carver 1992) for reading to *understand* a text with *many
new concepts*; a lesson's markdown is that. The other four are this course's own assumptions, to be
corrected from what students report (docs/students.md says how). Words are the whitespace-separated
tokens of the lesson source's markdown cells (formulas and quotations included), in English: the
same lesson in Traditional Chinese takes the same minutes.

The build writes the result at the top of every lesson (``statement``), in both languages, and after
each lesson's line in lesson 00's course map, so the number a student reads is always the rule's on
the current source; tests hold the limits (a lesson at most ``MAX_MINUTES``, a markdown cell at most
``MAX_CELL_WORDS`` words).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from parallel_lab.course import tags
from parallel_lab.i18n import _, ngettext

WORDS_PER_MINUTE = 130
MINUTES_PER_CODE_CELL = 1.0
MINUTES_PER_PREDICTION = 2.0
MINUTES_PER_EXERCISE_POINT = 10.0
MINUTES_PER_QUIZ_ITEM = 1.5
ROUND_TO = 5
MAX_MINUTES = 90  # about: what one sitting holds
MAX_CELL_WORDS = 250  # about one screen of prose


@dataclass(frozen=True)
class Load:
    """What a lesson asks of a student, and the minutes the rule makes of it."""

    words: int
    code_cells: int
    predictions: int
    exercise_points: int
    quiz_items: int

    @property
    def exact_minutes(self) -> float:
        return (self.words / WORDS_PER_MINUTE + MINUTES_PER_CODE_CELL * self.code_cells
                + MINUTES_PER_PREDICTION * self.predictions + MINUTES_PER_EXERCISE_POINT * self.exercise_points
                + MINUTES_PER_QUIZ_ITEM * self.quiz_items)

    @property
    def minutes(self) -> int:
        """The rule's minutes, rounded up to the next 5."""
        return int(math.ceil(self.exact_minutes / ROUND_TO - 1e-9) * ROUND_TO)


def words(text: str) -> int:
    """Whitespace-separated tokens of a markdown text."""
    return len(text.split())


def measure(cells, quiz_items: int = 0) -> Load:
    """The load of a lesson from its source's cells (jupytext cells: markdown and code, with tags)
    and the number of items of its quiz."""
    markdown = [c for c in cells if c.cell_type == "markdown"]
    code = [c for c in cells if c.cell_type == "code"]
    predictions = sum(1 for c in code if tags.is_prediction_answer(c))
    points = 0
    for cell in code:
        check, written = tags.check(cell)
        if check and tags.quiz(check) is None and tags.prediction(check) is None:
            points += int(written) if written and str(written).isdigit() else 1
    return Load(sum(words(c.source) for c in markdown), len(code), predictions, points, quiz_items)


def statement(load: Load) -> str:
    """The line the build writes under a lesson's title (in the process's language)."""
    parts = [_("{words} words to read").format(words=f"{load.words:,}"),
             ngettext("{n} code cell to run", "{n} code cells to run", load.code_cells).format(n=load.code_cells)]
    if load.predictions:
        parts.append(ngettext("{n} prediction", "{n} predictions", load.predictions).format(n=load.predictions))
    if load.exercise_points:
        parts.append(ngettext("exercises worth {n} point", "exercises worth {n} points",
                              load.exercise_points).format(n=load.exercise_points))
    if load.quiz_items:
        parts.append(ngettext("a quiz of {n} question", "a quiz of {n} questions", load.quiz_items).format(
            n=load.quiz_items))
    # TRANSLATORS: the separator between the parts of a lesson's load ("、" in Chinese)
    return _("*About {minutes} minutes: {parts} (how this is estimated: docs/students.md).*").format(
        minutes=load.minutes, parts=_(", ").join(parts))


def with_statement(first_markdown: str, line: str) -> str:
    """The lesson's first markdown cell with ``line`` right under its title (its first line)."""
    head, _newline, rest = first_markdown.partition("\n")
    return f"{head}\n\n{line}\n\n{rest.lstrip(chr(10))}".rstrip("\n")


MAP_LINE = re.compile(r"^(- \*\*(\d\d)[^\n]*?)(?: \((?:about \d+ min|約 \d+ 分鐘)\))?$", re.M)


def with_map_minutes(text: str, minutes: dict) -> str:
    """Lesson 00's course map (lines ``- **NN Title** — ...``) with each lesson's minutes appended."""
    def add(match):
        number = match.group(2)
        if number not in minutes:
            return match.group(1)
        return match.group(1) + " " + _("(about {minutes} min)").format(minutes=minutes[number])

    return MAP_LINE.sub(add, text)
