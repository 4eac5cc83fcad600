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

from . import seal
from .bank import Bank, Item, localize, resolve

UI = {
    "en": {"correct": "Correct.", "wrong": "Not quite.", "invalid": "Cannot read this answer:",
           "missing": "You left out {n} correct option{s}.", "retry": "Try again.",
           "answer": "The answer is {value}.", "not_option": "{got!r} is not an option; choose from {keys}.",
           "one_option": "choose exactly one option, got {got}.", "not_number": "{got!r} is not a number.",
           "sep": " "},
    "zh-Hant": {"correct": "正確。", "wrong": "不太對。", "invalid": "無法讀取這個答案：",
                "missing": "還有 {n} 個正確選項沒有選。", "retry": "再試一次。",
                "answer": "答案是 {value}。", "not_option": "{got!r} 不是選項；請從 {keys} 中選擇。",
                "one_option": "只能選一個選項，收到 {got}。", "not_number": "{got!r} 不是數字。", "sep": ""},
}


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


def _ui(lang: str, key: str, **fields) -> str:
    return UI.get(lang, UI["en"])[key].format(**fields)


def normalise(item: Item, response):
    """The canonical form of ``response`` (frozenset of keys, or float); raises InvalidResponse."""
    if item.kind == "numeric":
        try:
            if isinstance(response, bool):
                raise ValueError
            return float(str(response).replace(",", "").replace("_", "").strip())
        except ValueError:
            raise InvalidResponse(_ui("en", "not_number", got=response)) from None
    if isinstance(response, str):
        keys = [k for k in re.split(r"[\s,;]+", response.strip().lower()) if k]
    elif isinstance(response, (list, tuple, set, frozenset)):
        keys = [str(k).strip().lower() for k in response]
    else:
        raise InvalidResponse(f"expected an option key such as 'a', got {response!r}")
    known = [o.key for o in item.options]
    for key in keys:
        if key not in known:
            raise InvalidResponse(_ui("en", "not_option", got=key, keys=", ".join(known)))
    if item.kind == "single" and len(set(keys)) != 1:
        raise InvalidResponse(_ui("en", "one_option", got=len(set(keys))))
    return frozenset(keys)


def format_value(item: Item, value: float) -> str:
    text = f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return f"{text} {item.unit}".strip()


def feedback(item: Item, response, lang: str = "en") -> Feedback:
    """Deterministic feedback on one response: for choices, the explanation of every chosen option;
    for numbers, the explanation when right, else the explanation of a recognised mistake or a hint
    (never the answer itself, so that a retry still teaches)."""
    if response is None or response == "" or response == []:
        return Feedback(item.id, "unanswered", "")
    try:
        value = normalise(item, response)
    except InvalidResponse as exc:
        return Feedback(item.id, "invalid", _ui(lang, "invalid") + _ui(lang, "sep") + str(exc))
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
        lines.append(_ui(lang, "missing", n=missing, s="s" * (missing > 1)))
    if not right:
        lines.append(_ui(lang, "retry"))
    return Feedback(item.id, "correct" if right else "wrong", "\n".join(lines))


def _numeric_feedback(item: Item, value: float, lang: str) -> Feedback:
    sep = _ui(lang, "sep")
    if item.sealed is not None:
        right, texts = seal.numeric_feedback(item, value)
        if right:
            return Feedback(item.id, "correct", _ui(lang, "correct") + sep + (texts.get(lang) or texts["en"]))
        text = (texts.get(lang) or texts["en"]) if texts else localize(item.hint, lang).format(**item.params)
        return Feedback(item.id, "wrong", sep.join([_ui(lang, "wrong"), text, _ui(lang, "retry")]))
    answer = item.value()
    fields, sep = {**item.params, "answer": answer}, _ui(lang, "sep")
    if item.within_tolerance(value, answer):
        text = localize(item.explanation, lang).format(**fields)
        return Feedback(item.id, "correct", _ui(lang, "correct") + sep + text)
    text = localize(item.hint, lang).format(**item.params)
    for mistake in item.mistakes:
        if item.within_tolerance(value, resolve(mistake.answer, item.source)):
            text = localize(mistake.why, lang).format(**fields)
            break
    return Feedback(item.id, "wrong", sep.join([_ui(lang, "wrong"), text, _ui(lang, "retry")]))


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
    """The line ``check_quiz`` prints for any passing sheet: what an instructor's grader expects."""
    return (f"quiz {bank.label()}: PASSED (pass mark: {_num(bank.points_needed(pass_mark))} "
            f"of {_num(bank.total_points)} points)")


def verdict(result: Score, pass_mark: float | None = None) -> str:
    """Deterministic text of a scored sheet. A pass prints only ``passing_verdict`` (whatever the
    score, so that nbval can compare it); otherwise the score and each question not yet right."""
    if result.passed:
        return passing_verdict(result.bank, pass_mark)
    lines = [f"quiz {result.bank.label()}: NOT PASSED: {_num(result.points)} of {_num(result.total)} "
             f"points, pass mark {_num(result.needed)}"]
    names = {"wrong": "wrong", "invalid": "answer not readable", "unanswered": "not answered"}
    lines += [f"  {item_id}: {names[s]}" for item_id, s in result.status.items() if s != "correct"]
    lines += [f"  {key}: no such question in this quiz" for key in result.unknown]
    return "\n".join(lines)
