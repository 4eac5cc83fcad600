"""Predict, then run: what a student writes down before a run, and how it compares after.

    # %% tags=["answer:predict:all-reduce-4mb"]
    my_prediction = None  # gloo's all-reduce of 4 MB on 4 ranks, in ms
    ### BEGIN SOLUTION
    my_prediction = 14.0
    ### END SOLUTION

    # %%                                    (tagged check:predict:<id> when it is graded)
    from parallel_lab.show.predict import predict

    guess = predict("all-reduce-4mb", my_prediction, "gloo's all-reduce of 4 MB on 4 ranks", unit="ms",
                    tolerance=0.5)

    # %% tags=["reveals:all-reduce-4mb"]    (and nbval-ignore-output when the measurement varies)
    ...                                     # the run
    guess.versus(measured_ms)

**Every "Predict" in a lesson is recorded this way**, whatever it predicts:

- a number (the default): compared within ``tolerance`` (relative; 0.25 = ±25 %);
- a count: ``tolerance=0``, compared exactly (``predict("stash", my_prediction, "...", tolerance=0)``);
- a choice: ``choices=("columns", "rows")``; the student writes one of them, ``my_prediction = "rows"``;
- an order: ``order=("even", "time", "parameters")``; the student writes them in their order,
  ``my_prediction = ["time", "even", "parameters"]``, and ``versus`` says how many are in place.

The cell whose output answers the prediction (the run with ``versus``, and any table or figure that
shows the answer) is tagged ``reveals:<id>``: the student edition hides its output until the student
runs it (``parallel_lab.course.hidden``), and ``tests/test_predictions_hidden.py`` fails when anything
visible before the answer cell gives the answer away.

A graded prediction (registered in ``parallel_lab.course.predictions.GRADED``) is recorded with its
id alone, ``predict("gpipe-bubble", my_prediction)``: its question, unit, tolerance (and choices)
are the registry's, the ones the grader uses. Everything printed is plain text, a pure function of
the values (three significant digits), so nbval can compare it, in the lesson's language
(``parallel_lab.i18n``): an ungraded prediction's question (and unit, choices, and the name in
``versus``) may be ``{"en": ..., "zh-Hant": ...}``; a graded one's are the registry's, in both
languages. In a notebook, ``versus`` shows its line with the reference in the output's metadata
(``{"parallel_lab": {"prediction": id, "reference": ..., "unit": ..., "kind": ...}}``), which the
test reads; elsewhere it prints the same line.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from dataclasses import dataclass

from parallel_lab.course.predictions import (
    GRADED,
    KINDS,
    VARIABLE,
    GradedPrediction,
    answer_text,
    comparison,
    exact_comparison,
    matches,
    number,
)
from parallel_lab.course.quiz.bank import localize
from parallel_lab.i18n import _, _l, language, ngettext, pgettext

# The names a lesson gives its measurement in ``versus`` ("simulated"): translated when shown.
NAMES = {"measured": _l("measured"), "simulated": _l("simulated"), "reference": _l("reference"),
         "the memory model": _l("the memory model")}


def _text(value) -> str:
    """A text of a lesson (a string, or ``{"en": ..., "zh-Hant": ...}``) in the lesson's language."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return str(NAMES.get(value, value))
    return localize(value, language()) if isinstance(value, dict) else str(value)


_CJK = "[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_EDGE = "\0"


def _ask(template: str, question, **fields) -> str:
    """``template`` with the question in it, a half-width space put between a CJK character of the
    template and a Latin letter or digit that begins or ends the question ("請預測 1F1B 的…", as the
    lessons set CJK beside Latin; the template cannot know the question's first letter). A template
    that already puts a space or punctuation there is left as it is, English included."""
    text = template.format(question=_EDGE + _text(question) + _EDGE, **fields)
    text = re.sub(f"(?<={_CJK}){_EDGE}(?=[A-Za-z0-9])", " ", text)
    text = re.sub(f"(?<=[A-Za-z0-9]){_EDGE}(?={_CJK})", " ", text)
    return text.replace(_EDGE, "")


# Units a lesson may write as a plain string that are words in Chinese (the symbols GB, MB, Ψ, × and
# the names GPU stay as they are): shown in the lesson's language.
UNITS = {"ms": lambda: pgettext("unit", "ms"), "s": lambda: pgettext("unit", "s"),
         "µs": lambda: pgettext("unit", "µs"),
         "steps": lambda: pgettext("unit", "steps"), "bytes": lambda: pgettext("unit", "bytes")}


