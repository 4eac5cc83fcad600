"""Predictions come before answers: in the edition students open, nothing visible before the student
runs a cell answers a prediction (issue 26).

A lesson's predictions and their reference values are read from its student edition: every
``guess.versus(...)`` shows its line with ``{"prediction": id, "reference": value, "unit": ...,
"kind": ...}`` in the output's metadata (``parallel_lab.show.predict``), whether that output is
visible or kept aside by the build (``parallel_lab.course.hidden``); a graded prediction's
reference is also the one the grader computes (``course.predictions.GRADED``). Then, in both
editions:

1. no **visible output** of the lesson (what a reader sees before running anything:
   ``hidden.visible_text``, i.e. a hidden cell's summary line only) carries a prediction's
   ``versus`` line or contains its reference value;
2. no **text before the prediction's answer cell** (markdown and code of the cells above it: the
   learning goals, a question's hint) contains its reference value;
3. no **earlier lesson** (markdown or visible output) contains it either (lesson 00's "43 % bubble"
   would answer lesson 04's prediction), for the values that can be told apart from other numbers
   (below: not small integers, choices or orders).

**"Contains"** is decided on the value as a lesson would print it, never on a bare digit. Within
the lesson (rules 1 and 2):

- a number that is not a whole number (0.4286, 3.75): its 3-significant-digit decimal (``0.429``,
  ``3.75``), its 2-significant-digit decimal when that keeps a decimal point (``0.43``, ``3.8``, but
  not ``70`` for 70.4), for a fraction between 0 and 1 the same as a percentage (``42.9 %``,
  ``43 %``, ``43%``), and the exact fraction when one with a denominator up to 64 equals it (``3/7``,
  ``3 / 7``);
- a whole number of 100 or more (131072): written plainly or with thousands separators
  (``131072``, ``131,072``);
- a whole number under 100 (a count, 4): only followed by the prediction's unit (``4
  micro-batches``), since "4" alone is everywhere (p = 4);
- a choice or an order: only through its ``versus`` line; a word like "columns" is in the question.

In earlier lessons (rule 3) only the spellings that are hard to meet by chance: the 3-digit decimal,
the percentages, the exact fraction; a whole number of 100 or more only with its unit, a count
never; and when the prediction has a unit, a decimal only followed by it (``3.75 GB``, not "3.75
each").

Everywhere a spelling matches as a whole number: not inside a longer number (``0.429`` does not
match ``10.4291``, ``43 %`` not ``143 %``), not as the end of a range (``38–43 %``), and a number
followed by a unit of time (``0.43 s``, ``43 ms``) is a timing, not an answer, unless the
prediction's own unit is one.

Where a lesson still gives an answer away, ``KNOWN_LEAKS`` names it: each entry is a leak the lesson's
own engineer fixes, and the list only shrinks (a fixed leak still listed fails too).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import nbformat
import pytest

from parallel_lab.course import editions, hidden, predictions, tags

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
TIME_UNITS = ("s", "ms", "µs", "us", "ns", "min", "h", "seconds", "second")

# THE LIST of leaks still in the lessons: (lesson, prediction id, where), "where" being "output",
# "before" (text above the answer cell) or "lesson NN" (an earlier lesson). Emptied as the lessons are
# fixed; never added to.
KNOWN_LEAKS: set[tuple[str, str, str]] = {
    # The quiz's text, printed below its widget, offers "3Ψ" among its options: goes with the quiz
    # tail that prints the quiz once.
    ("12", "zero3-traffic", "output"),
    # Section 4's text says "3Ψ, 1.5× plain data parallelism" in the cell that asks for it.
    ("12", "zero3-traffic", "before"),
}

# Matches that are another quantity, not the answer (lesson, prediction id) -> the words around it.
NOT_ANSWERS = {
    ("14", "ring-score-bytes"): ["hidden size 8192", "隱藏維度 8192"],  # a quiz question's model, not a score tensor
}


def editions_of(path: Path) -> list[Path]:
    found = [path]
    for lang in editions.EDITIONS:
        translated = editions.edition_path(path.stem, lang)
        if translated.exists():
            found.append(translated)
    return found


def read(path: Path):
    return nbformat.read(path, as_version=4)


# ----------------------------------------------------------------------------------------------
# What a lesson predicts.


def recorded(nb) -> dict:
    """prediction id -> its versus metadata (reference, unit, kind), from every output (hidden ones too)."""
    found = {}
    for cell in nb.cells:
        for output in hidden.reference_outputs(cell):
            meta = (output.get("metadata") or {}).get("parallel_lab", {})
            if isinstance(meta, dict) and "prediction" in meta:
                found[meta["prediction"]] = meta
    return found


def answer_index(nb, prediction_id: str) -> int | None:
    return next((i for i, cell in enumerate(nb.cells) if f"predict:{prediction_id}" in tags.answers(cell)), None)


# ----------------------------------------------------------------------------------------------
# "Contains".


def _fraction(value: float) -> Fraction | None:
    near = Fraction(value).limit_denominator(64)
    return near if near.denominator > 1 and abs(float(near) - value) < 1e-9 else None


def spellings(meta: dict, within_lesson: bool) -> list[re.Pattern]:
    """The regular expressions that find a reference value as a lesson would print it (the module
    doc's rule), in its own lesson (``within_lesson``) or in an earlier one."""
    value, unit = meta.get("reference"), str(meta.get("unit") or "")
    if meta.get("kind", "number") != "number" or not isinstance(value, (int, float)) or not math.isfinite(value):
        return []
    before = r"(?<![\d.,–-])"
    after = r"(?![\d])(?![.,]\d)"
    if unit not in TIME_UNITS:
        after += r"(?!\s?(?:" + "|".join(map(re.escape, TIME_UNITS)) + r")\b)"
    with_unit = (r"\s?" + re.escape(unit)) if unit else ""

    def plain(text, need_unit=False):
        return re.compile(before + re.escape(text) + (with_unit if need_unit else after))

    if float(value).is_integer():
        n = int(value)
        if abs(n) < 100:  # a count: only with its unit, only in its own lesson ("m = 4 micro-batches" elsewhere)
            return [plain(str(n), True)] if unit and within_lesson else []
        written = [str(n), f"{n:,}"]
        if not within_lesson:
            return [plain(w, True) for w in written] if unit else []
        return [plain(w) for w in written]
    need_unit = bool(unit) and not within_lesson
    patterns = [plain(f"{value:.3g}", need_unit)]
    two = f"{value:.2g}"
    if within_lesson and "." in two and "e" not in two:
        patterns.append(plain(two))
    if 0 < value < 1:
        for digits in (3, 2):
            percent = f"{value * 100:.{digits}g}"
            if "e" not in percent:
                patterns.append(re.compile(before + re.escape(percent) + r"\s?%"))
    exact = _fraction(float(value))
    if exact is not None:
        patterns.append(re.compile(before + rf"{exact.numerator}\s?/\s?{exact.denominator}(?![\d])"))
    return patterns


def contains(text: str, patterns, not_answers=()) -> str | None:
    """The first spelling of the value found in ``text`` (with a little context), or None; a match
    whose context holds one of ``not_answers`` is another quantity and does not count."""
    for pattern in patterns:
        for match in pattern.finditer(text):
            start = max(0, match.start() - 30)
            context = text[start:match.end() + 30].replace("\n", " ")
            if not any(words in context for words in not_answers):
                return context
    return None


def test_contains_is_decided_on_the_printed_value():
    bubble = {"reference": 3 / 7, "unit": "", "kind": "number"}
    found = spellings(bubble, within_lesson=True)
    for text in ("bubble 0.429", "a 43 % bubble", "42.9% idle", "3/7 of the time", "3 / 7", "≈ 0.43."):
        assert contains(text, found), text
    for text in ("10.4291", "143 %", "0.4", "took 0.43 s", "43 ms", "0.4290", "38–43 %"):
        assert not contains(text, found), text
    earlier = spellings(bubble, within_lesson=False)
    assert contains("a 43 % bubble", earlier) and contains("3/7", earlier) and not contains("≈ 0.43.", earlier)
    stash = {"reference": 4, "unit": "micro-batches", "kind": "number"}
    assert contains("keeps 4 micro-batches", spellings(stash, True))
    assert not contains("p = 4 stages", spellings(stash, True)) and spellings(stash, False) == []
    big = {"reference": 131072, "unit": "bytes", "kind": "number"}
    assert contains("holds 131,072 bytes", spellings(big, False)) and not contains("1310720", spellings(big, True))
    assert contains("131072", spellings(big, True)) and not contains("131072 tokens", spellings(big, False))
    gb = {"reference": 3.75, "unit": "GB", "kind": "number"}
    assert contains("3.75 GB", spellings(gb, False)) and not contains("3.75 each", spellings(gb, False))
    assert contains("3.75 each", spellings(gb, True)) and contains("about 3.8", spellings(gb, True))
    assert spellings({"reference": "rows", "kind": "choice"}, True) == []


# ----------------------------------------------------------------------------------------------
# The lessons.


def _visible(cell) -> str:
    return "\n".join(hidden.visible_text(o) for o in cell.get("outputs", []))


def _versus_visible(cell, prediction_id) -> bool:
    for output in cell.get("outputs", []):
        meta = (output.get("metadata") or {}).get("parallel_lab", {})
        if isinstance(meta, dict) and meta.get("prediction") == prediction_id:
            return True
    return False


def leaks(path: Path, evidence: dict | None = None) -> set[tuple[str, str, str]]:
    """(lesson, prediction, where) of every leak in lesson ``path`` (both editions); ``evidence``, when
    given, collects for each the cell and the text that gave it away."""
    evidence = {} if evidence is None else evidence
    lesson = path.stem[:2]
    english = read(path)
    refs = recorded(english)
    for pid, graded in predictions.GRADED.items():
        if graded.lesson == lesson and graded.kind == "number":
            refs.setdefault(pid, {"prediction": pid, "reference": graded.reference(), "unit": str(graded.unit),
                                  "kind": "number"})
    found = set()
    earlier = [p for p in LESSONS if p.stem[:2] < lesson]
    for edition in editions_of(path):
        nb = english if edition == path else read(edition)
        for pid, meta in refs.items():
            patterns = spellings(meta, within_lesson=True)
            excuse = NOT_ANSWERS.get((lesson, pid), ())
            answer = answer_index(nb, pid)
            for index, cell in enumerate(nb.cells):
                if cell.cell_type == "code":
                    seen = "its versus line" if _versus_visible(cell, pid) else \
                        contains(_visible(cell), patterns, excuse)
                    if seen:
                        found.add((lesson, pid, "output"))
                        evidence.setdefault((lesson, pid, "output"), f"{edition.name} cell {cell.get('id')}: {seen}")
                if answer is not None and index < answer:
                    seen = contains(cell.source, patterns, excuse)
                    if seen:
                        found.add((lesson, pid, "before"))
                        evidence.setdefault((lesson, pid, "before"), f"{edition.name} cell {cell.get('id')}: {seen}")
            distinct = spellings(meta, within_lesson=False)
            for other in earlier if distinct else []:
                for other_edition in editions_of(other):
                    for cell in read(other_edition).cells:
                        seen = contains(cell.source if cell.cell_type == "markdown" else _visible(cell), distinct)
                        if seen:
                            key = (lesson, pid, f"lesson {other.stem[:2]}")
                            found.add(key)
                            evidence.setdefault(key, f"{other_edition.name} cell {cell.get('id')}: {seen}")
    return found


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_nothing_visible_answers_a_prediction_before_its_answer_cell(path):
    evidence = {}
    found = leaks(path, evidence)
    known = {leak for leak in KNOWN_LEAKS if leak[0] == path.stem[:2]}
    new = sorted(found - known)
    assert not new, (f"{path.name} gives predictions away before the student makes them: "
                     f"{[(leak, evidence.get(leak)) for leak in new]}. Tag the cell "
                     f"whose output answers one reveals:<id> (the build hides it), or reword the text above the "
                     f"answer cell")
    fixed = sorted(known - found)
    assert not fixed, f"fixed, so take them out of KNOWN_LEAKS in {Path(__file__).name}: {fixed}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_recorded_prediction_is_compared_after_its_run(path):
    """A prediction with an answer cell has a versus line somewhere below it (else nothing says what
    the answer was, and the test above cannot see it)."""
    nb = read(path)
    asked = {tags.prediction(a) for cell in nb.cells for a in tags.answers(cell)} - {None}
    missing = sorted(asked - set(recorded(nb)))
    assert not missing, f"{path.name}: predictions never compared with guess.versus(...): {missing}"


# ----------------------------------------------------------------------------------------------
# Every "Predict" is recorded.

# THE LIST of markdown-only "**Predict**" prompts still to be recorded with predict() (lesson ->
# the keys of their cells, course.editions.cell_keys). Emptied as the lessons are converted; never
# added to: a new prompt comes with its answer cell.
UNRECORDED_PROMPTS: dict[str, list[str]] = {}
PROMPT = re.compile(r"\*\*Predict\b")


def unrecorded_prompts(source: Path) -> list[str]:
    """The keys of the markdown cells that ask to predict ("**Predict**") with no answer cell
    (``answer:predict:<id>``) as the next code cell."""
    import jupytext

    cells = jupytext.reads(source.read_text(encoding="utf-8"), fmt="py:percent").cells
    keys, found = editions.cell_keys(cells), []
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown" or not PROMPT.search(cell.source):
            continue
        following = next((c for c in cells[index + 1:] if c.cell_type == "code"), None)
        if following is None or not tags.is_prediction_answer(following):
            found.append(keys[index])
    return found


@pytest.mark.parametrize("source", sorted((ROOT / "lessons" / "src").glob("[0-9][0-9]_*.py")), ids=lambda s: s.stem)
def test_every_predict_prompt_is_recorded(source):
    found, listed = unrecorded_prompts(source), UNRECORDED_PROMPTS.get(source.stem, [])
    new = sorted(set(found) - set(listed))
    assert not new, (f"{source.name}: **Predict** without an answer cell (answer:predict:<id>, then predict(...)) "
                     f"right after it: cells {new}")
    fixed = sorted(set(listed) - set(found))
    assert not fixed, f"{source.name}: recorded now: remove {fixed} from UNRECORDED_PROMPTS"
