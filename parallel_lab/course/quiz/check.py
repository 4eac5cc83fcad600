"""Checking answers: one response -> deterministic feedback; an answer sheet -> a score.

Everything here runs in the Python process (the notebook kernel), never in the browser: the widget
sends the student's choice to the kernel and gets back only the feedback for that choice, so no
answer key (not even a salted hash of one) is ever part of a widget's state or a cell's output. In
the students' release the banks are sealed (``seal``): the same feedback comes from salted hashes
and ciphertexts keyed by the answer.

Responses: a single-choice item takes an option key (``"b"``); a multiple-choice item a list of
keys or a string ``"a, c"``; a numeric item a number or a string holding one. ``None`` means not
answered. The text of every feedback is a pure function of (item, response, language).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from parallel_lab.i18n import DEFAULT, LANGUAGES, _, _l, language, ngettext, using

from . import seal
from .bank import Bank, Item, localize, resolve

# What every verdict says around an item's own texts: the library's catalog (parallel_lab.i18n).
UI = {"correct": _l("Correct."), "wrong": _l("Not quite."), "invalid": _l("Cannot read this answer:"),
      "retry": _l("Try again."), "not_option": _l("{got!r} is not an option; choose from {keys}."),
      "one_option": _l("choose exactly one option, got {got}."), "not_number": _l("{got!r} is not a number."),
      "not_key": _l("expected an option key such as 'a', got {got!r}")}
# Two parts of one message side by side: a space in English, none in Chinese.
JOIN = _l("{first} {second}")


class InvalidResponse(ValueError):
    """A response that is not a valid answer to its item (e.g. an unknown option key)."""


@dataclass(frozen=True)
class Feedback:
    """The verdict on one response: ``status`` is correct, wrong, invalid or unanswered."""

    item_id: str
    status: str
    message: str

    @property
    def correct(self) -> bool:
        return self.status == "correct"


def _lang(lang: str | None) -> str:
    """``lang``, else the process's language; English for a language the course does not have."""
    lang = lang or language()
    return lang if lang in LANGUAGES else DEFAULT


def _ui(lang: str | None, key: str, **fields) -> str:
    with using(_lang(lang)):
        return str(UI[key]).format(**fields)


def _joined(lang: str | None, *parts: str) -> str:
    with using(_lang(lang)):
        text = parts[0]
        for part in parts[1:]:
            text = str(JOIN).format(first=text, second=part)
        return text


def _missing(lang: str | None, n: int) -> str:
    with using(_lang(lang)):
        return ngettext("You left out {n} correct option.", "You left out {n} correct options.", n).format(n=n)


def normalise(item: Item, response, lang: str | None = None):
    """The canonical form of ``response`` (frozenset of keys, or float); raises InvalidResponse,
    whose message is in ``lang`` (default: the process's language)."""
    if item.kind == "numeric":
        try:
            if isinstance(response, bool):
                raise ValueError
            return float(str(response).replace(",", "").replace("_", "").strip())
        except ValueError:
            raise InvalidResponse(_ui(lang, "not_number", got=response)) from None
    if isinstance(response, str):
        keys = [k for k in re.split(r"[\s,;]+", response.strip().lower()) if k]
    elif isinstance(response, (list, tuple, set, frozenset)):
        keys = [str(k).strip().lower() for k in response]
    else:
        raise InvalidResponse(_ui(lang, "not_key", got=response))
    known = [o.key for o in item.options]
    for key in keys:
        if key not in known:
            raise InvalidResponse(_ui(lang, "not_option", got=key, keys=", ".join(known)))
    if item.kind == "single" and len(set(keys)) != 1:
        raise InvalidResponse(_ui(lang, "one_option", got=len(set(keys))))
    return frozenset(keys)


def format_value(item: Item, value: float, lang: str = "en") -> str:
    text = f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return f"{text} {item.unit_text(lang)}".strip()


def feedback(item: Item, response, lang: str | None = None) -> Feedback:
    """Deterministic feedback on one response, in ``lang`` (default: the process's language): for
    choices, the explanation of every chosen option; for numbers, the explanation when right, else
    the explanation of a recognised mistake or a hint (never the answer itself, so that a retry
    still teaches)."""
    lang = _lang(lang)
    if response is None or response == "" or response == []:
        return Feedback(item.id, "unanswered", "")
    try:
        value = normalise(item, response, lang)
    except InvalidResponse as exc:
        return Feedback(item.id, "invalid", _joined(lang, _ui(lang, "invalid"), str(exc)))
    if item.kind == "numeric":
        return _numeric_feedback(item, value, lang)
    chosen = [o for o in item.options if o.key in value]
    if item.sealed is not None:  # a students' release: a salted hash of the key, ciphertexts of the whys
        right = seal.choice_right(item, value)
        lines = [_ui(lang, "correct" if right else "wrong")]
        lines += [f"({o.key}) {seal.option_why(item, o.key, lang)}" for o in chosen]
        if not right:
            lines.append(_ui(lang, "retry"))
        return Feedback(item.id, "correct" if right else "wrong", "\n".join(lines))
    right = value == item.correct_keys()
    lines = [_ui(lang, "correct" if right else "wrong")]
    lines += [f"({o.key}) {localize(o.why, lang)}" for o in chosen]
    missing = len(item.correct_keys() - value)
    if not right and item.kind == "multiple" and missing:
        lines.append(_missing(lang, missing))
    if not right:
        lines.append(_ui(lang, "retry"))
    return Feedback(item.id, "correct" if right else "wrong", "\n".join(lines))


