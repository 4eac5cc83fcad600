"""Lesson 17's exercise (parallel_lab.exercises.bubble_share): the idle share of a step under 1F1B and
interleaved 1F1B, judged against the simulator; the closed form passes, the common slips fail with a
hint, the stub is "not yet" and the library is refused."""

import pytest

from parallel_lab.exercises.bubble_share import CASES, EXERCISE, simulated_share

SOLUTION = "def my_bubble_share(p, m, v=1):\n    return (p - 1) / (v * m + p - 1)\n"


def ranks(test):
    """Starts the checker's rank pool."""
    return pytest.mark.ranks(pytest.mark.timeout(120)(test))


def test_the_simulator_gives_narayanans_closed_form_on_every_case():
    for p, m, v in CASES:
        assert simulated_share(p, m, v) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


@ranks
def test_the_closed_form_passes_and_slips_fail_with_their_hint():
    verdict = EXERCISE.check(SOLUTION)
    assert verdict.passed and verdict.cases == (len(CASES), len(CASES))
    no_v = EXERCISE.check("def my_bubble_share(p, m, v=1):\n    return (p - 1) / (m + p - 1)\n")
    assert not no_v.passed and "without interleaving" in str(no_v)
    assert no_v.cases == (sum(v == 1 for _p, _m, v in CASES), len(CASES))
    ideal = EXERCISE.check("def my_bubble_share(p, m, v=1):\n    return (p - 1) / (v * m)\n")
    assert not ideal.passed and "over the ideal time" in str(ideal)


def test_the_stub_is_not_yet_and_the_library_is_refused():
    stub = EXERCISE.check("def my_bubble_share(p, m, v=1):\n    # YOUR CODE HERE\n    raise NotImplementedError\n")
    assert stub.not_yet and not stub.passed
    lib = EXERCISE.check("from parallel_lab.planning import cost\n\ndef my_bubble_share(p, m, v=1):\n    return 0.0\n")
    assert not lib.passed and "parallel_lab" in str(lib)


@ranks
def test_an_answer_that_refuses_a_case_with_not_implemented_error_is_written_and_fails_that_case():
    """A raise NotImplementedError under an else: is the answer's own refusal of a case, not the
    lesson's stub: the check runs it, and each case it refuses fails like any error, the others count."""
    partial = ("def my_bubble_share(p, m, v=1):\n    if v == 1:\n        return (p - 1) / (m + p - 1)\n"
               "    else:\n        raise NotImplementedError('interleaving is not supported')\n")
    verdict = EXERCISE.check(partial)
    plain = sum(v == 1 for _p, _m, v in CASES)
    assert not verdict.passed and not verdict.not_yet and verdict.cases == (plain, len(CASES)), str(verdict)
    assert verdict.reason == f"bubble share: FAILED ({plain}/{len(CASES)} cases)"
    assert "p 4, m 8, v 2: NotImplementedError: interleaving is not supported" in str(verdict)
