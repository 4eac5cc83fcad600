"""Lesson 03's exercise, a schedule written by hand (parallel_lab.exercises.hand_schedule): the
solution and another valid order pass, simulated and on real ranks; the stub is NOT YET without a
process; schedules the validator refuses (a deadlock, a missing action, an action on the wrong rank,
a backward before its forward, the wrong number of ranks) fail with the validator's reason and the
grid marked; imports and the library are refused from the source; every verdict is deterministic."""

import pytest

from parallel_lab.exercises import REGISTRY, check_hand_schedule
from parallel_lab.exercises.check import compile_answer
from parallel_lab.exercises.hand_schedule import EXERCISE, M, P, hand_case
from parallel_lab.runtime import launcher

# GPipe's order for p = 3, m = 2 (the lesson's solution): all forwards, then all backwards.
SOLUTION = '''def my_schedule():
    return [
        ["0F0", "0F1", "0B0", "0B1"],
        ["1F0", "1F1", "1B0", "1B1"],
        ["2F0", "2F1", "2B0", "2B1"],
    ]
'''

# Another valid order: the last stage runs each backward as soon as it can (as 1F1B will), in a dict.
EARLY_BACKWARD = '''def my_schedule():
    return {0: "0F0 0F1 0B0 0B1", 1: ["1F0", "1F1", "1B0", "1B1"], 2: ["2F0", "2B0", "2F1", "2B1"]}
'''

STUB = '''def my_schedule():
    # YOUR CODE HERE
    raise NotImplementedError
'''


def judged(source: str) -> tuple[bool, list]:
    return hand_case({"ranks": compile_answer(source, "my_schedule")()})


def test_registered_with_what_it_forbids():
    assert REGISTRY["hand-schedule"] is EXERCISE and EXERCISE.policy.name == "my_schedule"
    assert (P, M) == (3, 2)


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["Hand schedule: NOT YET: my_schedule still raises NotImplementedError; write your code "
                             "where it says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source,reason", [
    ("from parallel_lab.pipeline.schedules import build\n\n\ndef my_schedule():\n    return build('gpipe', 3, 2)\n",
     "imports parallel_lab.pipeline.schedules"),
    ("import itertools\n" + SOLUTION, "imports itertools"),
    ("def my_schedule():\n    return eval('[]')\n", "uses eval"),
    ("def schedule():\n    return []\n", "defines no my_schedule"),
])
def test_imports_and_shortcuts_are_refused_from_the_source(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("Hand schedule: FAILED: your answer ")
    assert reason in verdict.lines[0]
    assert launcher.pool_pids() == before


def test_rank_0_running_its_backward_before_its_second_forward_deadlocks():
    passed, lines = judged(SOLUTION.replace('"0F0", "0F1", "0B0", "0B1"', '"0F0", "0B0", "0F1", "0B1"'))
    assert not passed
    assert lines[0] == ("hand schedule p=3, m=2: FAILED: my_schedule: no rank can progress (deadlock): rank 0, step 1: "
                        "0B0 waits for its input 1B0 (stage 1, microbatch 0) from rank 1; rank 1, step 1: 1F1 waits "
                        "for its input 0F1 (stage 0, microbatch 1) from rank 0; back to rank 0, a cycle")
    assert any(">0B0<" in line for line in lines[1:])


@pytest.mark.parametrize("change,reason", [
    (('"2B0", "2B1"', '"2B0"'), "2B1 (stage 2, microbatch 1) is missing (expected on rank 2)"),
    (('"1F0", "1F1"', '"1F0", "2F1"'), "rank 1, step 1: 2F1 is on rank 1 but stage 2 lives on rank 2"),
    (('"2F0", "2F1", "2B0"', '"2B0", "2F0", "2F1"'), "rank 2, step 0: 2B0 runs before its input 2F0"),
])
def test_what_the_validator_refuses_fails_with_its_reason_and_the_grid(change, reason):
    passed, lines = judged(SOLUTION.replace(*change))
    assert not passed and lines[0].startswith("hand schedule p=3, m=2: FAILED: my_schedule: ")
    assert reason in lines[0], lines[0]
    assert lines[1].split() == ["step", "rank", "0", "rank", "1", "rank", "2"]


def test_the_wrong_number_of_ranks_or_a_raising_answer_fail():
    assert hand_case({"ranks": [["0F0"]]}) == (False, [
        "hand schedule p=3, m=2: FAILED: my_schedule: returned 1 rank lists for p=3; expected one per rank"])
    assert hand_case({"error": "NameError: name 'x' is not defined"}) == (False, [
        "hand schedule p=3, m=2: FAILED: my_schedule() raised NameError: name 'x' is not defined"])


# ----------------------------------------------------------------------------------------------
# On real ranks.


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_the_solution_and_another_valid_order_pass_on_real_ranks():
    expected = {SOLUTION: "step 12 time units (F = 1, B = 2), bubble 50.0%",
                EARLY_BACKWARD: "step 12 time units (F = 1, B = 2), bubble 50.0%"}
    for source, shape in expected.items():
        verdict = EXERCISE.check(source)
        assert verdict.passed and verdict.cases == (1, 1), verdict
        assert verdict.lines == [f"hand schedule p=3, m=2: PASSED: valid; {shape}; on 3 real ranks: loss and "
                                 "gradients equal the single-process model"]


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_deadlocking_answer_fails_through_the_whole_check_before_any_pipeline_runs():
    verdict = EXERCISE.check(SOLUTION.replace('"0F0", "0F1", "0B0", "0B1"', '"0F0", "0B0", "0F1", "0B1"'))
    assert not verdict.passed and verdict.cases == (0, 1)
    assert verdict.reason.startswith("hand schedule p=3, m=2: FAILED: my_schedule: no rank can progress (deadlock)")


def my_schedule():
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_hand_schedule(my_schedule)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_schedule"):
        check_hand_schedule(judged)