def _numeric_feedback(item: Item, value: float, lang: str) -> Feedback:
    if item.sealed is not None:
        right, texts = seal.numeric_feedback(item, value)
        if right:
            return Feedback(item.id, "correct", _joined(lang, _ui(lang, "correct"), texts.get(lang) or texts["en"]))
        text = (texts.get(lang) or texts["en"]) if texts else localize(item.hint, lang).format(**item.params)
        return Feedback(item.id, "wrong", _joined(lang, _ui(lang, "wrong"), text, _ui(lang, "retry")))
    answer = item.value()
    fields = {**item.params, "answer": answer}
    if item.within_tolerance(value, answer):
        text = localize(item.explanation, lang).format(**fields)
        return Feedback(item.id, "correct", _joined(lang, _ui(lang, "correct"), text))
    text = localize(item.hint, lang).format(**item.params)
    for mistake in item.mistakes:
        if item.within_tolerance(value, resolve(mistake.answer, item.source)):
            text = localize(mistake.why, lang).format(**fields)
            break
    return Feedback(item.id, "wrong", _joined(lang, _ui(lang, "wrong"), text, _ui(lang, "retry")))


# ----------------------------------------------------------------------------------------------
# Scoring an answer sheet.


@dataclass(frozen=True)
class Score:
    """An answer sheet scored against a bank: ``status`` maps item id -> correct / wrong / invalid /
    unanswered; ``responses`` item id -> the sheet's response; ``unknown`` lists sheet keys that name
    no item of the bank."""

    bank: Bank
    status: dict
    points: float
    needed: float
    unknown: tuple
    responses: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.bank.total_points

    @property
    def passed(self) -> bool:
        return self.points >= self.needed - 1e-9


def score(bank: Bank, sheet: dict | None, pass_mark: float | None = None) -> Score:
    """Score ``sheet`` (item id or short id -> response) against ``bank``."""
    sheet = dict(sheet or {})
    by_id, unknown = {}, []
    for key, response in sheet.items():
        try:
            by_id[bank.item(str(key)).id] = response
        except KeyError:
            unknown.append(str(key))
    status, points = {}, 0.0
    for item in bank.items:
        result = feedback(item, by_id.get(item.id))
        status[item.id] = result.status
        points += item.points if result.correct else 0
    return Score(bank, status, points, bank.points_needed(pass_mark), tuple(unknown), by_id)


def score_choices(bank: Bank, sheet: dict | None, pass_mark: float | None = None) -> Score:
    """Score only the choice questions of ``sheet`` (what a notebook may check of a graded quiz);
    the pass mark stays the whole bank's."""
    choices = replace(bank, items=tuple(item for item in bank.items if item.kind != "numeric"))
    result = score(choices, {k: v for k, v in (sheet or {}).items() if _known_choice(bank, k)}, pass_mark)
    unknown = tuple(str(k) for k in (sheet or {}) if not _known(bank, k))
    return replace(result, needed=bank.points_needed(pass_mark), unknown=unknown)


def _known(bank: Bank, key) -> bool:
    try:
        bank.item(str(key))
        return True
    except KeyError:
        return False


def _known_choice(bank: Bank, key) -> bool:
    return _known(bank, key) and bank.item(str(key)).kind != "numeric"


def _num(x: float) -> str:
    return f"{x:g}"


def passing_verdict(bank: Bank, pass_mark: float | None = None) -> str:
    """The line ``check_quiz`` prints for any passing sheet: what an instructor's grader expects
    (in the process's language)."""
    return _("quiz {bank}: PASSED (pass mark: {needed} of {total} points)").format(
        bank=bank.label(), needed=_num(bank.points_needed(pass_mark)), total=_num(bank.total_points))


def verdict(result: Score, pass_mark: float | None = None) -> str:
    """Deterministic text of a scored sheet, in the process's language. A pass prints only
    ``passing_verdict`` (whatever the score, so that nbval can compare it); otherwise the score and
    each question not yet right."""
    if result.passed:
        return passing_verdict(result.bank, pass_mark)
    lines = [_("quiz {bank}: NOT PASSED: {points} of {total} points, pass mark {needed}").format(
        bank=result.bank.label(), points=_num(result.points), total=_num(result.total), needed=_num(result.needed))]
    names = {"wrong": _("wrong"), "invalid": _("answer not readable"), "unanswered": _("not answered")}
    lines += [_("  {item}: {status}").format(item=item_id, status=names[s])
              for item_id, s in result.status.items() if s != "correct"]
    lines += [_("  {key}: no such question in this quiz").format(key=key) for key in result.unknown]
    return "\n".join(lines)
