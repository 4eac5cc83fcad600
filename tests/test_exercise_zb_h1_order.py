"""Lesson 07's exercise, the ZB-H1 order (parallel_lab.exercises.zb_h1_order): a correct answer
written two ways passes, simulated and on real ranks; the stub is NOT YET without a process; valid
schedules that are not ZB-H1 fail naming what differs (1F1B's bubble, W's deferred too long, extra
warm-up forwards, a full backward); the library's schedules are refused from the source; every
verdict is deterministic text."""

import pytest
from exercise_support import lesson_solution

from parallel_lab.exercises import REGISTRY, check_zb_h1_order
from parallel_lab.exercises.check import compile_answer
from parallel_lab.exercises.zb_h1_order import CASES, EXERCISE, one_f_one_b_split, zb_h1_case
from parallel_lab.pipeline.schedules import zb_h1
from parallel_lab.runtime import launcher

SOLUTION = lesson_solution("07_zero_bubble.py", "zb-h1-order")

# The same order another way: counters instead of indices, (stage, kind, micro-batch) tuples for the
# forwards, and a dict rank -> actions.
WITH_COUNTERS = '''def my_zb_h1(p, m):
    out = {}
    for r in range(p):
        order, f, i, w = [], 0, 0, 0
        for _ in range(min(p - r - 1, m)):
            order.append((r, "F", f))
            f += 1
        while i < m:
            if f < m:
                order.append((r, "F", f))
                f += 1
            order.append(f"{r}I{i}")
            i += 1
            if i - w > r:
                order.append(f"{r}W{w}")
                w += 1
        order += [f"{r}W{j}" for j in range(w, m)]
        out[r] = order
    return out
'''

STUB = '''def my_zb_h1(p, m):
    ranks = []
    for r in range(p):
        # YOUR CODE HERE
        raise NotImplementedError
        ranks.append(actions)
    return ranks
'''

# 1F1B with each backward split into I and W, W right after its I: valid, but no W is deferred.
SPLIT_1F1B = '''def my_zb_h1(p, m):
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        actions = [f"{r}F{j}" for j in range(warmup)]
        for k in range(m - warmup):
            actions += [f"{r}F{warmup + k}", f"{r}I{k}", f"{r}W{k}"]
        for j in range(m - warmup, m):
            actions += [f"{r}I{j}", f"{r}W{j}"]
        ranks.append(actions)
    return ranks
'''


def answer(source: str, p: int, m: int) -> dict:
    """What the rank's harness would send back for one case (the answer run here, in the test)."""
    return {"ranks": compile_answer(source, "my_zb_h1")(p, m)}


def judged(source: str, p: int, m: int) -> tuple[bool, list]:
    return zb_h1_case(answer(source, p, m), p, m, "my_zb_h1")


# ----------------------------------------------------------------------------------------------
# Without processes: the order and the simulator.


