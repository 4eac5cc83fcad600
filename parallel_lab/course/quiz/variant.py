"""Graded quizzes that differ per student: the same questions, the options in the student's own
order and the numbers drawn for them.

    graded = variant(load("01"), "s1234567")   # the Bank this student answers in the notebook
    score_for(load("01"), my_answers, "s1234567")  # what the grader computes for them

The practice quiz (the widget, ``show``, ``answer``) is the bank as written: canonical order, the
numbers of ``answer.params``, instant feedback. The graded quiz is drawn from the student's id,
the one on the instructor's roster (``course.grading.roster``; without a roster, the name of the
student's submission folder). The notebook knows it because the student writes it in the quiz's
``my_student_id`` cell; the grader takes it from the roster, never from the notebook, so a sheet
answered for another id scores as what it is.

- **Choice items** keep their options, in an order drawn for the student, relabelled a, b, c, ...
  in that order; an explanation never names an option by its letter (``validate``).
- **Numeric items** with ``vary`` (``{param: [values, ...]}``) draw each combination of those
  values (the product, in sorted order, keeping the others of ``answer.params``) whose answer
  computes and differs from the practice answer by more than the tolerance; the student gets one
  of them. The grader recomputes the answer with the bank's function, as for the practice quiz.
  Items without ``vary`` (a literal answer) are the same for everyone.

Draws come from SHA-256 of the bank, item and student id: deterministic, the same here, in the
grader and in the students' release, and independent of Python's ``random``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import replace

from .bank import Bank, BankError, Item, resolve
from .check import Score, score


def _draw(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def permutation(n: int, *seed) -> list[int]:
    """A permutation of range(n) drawn from ``seed`` (Fisher-Yates on SHA-256 draws)."""
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = _draw(*seed, i) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


_GRADED: dict = {}  # the computed parameter sets, by the item's answer spec


def graded_params(item: Item) -> list[dict]:
    """The parameter sets a numeric item's graded quiz draws from ([] when it does not vary)."""
    if item.sealed is not None:  # a students' release lists them (``seal``)
        return [dict(p) for p in item.sealed.data.get("variants") or ()]
    if not item.vary or item.kind != "numeric" or "function" not in (item.answer or {}):
        return []
    key = json.dumps([item.id, item.answer, item.vary, item.tolerance], sort_keys=True, default=str)
    if key not in _GRADED:
        names = sorted(item.vary)
        practice = item.value()
        found = []
        for values in itertools.product(*(item.vary[name] for name in names)):
            params = {**item.params, **dict(zip(names, values))}
            try:
                answer = resolve({"function": item.answer["function"], "params": params}, item.source)
            except (BankError, ValueError, TypeError, ZeroDivisionError):
                continue  # a combination the function refuses (e.g. fewer micro-batches than a schedule needs)
            if not item.within_tolerance(answer, practice) and not item.within_tolerance(practice, answer):
                found.append(params)
        _GRADED[key] = found
    return [dict(p) for p in _GRADED[key]]


def variant_item(bank: Bank, item: Item, student: str) -> Item:
    """``item`` as ``student``'s graded quiz asks it."""
    if item.kind in ("single", "multiple"):
        order = permutation(len(item.options), bank.id, item.id, student)
        keys = [o.key for o in item.options]  # a, b, c, ... as written
        return replace(item, options=tuple(replace(item.options[i], key=keys[n], origin=item.options[i].origin or
                                                   item.options[i].key) for n, i in enumerate(order)))
    choices = graded_params(item)
    if not choices:
        return item
    params = choices[_draw(bank.id, item.id, student) % len(choices)]
    if item.sealed is not None:  # the release shows the numbers; only the grader knows the answer
        return replace(item, answer={"params": params}, mistakes=(), sealed=None)
    return replace(item, answer={"function": item.answer["function"], "params": params}, mistakes=())


def variant(bank: Bank, student: str | None) -> Bank:
    """``student``'s graded quiz; the practice quiz (the bank itself) when ``student`` is None."""
    if student is None:
        return bank
    return replace(bank, items=tuple(variant_item(bank, item, str(student)) for item in bank.items))


def score_for(bank: Bank, sheet: dict | None, student: str, pass_mark: float | None = None) -> Score:
    """``sheet`` scored against ``student``'s graded quiz."""
    return score(variant(bank, student), sheet, pass_mark)


def original_key(bank: Bank, item: Item, student: str, key: str) -> str:
    """The option key as written in the bank for the option ``student``'s quiz labels ``key``."""
    order = permutation(len(item.options), bank.id, item.id, student)
    keys = [o.key for o in item.options]
    return item.options[order[keys.index(key)]].key
