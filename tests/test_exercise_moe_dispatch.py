"""Lesson 13's exercise, the MoE dispatch (parallel_lab.exercises.moe_dispatch): the solution passes on
real ranks, its queues driving a real expert-parallel forward equal to models.MoE; the stub is NOT
YET without a process; wrong queues (filled token by token, no capacity, one too many, the right
assignments in another order) fail naming what is wrong; the library and torch.distributed are
refused from the source; every verdict is deterministic text."""

import pytest

from parallel_lab import models
from parallel_lab.exercises import REGISTRY, check_moe_dispatch
from parallel_lab.exercises.check import compile_answer
from parallel_lab.exercises.moe_dispatch import EP_CASE, EXERCISE, WORKED, _queue_case, cases, reference_queues
from parallel_lab.moe.run import reference
from parallel_lab.runtime import launcher

SOLUTION = '''def my_dispatch(expert, experts, capacity):
    n, k = expert.shape
    queues = [[] for _ in range(experts)]
    for s in range(k):
        for t in range(n):
            e = int(expert[t, s])
            if len(queues[e]) < capacity:
                queues[e].append((t, s))
    return queues
'''

STUB = '''def my_dispatch(expert, experts, capacity):
    n, k = expert.shape
    queues = [[] for _ in range(experts)]
    # YOUR CODE HERE
    raise NotImplementedError
    return queues
'''

TOKEN_MAJOR = SOLUTION.replace("for s in range(k):\n        for t in range(n):",
                               "for t in range(n):\n        for s in range(k):")
NO_CAPACITY = SOLUTION.replace("if len(queues[e]) < capacity:", "if True:")
ONE_TOO_MANY = SOLUTION.replace("if len(queues[e]) < capacity:", "if len(queues[e]) <= capacity:")
REVERSED = SOLUTION.replace("    return queues\n", "    return [q[::-1] for q in queues]\n")


def judged(source: str, case: int = 0) -> tuple[bool, str]:
    """One routing's line, the answer run here (what the rank's harness would send back)."""
    label, choices, experts, capacity = cases()[case]
    fn = compile_answer(source, "my_dispatch")
    import torch
    queues = [[list(ts) for ts in q] for q in fn(torch.tensor(choices), experts, capacity)]
    return _queue_case(label, {"queues": queues}, choices, experts, capacity)


# ----------------------------------------------------------------------------------------------
# Without processes.


def test_registered_with_what_it_forbids():
    assert REGISTRY["moe-dispatch"] is EXERCISE
    assert EXERCISE.policy.name == "my_dispatch" and "torch.distributed" in EXERCISE.forbids


def test_reference_queues_are_models_moe_positions():
    for _, choices, experts, capacity in cases():
        import torch
        expert = torch.tensor(choices)
        counts = models.assignment_counts(expert, experts)
        position = models.queue_positions(expert, experts, counts.cumsum(0) - counts)
        for e, queue in enumerate(reference_queues(choices, experts, capacity)):
            assert [int(position[t, s]) for t, s in queue] == list(range(len(queue)))
            assert all(choices[t][s] == e for t, s in queue)
        kept = sum(len(q) for q in reference_queues(choices, experts, capacity))
        assert kept == int((position < capacity).sum())
    assert reference_queues(WORKED, 3, 4)[0] == [(0, 0), (1, 0), (3, 0), (5, 0)]