def test_registered_with_what_it_forbids():
    assert REGISTRY["zb-h1-order"] is EXERCISE
    assert EXERCISE.policy.name == "my_zb_h1" and "zb_h1" in EXERCISE.forbids


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (3, 2), (4, 3), (4, 8), (5, 12), (8, 8)])
def test_both_correct_answers_give_the_library_order(p, m):
    for source in (SOLUTION, WITH_COUNTERS):
        ranks = compile_answer(source, "my_zb_h1")(p, m)
        rows = [ranks[r] for r in sorted(ranks)] if isinstance(ranks, dict) else ranks
        assert [[a if isinstance(a, str) else "".join(map(str, a)) for a in row] for row in rows] == \
            [[str(a) for a in row] for row in zb_h1(p, m).ranks]


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["ZB-H1: NOT YET: my_zb_h1 still raises NotImplementedError; write your code where it "
                             "says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source,reason", [
    ("from parallel_lab.pipeline.schedules import zb_h1\n\n\ndef my_zb_h1(p, m):\n    return zb_h1(p, m).ranks\n",
     "imports parallel_lab.pipeline.schedules: the library's own implementation is not an answer"),
    ("import parallel_lab.pipeline.schedules as s\n\n\ndef my_zb_h1(p, m):\n    return s.build('zb-h1', p, m).ranks\n",
     "imports parallel_lab.pipeline.schedules"),
    ("import os\n" + SOLUTION, "imports os: this exercise may import only math, itertools"),
    ("def my_zb_h1(p, m):\n    return eval('[]')\n", "uses eval"),
    ("def zb(p, m):\n    return []\n", "defines no my_zb_h1"),
])
def test_the_library_and_other_shortcuts_are_refused_from_the_source(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("ZB-H1: FAILED: your answer ")
    assert reason in verdict.lines[0]
    assert launcher.pool_pids() == before


def test_1f1b_with_each_w_after_its_i_fails_on_its_bubble():
    passed, lines = judged(SPLIT_1F1B, 4, 8)
    assert not passed
    assert lines == ["ZB-H1 p=4, m=8: FAILED: with F = I = W = 1 each rank idles [6, 6, 6, 6] time units, 1F1B's "
                     "bubble (1F1B's order with each W right after its I idles as long); ZB-H1 idles [3, 3, 3, 3]; "
                     "W passes not deferred to fill the cool-down: rank 1 runs 1 W after its last I, ZB-H1 2 "
                     "(rank r holds back its first r W's)"]
    assert [str(a) for a in one_f_one_b_split(4, 8).ranks[3][:4]] == ["3F0", "3I0", "3W0", "3F1"]


def test_full_backwards_fail_asking_for_i_and_w():
    one_f_one_b = SPLIT_1F1B.replace('f"{r}I{k}", f"{r}W{k}"', 'f"{r}B{k}"').replace('f"{r}I{j}", f"{r}W{j}"',
                                                                                        'f"{r}B{j}"')
    passed, lines = judged(one_f_one_b, 2, 4)
    assert not passed and lines == [
        "ZB-H1 p=2, m=4: FAILED: rank 0 runs the full backward 0B0: ZB-H1 splits every backward into I (input "
        "gradient, '0I0') and W (weight gradient, '0W0'), so that the W's can fill the bubble"]


def test_every_w_at_the_end_fails_as_deferred_too_long():
    late = SOLUTION.replace("if k >= r:", "if False:").replace("range(max(m - r, 0), m)", "range(m)")
    for p, m in CASES:
        passed, lines = judged(late, p, m)
        assert not passed and "FAILED" in lines[0]
        assert "W passes deferred too long: rank 0 runs" in lines[0], lines


def test_more_warm_up_forwards_or_more_deferred_ws_fail_on_memory_counted_until_w():
    extra_forwards = SOLUTION.replace("warmup = min(p - r - 1, m)", "warmup = min(2 * (p - r - 1), m)")
    passed, lines = judged(extra_forwards, 4, 8)
    assert not passed and lines == [
        "ZB-H1 p=4, m=8: FAILED: stage 0 holds up to 7 micro-batches of activations at once (counted until W: "
        "I frees M_B − M_W, W the rest), ZB-H1 4; rank 0 runs up to 7 forwards ahead of their I, ZB-H1 (as 1F1B) "
        "at most min(m, p−r) = 4: p−r−1 warm-up forwards, not more"]
    one_more = (SOLUTION.replace("if k >= r:", "if k >= r + 1:").replace("W{k - r}", "W{k - r - 1}")
                .replace("range(max(m - r, 0), m)", "range(max(m - r - 1, 0), m)"))
    passed, lines = judged(one_more, 4, 8)
    assert not passed
    assert lines[0].startswith("ZB-H1 p=4, m=8: FAILED: stage 0 holds up to 4.941176 micro-batches of activations")
    assert "rank 0 keeps up to 2 micro-batches waiting for their W, ZB-H1 at most 1" in lines[0]


def test_an_invalid_order_fails_with_the_grid_marked():
    backwards_first = SOLUTION.replace('actions.append(f"{r}I{k}")', 'actions.insert(0, f"{r}I{k}")')
    passed, lines = judged(backwards_first, 2, 4)
    assert not passed
    assert lines[0] == ("ZB-H1 p=2, m=4: FAILED: my_zb_h1: rank 1, step 0: 1I3 runs before its input 1F3 "
                        "(stage 1, microbatch 3), which comes later on the same rank (step 9)")
    assert any(">1I3<" in line for line in lines[1:])
    assert zb_h1_case({"ranks": [["0F0"]]}, 2, 1, "my_zb_h1")[1] == [
        "ZB-H1 p=2, m=1: FAILED: my_zb_h1: returned 1 rank lists for p=2; expected one per rank"]


# ----------------------------------------------------------------------------------------------
# On real ranks.

ranks = pytest.mark.ranks

PASSED = [
    "ZB-H1 p=2, m=4: PASSED: valid, every backward split into I and W; idle per rank [1, 1] with F = I = W = 1 as "
    "ZB-H1 (1F1B idles [3, 3]); peak stash [2, 1.941176] M_B, within ZB-H1's; on 2 real ranks: loss and gradients "
    "equal the single-process model, measured stash [2, 1.888889] as simulated",
    "ZB-H1 p=4, m=8: PASSED: valid, every backward split into I and W; idle per rank [3, 3, 3, 3] with F = I = W = 1 "
    "as ZB-H1 (1F1B idles [9, 9, 9, 9]); peak stash [4, 3.941176, 3.882353, 3.823529] M_B, within ZB-H1's; on 4 real "
    "ranks: loss and gradients equal the single-process model, measured stash [4, 3.888889, 3.777778, 3.666667] as "
    "simulated",
    "ZB-H1 p=4, m=3: PASSED: valid, every backward split into I and W; idle per rank [4, 4, 4, 4] with F = I = W = 1 "
    "as ZB-H1 (1F1B idles [9, 9, 9, 9]); peak stash [3, 3, 2.941176, 2.882353] M_B, within ZB-H1's; on 4 real ranks: "
    "loss and gradients equal the single-process model, measured stash [3, 3, 2.888889, 2.777778] as simulated",
]


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_correct_answer_pass_on_real_ranks():
    for source in (SOLUTION, WITH_COUNTERS):
        verdict = EXERCISE.check(source)
        assert verdict.passed, verdict
        assert verdict.lines == PASSED


@ranks
@pytest.mark.timeout(300)
def test_a_wrong_answer_fails_through_the_whole_check_and_its_verdict_is_deterministic():
    first = EXERCISE.check(SPLIT_1F1B)
    assert not first.passed and len(first.lines) == len(CASES)
    assert all(": FAILED: with F = I = W = 1 each rank idles" in line for line in first.lines)
    assert first.reason.startswith("ZB-H1 p=2, m=4: FAILED:")
    assert EXERCISE.check(SPLIT_1F1B).lines == first.lines
    raises = EXERCISE.check("def my_zb_h1(p, m):\n    return undefined_name if m == 8 else [[]] * p\n")
    assert not raises.passed
    assert raises.lines[0].startswith("ZB-H1 p=2, m=4: FAILED: my_zb_h1: 0F0 (stage 0, microbatch 0) is missing")
    assert "ZB-H1 p=4, m=8: FAILED: my_zb_h1(4, 8) raised NameError: name 'undefined_name' is not defined" in \
        [line.splitlines()[0] for line in raises.lines]


def my_zb_h1(p, m):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_zb_h1_order(my_zb_h1)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_zb_h1"):
        check_zb_h1_order(answer)