def _unit(value) -> str:
    """A prediction's unit in the lesson's language: a text of the lesson, or one of ``UNITS``."""
    if isinstance(value, str) and value in UNITS:
        return UNITS[value]()
    return _text(value)


def _english(value) -> str:
    if isinstance(value, dict):
        return str(value.get("en", ""))
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Prediction:
    """A recorded prediction: ``value`` (None when the student wrote none) of ``question``; ``kind``
    "number" (``tolerance`` relative, 0 for an exact count), "choice" or "order" (of ``choices``)."""

    id: str
    value: object
    question: object
    unit: object = ""
    tolerance: float = 0.25
    graded: GradedPrediction | None = None
    kind: str = "number"
    choices: tuple = ()

    def _choices_text(self) -> str:
        return ", ".join(repr(_text(c)) for c in self.choices)

    def text(self) -> str:
        """What ``predict`` prints: the prediction as recorded, or how to write one."""
        graded = []
        if self.graded and self.kind == "number" and self.tolerance:
            graded = ["  " + ngettext("Graded: {points:g} point within ±{tolerance:g} % of the reference the grader "
                                      "computes.", "Graded: {points:g} points within ±{tolerance:g} % of the "
                                      "reference the grader computes.", 1 if self.graded.points == 1 else 2).format(
                points=self.graded.points, tolerance=self.tolerance * 100)]
        elif self.graded:
            graded = ["  " + ngettext("Graded: {points:g} point if it is right.", "Graded: {points:g} points if it "
                                      "is right.", 1 if self.graded.points == 1 else 2).format(
                points=self.graded.points)]
        unit = _unit(self.unit)
        if self.value is None:
            if self.kind == "choice":
                ask = _ask(_("Predict {question}: write one of {choices}."), self.question,
                           choices=self._choices_text())
            elif self.kind == "order":
                ask = _ask(_("Predict {question}: write {choices} as a list, in your order."), self.question,
                           choices=self._choices_text())
            else:
                ask = _ask(_("Predict {question} (in {unit}).") if unit else _("Predict {question}."), self.question,
                           unit=unit)
            missing = _("prediction {id}: NOT YET: no number recorded.") if self.kind == "number" else \
                _("prediction {id}: NOT YET: no prediction recorded.")
            return "\n".join([missing.format(id=self.id),
                              "  " + ask,
                              "  " + _("Write it in {variable} in the cell above, run that cell, then this one: "
                                       "before the run below.").format(variable=VARIABLE), *graded])
        return "\n".join([_("prediction {id}: your prediction: {value} (recorded before the run)").format(
            id=self.id, value=answer_text(_shown(self.value), unit)), *graded])

    def comparison(self, measured, name="measured") -> str:
        """The prediction against ``measured`` (what ``versus`` prints)."""
        unit, name = _unit(self.unit), _text(name)
        measured = self._reference(measured)
        value = self.value
        if self.kind != "number":  # choices written {"en": ..., "zh-Hant": ...} are shown in the language
            measured = _shown(measured)
            value = _shown(value)
        if value is None:
            return _("prediction {id}: {name} {measured}; no prediction was recorded (next time write one in "
                     "{variable} before the run)").format(id=self.id, name=name, variable=VARIABLE,
                                                          measured=answer_text(measured, unit))
        if self.kind == "number":
            text = comparison(value, float(measured), self.tolerance, unit, name)
        else:
            text = exact_comparison(value, measured, unit, name)
        return _("prediction {id}: {comparison}").format(id=self.id, comparison=text)

    def _reference(self, measured):
        """``measured`` checked against the prediction's kind: a number, one of the choices, an order."""
        if self.kind == "number":
            return float(measured)
        chosen = _choose(measured, self.choices, self.kind)
        if chosen is None:
            what = "one of" if self.kind == "choice" else "an order of"
            raise ValueError(f"prediction {self.id}: {measured!r} is not {what} {list(self.choices)}")
        return chosen

    def versus(self, measured, name="measured") -> None:
        """Show the prediction against the run's ``measured`` value (its reference in the metadata)."""
        reference = self._reference(measured)
        line = self.comparison(measured, name)
        meta = {"prediction": self.id, "kind": self.kind, "unit": _english(self.unit),
                "reference": [_english(r) if isinstance(r, dict) else r for r in reference]
                if isinstance(reference, tuple) else _english(reference) if isinstance(reference, dict) else reference}
        _show(line, meta)


