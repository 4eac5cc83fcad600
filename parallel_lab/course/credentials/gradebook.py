"""What a learner has passed, read from a gradebook that ``parallel-lab grade`` wrote: the input of
a credential's ``Achievement`` when an instructor issues one by hand (``certificate issue``). The
grading policy decides (``course.grading.gradebook.standing``: its weights, credit, threshold and
the instructor's overrides), so a credential and the gradebook's summary never disagree."""

from __future__ import annotations

import os

DEFAULT_THRESHOLD = 0.8  # a lesson's score needed to count it as passed (the grading policy's default)


def lessons_from_gradebook(gradebook: str | os.PathLike, student: str, threshold: float | None = None,
                           policy=None, overrides=None) -> dict[str, list[str]]:
    """``{lesson: [checks passed in it]}`` for every lesson ``student`` passed under the grading
    ``policy`` (a ``Policy``, a policy file, or None: the defaults) and the instructor's ``overrides``
    (a file or a list); ``threshold``, when given, replaces the policy's. A lesson named
    ``01_ranks_and_collectives`` counts as "01"; a check is a gradebook row's ``exercise`` whose
    ``passed`` is true. ValueError if the student has no row or the gradebook cannot be read."""
    from parallel_lab.course.grading.gradebook import standing
    from parallel_lab.course.grading.policy import Policy

    policy = policy if isinstance(policy, Policy) else Policy.load(policy)
    if threshold is not None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        policy = Policy(policy.weights, policy.credit, threshold, policy.capstone, policy.similarity, policy.source,
                        policy.rubric)
    try:
        found = standing(student, gradebook, policy, overrides)
    except OSError as exc:
        raise ValueError(f"cannot read the gradebook {gradebook}: {exc.strerror}") from None
    except KeyError as exc:
        raise ValueError(f"{gradebook} is not a gradebook written by `parallel-lab grade` ({exc!r})") from None
    except ValueError as exc:
        raise ValueError(f"{exc} {gradebook}") from None
    return {lesson: sorted(found.lesson_checks.get(lesson, ())) for lesson in found.lessons_passed}
