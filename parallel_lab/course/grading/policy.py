"""The grading policy: one file the instructor edits (``grading.yaml`` at the course's root).

    policy = Policy.load("grading.yaml")         # or Policy.load(None): the defaults below
    policy.points("exercises", 3, passed=False, cases=(2, 3))   # -> 2.0 (partial credit)
    policy.lesson_score({"exercises": (2, 3), "quizzes": (3, 3)})  # weighted share, 0..1

The file (every key optional; what it leaves out keeps its default)::

    weights:            # share of the grade per category; normalised over the categories a lesson
      exercises: 0.5    # (or the course) has, so a lesson without an exercise is graded on the rest
      quizzes: 0.3
      predictions: 0.05
      capstone: 0.15
    credit:             # per category: partial (cases passed / cases tried) or all-or-nothing
      exercises: partial
      quizzes: all-or-nothing     # a quiz earns its points at its pass mark
      predictions: all-or-nothing
      capstone: all-or-nothing
    certificate:
      threshold: 0.8    # a lesson counts as passed at this weighted share of its points
    capstone: capstone  # the quiz bank whose lesson is the capstone (its checks count as capstone)
    similarity: 0.9     # answers at least this alike are listed in the similarity report
    rubric:             # the criteria of a check that a person scores (the capstone's written analysis)
      capstone-analysis:
        - {points: 1, criterion: "..."}

**Categories.** A check is an exercise (``ring-all-reduce``), a quiz (``quiz:01``) or a graded
prediction (``predict:gpipe-bubble``); every check of the capstone lesson counts as ``capstone``.
The capstone lesson is the lesson of the bank named by ``capstone`` (its ``lesson:`` field), so
renumbering lessons changes nothing here.

**Rubrics.** A check in ``rubric`` (by default only ``capstone-analysis``, the capstone's written
analysis of its prediction's gap) is scored by a person: the grader gives it no points, exports the
text with the rubric (``capstone-analyses.md`` beside the gradebook, and the feedback), and the
instructor's score enters as an override. Its points are the sum of its criteria's.

**Scores.** Within a lesson (or over the course), each category's share is its points earned over
its points possible; the score is the weighted mean of those shares over the categories present.
The defaults let every lesson be passed without its predictions: a lesson with only a quiz and a
prediction scores 0.3 / 0.35 = 0.857 >= 0.8 with the prediction wrong (``unpassable_without``
names any lesson a policy would not let pass that way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import yaml

from parallel_lab.i18n import _, _l

CATEGORIES = ("exercises", "quizzes", "predictions", "capstone")
CREDIT = ("partial", "all-or-nothing")
DEFAULTS = {
    "weights": {"exercises": 0.5, "quizzes": 0.3, "predictions": 0.05, "capstone": 0.15},
    "credit": {"exercises": "partial", "quizzes": "all-or-nothing", "predictions": "all-or-nothing",
               "capstone": "all-or-nothing"},
    "certificate": {"threshold": 0.8},
    "capstone": "capstone",
    "similarity": 0.9,
    "rubric": {"capstone-analysis": [
        {"points": 1, "criterion": "Locates the gap: which part of the model's step (compute, bubble, TP, PP or DP "
                                   "communication, ranks sharing cores) is furthest from the run, with the "
                                   "predicted and measured numbers of the hand-in."},
        {"points": 1, "criterion": "Explains it: a cause the model leaves out or gets wrong, backed by evidence "
                                   "from the run (a step's time, the constants, a second plan or a changed "
                                   "constant that confirms it)."},
        {"points": 1, "criterion": "Draws the consequence: whether the gap would change which plan to choose, "
                                   "and what to measure before spending a budget on a real cluster."},
    ]},
}
KEYS = set(DEFAULTS)
# The default rubric's criteria again, marked for translation: a policy that keeps them is shown in
# the lesson's language (``show_rubric``), an instructor's own words as written.
RUBRIC = (
    _l("Locates the gap: which part of the model's step (compute, bubble, TP, PP or DP communication, ranks "
       "sharing cores) is furthest from the run, with the predicted and measured numbers of the hand-in."),
    _l("Explains it: a cause the model leaves out or gets wrong, backed by evidence from the run (a step's time, "
       "the constants, a second plan or a changed constant that confirms it)."),
    _l("Draws the consequence: whether the gap would change which plan to choose, and what to measure before "
       "spending a budget on a real cluster."),
)


class PolicyError(ValueError):
    """The policy file breaks an invariant; the message names the key and its value."""


@dataclass(frozen=True)
class Policy:
    """A grading policy (see the module's docstring); ``source`` is the file it came from."""

    weights: Mapping = field(default_factory=lambda: dict(DEFAULTS["weights"]))
    credit: Mapping = field(default_factory=lambda: dict(DEFAULTS["credit"]))
    threshold: float = DEFAULTS["certificate"]["threshold"]
    capstone: str = DEFAULTS["capstone"]
    similarity: float = DEFAULTS["similarity"]
    source: str = "defaults"
    rubric: Mapping = field(default_factory=lambda: {k: list(v) for k, v in DEFAULTS["rubric"].items()})

    @classmethod
    def load(cls, path=None) -> "Policy":
        """The policy in ``path`` (a YAML file), or the defaults when ``path`` is None."""
        if path is None:
            return cls()
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise PolicyError(f"cannot read the grading policy {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise PolicyError(f"{path.name}: not valid YAML: {err}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "a mapping") -> "Policy":
        """A policy from plain data (what the file holds); PolicyError names what is wrong."""
        if not isinstance(data, Mapping):
            raise PolicyError(f"{source}: a grading policy is a mapping of {', '.join(sorted(KEYS))}")
        unknown = sorted(set(data) - KEYS)
        if unknown:
            raise PolicyError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(KEYS))}")
        weights = {**DEFAULTS["weights"], **_mapping(data, "weights", source)}
        credit = {**DEFAULTS["credit"], **_mapping(data, "credit", source)}
        for name, table in (("weights", weights), ("credit", credit)):
            extra = sorted(set(table) - set(CATEGORIES))
            if extra:
                raise PolicyError(f"{source}: {name} names unknown categories {', '.join(extra)}; "
                                  f"the categories are {', '.join(CATEGORIES)}")
        for name, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                    or weight < 0:
                raise PolicyError(f"{source}: weights.{name} must be a number >= 0, got {weight!r}")
        if sum(weights.values()) <= 0:
            raise PolicyError(f"{source}: the weights sum to 0; give at least one category a weight")
        for name, mode in credit.items():
            if mode not in CREDIT:
                raise PolicyError(f"{source}: credit.{name} must be {' or '.join(CREDIT)}, got {mode!r}")
        threshold = _mapping(data, "certificate", source).get("threshold", DEFAULTS["certificate"]["threshold"])
        similarity = data.get("similarity", DEFAULTS["similarity"])
        for name, value in (("certificate.threshold", threshold), ("similarity", similarity)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise PolicyError(f"{source}: {name} must be a number in (0, 1], got {value!r}")
        capstone = data.get("capstone", DEFAULTS["capstone"])
        if not isinstance(capstone, str) or not capstone:
            raise PolicyError(f"{source}: capstone names a quiz bank (its id), got {capstone!r}")
        rubric = {**DEFAULTS["rubric"], **_mapping(data, "rubric", source)}
        for check, criteria in rubric.items():
            if not isinstance(criteria, list) or not criteria:
                raise PolicyError(f"{source}: rubric.{check} must be a list of {{points, criterion}}, got {criteria!r}")
            for n, item in enumerate(criteria, 1):
                points = item.get("points") if isinstance(item, Mapping) else None
                text = item.get("criterion") if isinstance(item, Mapping) else None
                if isinstance(points, bool) or not isinstance(points, (int, float)) or not points > 0 \
                        or not isinstance(text, str) or not text.strip():
                    raise PolicyError(f"{source}: rubric.{check} criterion {n} needs points > 0 and a criterion "
                                      f"text, got {item!r}")
        return cls(weights, credit, float(threshold), capstone, float(similarity), source, rubric)

    def as_dict(self) -> dict:
        """The policy as the file would hold it (every key written out)."""
        return {"weights": dict(self.weights), "credit": dict(self.credit),
                "certificate": {"threshold": self.threshold}, "capstone": self.capstone,
                "similarity": self.similarity, "rubric": {k: list(v) for k, v in self.rubric.items()}}

    def rubric_points(self, check_id: str) -> float:
        """The points of a check scored by a person: the sum of its rubric's criteria (0 without one)."""
        return float(sum(item["points"] for item in self.rubric.get(check_id, ())))

    def rubric_text(self, check_id: str, translate=lambda text: text) -> str:
        """A check's rubric as lines ``- (N point(s)) criterion``, each criterion through ``translate``."""
        return "\n".join(f"- ({item['points']:g}) {translate(item['criterion'])}"
                         for item in self.rubric.get(check_id, ()))

    def category(self, check_id: str, lesson: str, capstone_lesson: str | None) -> str:
        """The category of check ``check_id`` of lesson ``lesson`` ("01_ranks_and_collectives" or "01")."""
        if capstone_lesson is not None and lesson_number(lesson) == capstone_lesson:
            return "capstone"
        if check_id.startswith("quiz:"):
            return "quizzes"
        if check_id.startswith("predict:"):
            return "predictions"
        return "exercises"

    def points(self, category: str, max_points: float, passed: bool, cases=(0, 0)) -> float:
        """Points of one check: ``max_points`` × cases passed / cases tried under partial credit
        (all of them when it passed; none when nothing was tried), else all or nothing."""
        if passed:
            return float(max_points)
        good, tried = cases
        if self.credit.get(category) == "partial" and tried > 0:
            return float(max_points) * min(good, tried) / tried
        return 0.0

    def score(self, shares: Mapping) -> float:
        """The weighted score of ``{category: (points, max points)}``, over the categories with a
        maximum and a weight; 0 when there are none."""
        present = {c: (p, m) for c, (p, m) in shares.items() if m > 0 and self.weights.get(c, 0) > 0}
        total = sum(self.weights[c] for c in present)
        if total <= 0:
            return 0.0
        return sum(self.weights[c] * p / m for c, (p, m) in present.items()) / total

    def unpassable_without(self, lessons: Mapping, category: str = "predictions") -> list[str]:
        """Lessons of ``{lesson: {category: max points}}`` whose every other check right but no
        ``category`` point would score below the threshold."""
        bad = []
        for lesson, maxima in lessons.items():
            best = self.score({c: (0 if c == category else m, m) for c, m in maxima.items()})
            if best < self.threshold - 1e-9:
                bad.append(lesson)
        return bad


def show_rubric(check_id: str = "capstone-analysis", policy: Policy | None = None) -> None:
    """A lesson's cell after a written answer: it is scored by the instructor, by this rubric (the
    course's ``grading.yaml`` where there is one, else the defaults), in the lesson's language."""
    if policy is None:
        policy = Policy.load(default_file() if default_file().exists() else None)
    print(_("Your analysis: NOT YET: your instructor scores it ({points:g} points), not this notebook, by this "
            "rubric:").format(points=policy.rubric_points(check_id)))
    print(policy.rubric_text(check_id, translate=_))


def lesson_number(lesson: str) -> str:
    """``01_ranks_and_collectives`` -> ``01`` (a reference lesson's stem, or a lesson number)."""
    return str(lesson).split("_", 1)[0]


def _mapping(data: Mapping, key: str, source: str) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{source}: {key} must be a mapping, got {value!r}")
    return dict(value)


def default_file() -> Path:
    """The course's own policy file, ``grading.yaml`` at the repository's root (it may be absent)."""
    return Path(__file__).resolve().parents[3] / "grading.yaml"
