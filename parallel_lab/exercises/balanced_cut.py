"""Lesson 08's exercise: the exact min-max cut of layer costs into contiguous stages
(lessons/08_balancing_stages.ipynb). Pure, so no ranks are needed: the student's function is called
in the checking process and its cut compared with ``pipeline.partition.balanced``'s bottleneck.
"""

from __future__ import annotations

from parallel_lab.exercises.check import Verdict
from parallel_lab.pipeline import partition
from parallel_lab.pipeline.balance import min_bottleneck
from parallel_lab.pipeline.stages import check_parts

EXERCISE_CASES = (
    ([3, 1, 4, 1, 5, 9, 2, 6], 3),
    ([1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 5], 4),
    ([5, 1, 1, 1, 1, 1, 1, 5], 4),
    ([1] * 10, 3),
    ([7, 7, 7], 3),
    ([0.5, 0.25, 2.0, 0.125, 1.0, 1.0, 0.75], 2),
    ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 5),
    ([2, 9, 4, 4, 3, 8, 1, 1, 6, 2, 2, 5, 7, 3], 6),
)


def _case_result(fn, weights, stages) -> tuple[bool, str]:
    try:
        parts = fn(list(weights), stages)
        parts = check_parts(parts, len(weights))
    except Exception as exc:  # the student's code: report, never raise
        return False, f"{type(exc).__name__}: {exc}"
    if len(parts) != stages + 1:
        return False, f"returned {len(parts) - 1} stages, expected {stages}"
    got, best = max(partition.stage_loads(weights, parts)), min_bottleneck(weights, stages)
    if got > best + 1e-9:
        return False, f"heaviest stage {got:g}, but {best:g} is possible (parts {parts})"
    return True, ""


def check_balanced_cut(fn, cases=EXERCISE_CASES) -> Verdict:
    """Lesson 08's exercise: ``fn(weights, stages)`` returns ``parts`` whose heaviest stage is as
    light as possible. Prints and returns a deterministic verdict."""
    failures = []
    for weights, stages in cases:
        ok, detail = _case_result(fn, weights, stages)
        if not ok:
            failures.append(f"{list(weights)} into {stages} stages: {detail}")
    if failures:
        lines = [f"balanced cut: FAILED ({len(cases) - len(failures)}/{len(cases)} cases)", "  " + failures[0]]
    else:
        lines = [f"balanced cut: PASSED ({len(cases)}/{len(cases)} cases)"]
    verdict = Verdict(not failures, lines)
    print(verdict)
    return verdict