def _show(line: str, meta: dict) -> None:
    """``line`` as a display with ``meta`` in a notebook (IPython); printed anywhere else."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    if shell is None or not getattr(shell, "kernel", None):
        print(line)
        return
    from IPython.display import display

    display({"text/plain": line}, raw=True, metadata={"parallel_lab": meta})


def _shown(choice):
    """A canonical choice (or a tuple of them, an order) as the lesson's language writes it."""
    if isinstance(choice, tuple):
        return tuple(_shown(c) for c in choice)
    return _text(choice) if isinstance(choice, dict) else choice


def _choose(value, choices, kind):
    """``value`` as the canonical choice (kind "choice") or tuple of choices ("order"), or None."""
    texts = [str(c) if not isinstance(c, dict) else c for c in choices]
    if kind == "choice":
        if isinstance(value, str):
            return next((c for c in texts if matches(value, _english(c) or c) or matches(value, _text(c))), None)
        return None
    if isinstance(value, (list, tuple)) and len(value) == len(texts):
        picked = [_choose(v, choices, "choice") for v in value]
        if None not in picked and sorted(map(str, picked)) == sorted(map(str, texts)):
            return tuple(picked)
    return None


def predict(prediction_id: str, value, question=None, unit=None, tolerance: float | None = None, *,
            choices=None, order=None) -> Prediction:
    """Record ``value`` (the student's ``my_prediction``) before a run, print it, and return the
    ``Prediction`` whose ``versus(measured)`` compares after the run. A graded id takes question,
    unit, tolerance and choices from the registry (pass none of them); an ungraded one needs
    ``question`` (``unit`` default "", ``tolerance`` relative, default 0.25 = ±25 %, 0 for an exact
    count; ``choices`` for a choice, ``order`` for an order). A value of the wrong kind is refused
    with a message, as None. Printed in the lesson's language."""
    graded = GRADED.get(prediction_id)
    kind = "choice" if choices is not None else "order" if order is not None else "number"
    options = tuple(choices if choices is not None else order if order is not None else ())
    if graded is not None:
        if question is not None or unit is not None or tolerance is not None or options:
            raise ValueError(f"prediction {prediction_id} is graded: its question, unit, tolerance and choices are "
                             f"those of parallel_lab.course.predictions.GRADED; pass the id and the value only")
        question, unit, tolerance = graded.question, graded.unit, graded.tolerance
        kind, options = graded.kind, tuple(graded.choices)
    elif question is None:
        raise ValueError(f"prediction {prediction_id} is not graded: say what it predicts (question=...)")
    if choices is not None and order is not None:
        raise ValueError(f"prediction {prediction_id}: pass choices (one of them) or order (all of them), not both")
    if kind not in KINDS or (kind != "number" and len(options) < 2):
        raise ValueError(f"prediction {prediction_id}: a {kind} needs at least two choices, got {list(options)}")
    tolerance = (0.25 if tolerance is None else float(tolerance)) if kind == "number" else 0.0
    if not 0 <= tolerance < 10:
        raise ValueError(f"tolerance is relative (0.25 = ±25 %), got {tolerance}")
    recorded = Prediction(prediction_id, None, question, unit or "", tolerance, graded, kind, options)
    if value is not None:
        chosen = _number(value) if kind == "number" else _choose(value, options, kind)
        if chosen is None and kind == "number":
            print(_("prediction {id}: NOT YET: {variable} must be a number, got {value!r}").format(
                id=prediction_id, variable=VARIABLE, value=value))
            return recorded
        if chosen is None:
            wanted = _("one of {choices}") if kind == "choice" else _("a list of {choices} in your order")
            print(_("prediction {id}: NOT YET: {variable} must be {wanted}, got {value!r}").format(
                id=prediction_id, variable=VARIABLE, wanted=wanted.format(choices=recorded._choices_text()),
                value=value))
            return recorded
        recorded = Prediction(prediction_id, chosen, question, unit or "", tolerance, graded, kind, options)
    print(recorded.text())
    return recorded


def _number(value):
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


__all__ = ["predict", "Prediction", "number"]
