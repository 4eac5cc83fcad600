"""Lesson 09's exercise: the exact min-max cut of layer costs into contiguous stages
(lessons/09_balancing_stages.ipynb).

The answer runs on a rank of its own and returns only its cuts (lists of integers); the checking
process compares the heaviest stage of each with the optimum of ``pipeline.partition.balanced``. Any
optimal cut passes. The library's partitioner is forbidden in the answer (from the source).
"""

from __future__ import annotations

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    register,
    run_answer,
    tallied,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline import partition
from parallel_lab.pipeline.balance import min_bottleneck
from parallel_lab.pipeline.stages import check_parts

CASES = (
    ([3, 1, 4, 1, 5, 9, 2, 6], 3),
    ([1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 5], 4),
    ([5, 1, 1, 1, 1, 1, 1, 5], 4),
    ([1] * 10, 3),
    ([7, 7, 7], 3),
    ([0.5, 0.25, 2.0, 0.125, 1.0, 1.0, 0.75], 2),
    ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 5),
    ([2, 9, 4, 4, 3, 8, 1, 1, 6, 2, 2, 5, 7, 3], 6),
)
POLICY = Policy("my_balanced_cut", imports=("math", "itertools", "bisect", "functools"), dist=())


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: the answer's ``parts`` for each case (``{"parts": [...]}``), or its error."""
    fn = compile_answer(source, name)
    out = []
    for weights, stages in cases:
        try:
            parts = fn(list(weights), stages)
            out.append({"parts": [b if isinstance(b, (int, float)) else str(b) for b in parts]})
        except Exception as err:  # the answer's own error: reported per case
            out.append({"error": answer_error(err)})
    return out


def judge_case(answer: dict, weights, stages) -> str | None:
    """Why the answer to one case is wrong, or None."""
    if "error" in answer:
        return answer["error"]
    try:
        parts = check_parts(answer["parts"], len(weights))
    except ValueError as err:
        return str(err)
    if len(parts) != stages + 1:
        return _("returned {got} stages, expected {stages}").format(got=len(parts) - 1, stages=stages)
    got, best = max(partition.stage_loads(weights, parts)), min_bottleneck(weights, stages)
    if got > best + 1e-9:
        return _("heaviest stage {got:g}, but {best:g} is possible (parts {parts})").format(got=got, best=best,
                                                                                            parts=parts)
    return None


def judge(source: str):
    answers = run_answer(harness, source, POLICY.name, 1, str(EXERCISE.label))
    if isinstance(answers, str):
        return False, [answers], (0, len(CASES))
    case = _("{weights} into {stages} stages: {wrong}")
    failures = [case.format(weights=list(weights), stages=stages, wrong=wrong)
                for (weights, stages), answer in zip(CASES, answers[0])
                if (wrong := judge_case(answer, weights, stages))]
    return tallied(failures, len(CASES), _("balanced cut: FAILED ({passed}/{tried} cases)"),
                   _("balanced cut: PASSED ({n}/{n} cases)"))


EXERCISE = register(Exercise(
    "balanced-cut", _l("balanced cut"), POLICY, judge,
    forbids="the library's partitioner (partition.balanced): write the search yourself",
    copies=tuple(f"parallel_lab.pipeline.partition:{name}" for name in ("balanced", "_cut", "_stages_needed"))))


def check_balanced_cut(fn) -> Verdict:
    """Lesson 09's exercise: ``fn(weights, stages)`` returns ``parts`` whose heaviest stage is as
    light as possible. Prints and returns a deterministic verdict."""
    return EXERCISE.check_object(fn)
