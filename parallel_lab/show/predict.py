"""Predict, then run: the number a student writes down before a run, and how it compares after.

    # %% tags=["answer:predict:all-reduce-4mb"]
    my_prediction = None  # gloo's all-reduce of 4 MB on 4 ranks, in ms
    ### BEGIN SOLUTION
    my_prediction = 14.0
    ### END SOLUTION

    # %%                                    (tagged check:predict:<id> when it is graded)
    from parallel_lab.show.predict import predict

    guess = predict("all-reduce-4mb", my_prediction, "gloo's all-reduce of 4 MB on 4 ranks", unit="ms",
                    tolerance=0.5)

    # %% tags=["nbval-ignore-output"]       (only when the measurement varies from run to run)
    ...                                     # the run
    guess.versus(measured_ms)

A graded prediction (registered in ``parallel_lab.course.predictions.GRADED``) is recorded with its
id alone, ``predict("gpipe-bubble", my_prediction)``: its question, unit and tolerance are the
registry's, the ones the grader uses. Everything printed is plain text, a pure function of the
numbers (three significant digits), so nbval can compare it, in the lesson's language
(``parallel_lab.i18n``): an ungraded prediction's question (and unit, and the name in ``versus``)
may be ``{"en": ..., "zh-Hant": ...}``; a graded one's are the registry's, in both languages.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from parallel_lab.course.predictions import GRADED, VARIABLE, GradedPrediction, comparison, number
from parallel_lab.course.quiz.bank import localize
from parallel_lab.i18n import _, _l, language, ngettext

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


@dataclass(frozen=True)
class Prediction:
    """A recorded prediction: ``value`` (None when the student wrote none) of ``question``."""

    id: str
    value: float | None
    question: str
    unit: str = ""
    tolerance: float = 0.25
    graded: GradedPrediction | None = None

    def text(self) -> str:
        """What ``predict`` prints: the prediction as recorded, or how to write one."""
        graded = ["  " + ngettext("Graded: {points:g} point within ±{tolerance:g} % of the reference the grader "
                                  "computes.", "Graded: {points:g} points within ±{tolerance:g} % of the reference "
                                  "the grader computes.", 1 if self.graded.points == 1 else 2).format(
            points=self.graded.points, tolerance=self.tolerance * 100)] if self.graded else []
        unit = _text(self.unit)
        if self.value is None:
            return "\n".join([_("prediction {id}: NOT YET: no number recorded.").format(id=self.id),
                              "  " + (_("Predict {question} (in {unit}).") if unit else _("Predict {question}."))
                              .format(question=_text(self.question), unit=unit),
                              "  " + _("Write it in {variable} in the cell above, run that cell, then this one: "
                                       "before the run below.").format(variable=VARIABLE), *graded])
        return "\n".join([_("prediction {id}: your prediction: {value} (recorded before the run)").format(
            id=self.id, value=number(self.value, unit)), *graded])

    def comparison(self, measured: float, name="measured") -> str:
        """The prediction against ``measured`` (what ``versus`` prints)."""
        unit, name = _text(self.unit), _text(name)
        if self.value is None:
            return _("prediction {id}: {name} {measured}; no prediction was recorded (next time write one in "
                     "{variable} before the run)").format(id=self.id, name=name, variable=VARIABLE,
                                                          measured=number(float(measured), unit))
        return _("prediction {id}: {comparison}").format(
            id=self.id, comparison=comparison(self.value, float(measured), self.tolerance, unit, name))

    def versus(self, measured: float, name="measured") -> None:
        """Print the prediction against the run's ``measured`` value."""
        print(self.comparison(measured, name))


def predict(prediction_id: str, value, question=None, unit=None, tolerance: float | None = None) -> Prediction:
    """Record ``value`` (the student's ``my_prediction``) before a run, print it, and return the
    ``Prediction`` whose ``versus(measured)`` compares after the run. A graded id takes question,
    unit and tolerance from the registry (pass none of them); an ungraded one needs ``question``
    (``unit`` default "", ``tolerance`` relative, default 0.25 = ±25 %). A value that is not a
    number is refused with a message, as None. Printed in the lesson's language."""
    graded = GRADED.get(prediction_id)
    if graded is not None:
        if question is not None or unit is not None or tolerance is not None:
            raise ValueError(f"prediction {prediction_id} is graded: its question, unit and tolerance are "
                             f"those of parallel_lab.course.predictions.GRADED; pass the id and the value only")
        question, unit, tolerance = graded.question, graded.unit, graded.tolerance
    elif question is None:
        raise ValueError(f"prediction {prediction_id} is not graded: say what it predicts (question=...)")
    tolerance = 0.25 if tolerance is None else float(tolerance)
    if not 0 <= tolerance < 10:
        raise ValueError(f"tolerance is relative (0.25 = ±25 %), got {tolerance}")
    if value is not None and not _is_number(value):
        print(_("prediction {id}: NOT YET: {variable} must be a number, got {value!r}").format(
            id=prediction_id, variable=VARIABLE, value=value))
        return Prediction(prediction_id, None, question, unit or "", tolerance, graded)
    recorded = Prediction(prediction_id, None if value is None else float(value), question, unit or "",
                          tolerance, graded)
    print(recorded.text())
    return recorded


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
