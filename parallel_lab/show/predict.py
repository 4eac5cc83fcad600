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
numbers (three significant digits), so nbval can compare it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from parallel_lab.course.predictions import GRADED, VARIABLE, GradedPrediction, comparison, number


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
        graded = [f"  Graded: {self.graded.points:g} point{'s' * (self.graded.points != 1)} within "
                  f"±{self.tolerance * 100:g} % of the reference the grader computes."] if self.graded else []
        if self.value is None:
            unit = f" (in {self.unit})" if self.unit else ""
            return "\n".join([f"prediction {self.id}: NOT YET: no number recorded.",
                              f"  Predict {self.question}{unit}.",
                              f"  Write it in {VARIABLE} in the cell above, run that cell, then this one: "
                              f"before the run below.", *graded])
        return "\n".join([f"prediction {self.id}: your prediction: {number(self.value, self.unit)} "
                          f"(recorded before the run)", *graded])

    def comparison(self, measured: float, name: str = "measured") -> str:
        """The prediction against ``measured`` (what ``versus`` prints)."""
        label = f"prediction {self.id}"
        if self.value is None:
            return (f"{label}: {name} {number(float(measured), self.unit)}; no prediction was recorded "
                    f"(next time write one in {VARIABLE} before the run)")
        return f"{label}: {comparison(self.value, float(measured), self.tolerance, self.unit, name)}"

    def versus(self, measured: float, name: str = "measured") -> None:
        """Print the prediction against the run's ``measured`` value."""
        print(self.comparison(measured, name))


def predict(prediction_id: str, value, question: str | None = None, unit: str | None = None,
            tolerance: float | None = None, lang: str = "en") -> Prediction:
    """Record ``value`` (the student's ``my_prediction``) before a run, print it, and return the
    ``Prediction`` whose ``versus(measured)`` compares after the run. A graded id takes question,
    unit and tolerance from the registry (pass none of them); an ungraded one needs ``question``
    (``unit`` default "", ``tolerance`` relative, default 0.25 = ±25 %). A value that is not a
    number is refused with a message, as None."""
    graded = GRADED.get(prediction_id)
    if graded is not None:
        if question is not None or unit is not None or tolerance is not None:
            raise ValueError(f"prediction {prediction_id} is graded: its question, unit and tolerance are "
                             f"those of parallel_lab.course.predictions.GRADED; pass the id and the value only")
        question, unit, tolerance = graded.text(lang), graded.unit, graded.tolerance
    elif question is None:
        raise ValueError(f"prediction {prediction_id} is not graded: say what it predicts (question=...)")
    tolerance = 0.25 if tolerance is None else float(tolerance)
    if not 0 <= tolerance < 10:
        raise ValueError(f"tolerance is relative (0.25 = ±25 %), got {tolerance}")
    if value is not None and not _is_number(value):
        print(f"prediction {prediction_id}: NOT YET: {VARIABLE} must be a number, got {value!r}")
        return Prediction(prediction_id, None, question, unit or "", tolerance, graded)
    recorded = Prediction(prediction_id, None if value is None else float(value), question, unit or "",
                          tolerance, graded)
    print(recorded.text())
    return recorded


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