def test_the_solution_gives_the_reference_queues():
    for case in range(len(cases())):
        passed, line = judged(SOLUTION, case)
        assert passed and ": PASSED: queues equal models.MoE's" in line, line


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["MoE dispatch: NOT YET: my_dispatch still raises NotImplementedError; write your code "
                             "where it says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source,reason", [
    ("from parallel_lab.models import queue_positions\n\n\ndef my_dispatch(expert, experts, capacity):\n"
     "    return queue_positions(expert, experts, 0)\n",
     "imports parallel_lab.models: the library's own implementation is not an answer"),
    ("import parallel_lab.moe.layer as layer\n" + SOLUTION, "imports parallel_lab.moe.layer"),
    ("import os\n" + SOLUTION, "imports os: this exercise may import only math, itertools, collections"),
    (SOLUTION.replace("    return queues\n", "    dist.barrier()\n    return queues\n"), "uses dist.barrier"),
    ("def my_dispatch(expert, experts, capacity):\n    return eval('[]')\n", "uses eval"),
    ("def dispatch(expert, experts, capacity):\n    return []\n", "defines no my_dispatch"),
])
def test_the_library_and_other_shortcuts_are_refused_from_the_source(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("MoE dispatch: FAILED: your answer ")
    assert reason in verdict.lines[0], verdict.lines
    assert launcher.pool_pids() == before


def test_queues_filled_token_by_token_fail_naming_the_rule():
    passed, line = judged(TOKEN_MAJOR)
    assert not passed
    assert line == ("MoE dispatch, 6 tokens, 3 experts, top-2, capacity factor 1 (capacity 4): FAILED: you filled "
                    "the queues token by token: expert 0 keeps (token 2, choice 1) and drops (token 5, choice 0); "
                    "the queues fill choice by choice, every token's first choice before any second choice "
                    "(GShard), and within a choice in token order")
    passed, line = judged(TOKEN_MAJOR, 3)  # no capacity: the same assignments, queued in another order
    assert not passed and "FAILED: you filled the queues token by token: expert 1's queue is [(1, 1)" in line


def test_no_capacity_or_one_too_many_fail_on_the_capacity():
    passed, line = judged(NO_CAPACITY)
    assert not passed and line.endswith("FAILED: expert 0 receives 6 assignments, but its capacity is 4: drop those "
                                        "whose place in the queue is 4 or beyond (the token keeps its other choices)")
    passed, line = judged(ONE_TOO_MANY)
    assert not passed and "FAILED: expert 0 receives 5 assignments, but its capacity is 4" in line


def test_the_right_assignments_in_another_order_fail_on_the_order():
    passed, line = judged(REVERSED, 3)
    assert not passed and "FAILED: expert 0 takes the right assignments in another order: yours [(" in line
    assert "the library's queue positions [(0, 0), (1, 0), (2, 1)" in line, line


def test_a_wrong_expert_or_a_malformed_answer_is_named():
    label, choices, experts, capacity = cases()[0]
    swapped = [[list(ts) for ts in q] for q in reference_queues(choices, experts, capacity)]
    swapped[0][0], swapped[1][0] = swapped[1][0], swapped[0][0]
    passed, line = _queue_case(label, {"queues": swapped}, choices, experts, capacity)
    assert not passed and "FAILED: expert 0's queue holds (token 2, choice 0), but that choice is expert 1" in line
    passed, line = _queue_case(label, {"malformed": "int"}, choices, experts, capacity)
    assert not passed and "returned a int; expected a list of 3 queues" in line


# ----------------------------------------------------------------------------------------------
# On real ranks.

ranks = pytest.mark.ranks


@ranks
@pytest.mark.timeout(300)
def test_the_solution_passes_and_drives_a_real_expert_parallel_forward():
    verdict = EXERCISE.check(SOLUTION)
    assert verdict.passed, verdict
    assert len(verdict.lines) == len(cases()) + 1
    dropped = reference(EP_CASE)["dropped"]
    n = EP_CASE.batch * EP_CASE.seq
    assert verdict.lines[-1] == (
        f"MoE dispatch on 2 real ranks (4 experts, 2 per rank, {n} tokens, top-2, capacity factor 1): PASSED: the "
        f"dispatch and combine all-to-alls carried {n * 2 - dropped} of {n * 2} assignments ({dropped} dropped) and "
        f"the output equals models.MoE's on the whole batch (fp64, to 1e-12)")
    assert dropped > 0  # the real run drops, so the capacity is tested there too


@ranks
@pytest.mark.timeout(300)
def test_a_wrong_answer_fails_on_ranks_and_its_verdict_is_deterministic():
    first = EXERCISE.check(TOKEN_MAJOR)
    assert not first.passed and len(first.lines) == len(cases())  # the real run waits for right queues
    assert first.reason.startswith("MoE dispatch, 6 tokens, 3 experts, top-2, capacity factor 1 (capacity 4): "
                                   "FAILED: you filled the queues token by token")
    assert EXERCISE.check(TOKEN_MAJOR).lines == first.lines


def my_dispatch(expert, experts, capacity):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_moe_dispatch(my_dispatch)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_dispatch"):
        check_moe_dispatch(judged)
