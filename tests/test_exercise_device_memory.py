"""Lesson 15's exercise, the memory of one GPU (parallel_lab.exercises.device_memory): a correct
formula written two ways passes against the memory model and the course GPT's real tensors; the
stub is NOT YET without a process; a wrong formula fails naming the entry, the factor and the slip
it matches (2-byte values where the plan has 4, GPipe's stash, a forgotten embedding, ZeRO-1
ignored, ...); the library and its memory model are refused from the source; the verdict is
deterministic text."""

import math

import pytest

from parallel_lab.exercises import REGISTRY, check_device_memory
from parallel_lab.exercises.device_memory import (
    CASES,
    EXERCISE,
    FIELDS,
    REAL_BLOCK,
    REAL_PARAMS,
    _real_counts,
    describe,
    expected,
    harness,
    wrong,
)
from parallel_lab.runtime import launcher

SOLUTION = '''import math


def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                     sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
    L, h, a, V, s = model["layers"], model["hidden"], model["heads"], model["vocab"], model["seq"]
    b, t, v = micro_batch, tp, value_bytes
    params = L // pp * ((12 * h * h + 7 * h) // t + 6 * h) + math.ceil(V / t) * h + s * h
    weights = gradients = 2 * params
    optimizer = 12 * params / (dp if zero1 else 1)
    sbh = s * b * h
    if recompute == "full":
        per_layer = v * sbh / (t if sequence_parallel else 1)
    else:
        whole, split = 4 * v + (2 if dropout else 0), 12 * v
        per_layer = sbh * (whole + split) / t if sequence_parallel else sbh * (whole + split / t)
        if recompute == "none":
            per_layer += a * s * s * b * (2 * v + 1 if dropout else v) / t
    activations = min(microbatches, pp) * (L // pp) * per_layer
    return {"params": params, "weights": weights, "gradients": gradients, "optimizer": optimizer,
            "activations": activations}
'''

# The same formula another way: integers throughout (-(-V // t) for the rounded-up vocabulary), one
# table of bytes per sbh value, and a loop over the layers and micro-batches in flight.
INTEGERS = '''def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                     sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
    h, s, t = model["hidden"], model["seq"], tp
    layers = model["layers"] // pp
    block = (12 * h * h + 7 * h) // t + 6 * h
    params = layers * block + (-(-model["vocab"] // t) + s) * h
    tokens = s * micro_batch
    mask = 1 if dropout else 0
    if recompute == "full":
        layer = value_bytes * tokens * h / (t if sequence_parallel else 1)
    else:
        replicated = tokens * h * (4 * value_bytes + 2 * mask)
        layer = tokens * h * 12 * value_bytes / t + (replicated / t if sequence_parallel else replicated)
        if recompute == "none":
            layer += model["heads"] * s * tokens * (2 * value_bytes + mask if dropout else value_bytes) / t
    total = 0
    for _ in range(min(microbatches, pp)):
        for _ in range(layers):
            total += layer
    return {"params": params, "weights": 2 * params, "gradients": 2 * params,
            "optimizer": 12 * params / dp if zero1 else 12 * params, "activations": total}
'''

STUB = '''import math


def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                     sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
    L, h, a, V, s = model["layers"], model["hidden"], model["heads"], model["vocab"], model["seq"]
    # YOUR CODE HERE
    raise NotImplementedError
    return {"params": params, "weights": weights, "gradients": gradients, "optimizer": optimizer,
            "activations": activations}
'''


def answers(source: str, cases) -> list[dict]:
    """What the rank's harness would send back (the answer run here, in the test)."""
    return harness(source, "my_device_memory", cases)


def first_wrong(source: str, cases=CASES) -> str | None:
    return next((f"{describe(case)}: {reason}" for case, got in zip(cases, answers(source, cases))
                 if (reason := wrong(got, case, expected(case)))), None)


# ----------------------------------------------------------------------------------------------
# Without processes.


def test_registered_with_what_it_forbids():
    assert REGISTRY["device-memory"] is EXERCISE
    assert EXERCISE.policy.name == "my_device_memory" and "memory model" in EXERCISE.forbids


def test_both_correct_formulas_equal_the_memory_model_and_the_real_tensors():
    for source in (SOLUTION, INTEGERS):
        assert first_wrong(source) is None
        params, block = _real_counts()
        for case, got, count in zip(REAL_PARAMS, answers(source, REAL_PARAMS), params):
            assert got["values"]["params"] == count
        for case, got, (measured, stats) in zip(REAL_BLOCK, answers(source, REAL_BLOCK), block):
            assert math.isclose(got["values"]["activations"], measured - stats, rel_tol=1e-12)


def test_the_real_counts_are_counted_from_the_course_gpt():
    params, block = _real_counts()
    assert params == [28736, 16032]  # the first stage of pp 2 and 4 (memory_check.param_check)
    assert block == [(443904, 1536), (396288, 3072), (24576, 0)]  # recompute none, selective, full
    assert [expected(case)["params"] for case in REAL_PARAMS] == params
    assert [expected(case)["activations"] for case in REAL_BLOCK] == [m - s for m, s in block]


def test_the_cases_cover_the_plans_knobs():
    assert {case["recompute"] for case in CASES} == {"none", "selective", "full"}
    assert {case["sequence_parallel"] for case in CASES if case["tp"] > 1} == {True, False}
    assert any(case["zero1"] for case in CASES) and any(case["microbatches"] < case["pp"] for case in CASES)
    assert any(case["value_bytes"] == 4 and not case["dropout"] for case in CASES)
    assert any(case["model"]["vocab"] % case["tp"] for case in CASES)  # the padded vocabulary
    assert all(case["pp"] >= 2 for case in CASES + REAL_PARAMS + REAL_BLOCK)


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["device memory: NOT YET: my_device_memory still raises NotImplementedError; write your "
                             "code where it says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source,reason", [
    ("from parallel_lab.planning import memory_model\n\n\ndef my_device_memory(model, **plan):\n"
     "    return memory_model.device_memory(model, **plan)[0]\n",
     "imports parallel_lab.planning: the library's own implementation is not an answer"),
    ("from parallel_lab.planning.memory_model import activation_bytes_per_layer\n" + SOLUTION,
     "imports parallel_lab.planning.memory_model"),
    ("import parallel_lab\n" + SOLUTION, "imports parallel_lab"),
    ("import numpy\n" + SOLUTION, "imports numpy: this exercise may import only math"),
    (SOLUTION.replace("math.ceil(V / t)", "getattr(math, 'ceil')(V / t)"), "uses getattr"),
    ("def memory(model):\n    return {}\n", "defines no my_device_memory"),
])
def test_the_library_and_other_shortcuts_are_refused_from_the_source(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("device memory: FAILED: your answer ")
    assert reason in verdict.lines[0]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("change,reason", [
    (("b, t, v = micro_batch, tp, value_bytes", "b, t, v = micro_batch, tp, 2"),
     "activations off by 1/2: got 12,079,595,520 bytes, expected 24,159,191,040: did you count 2 bytes per value? "
     "this plan stores 4-byte values (value_bytes=4)"),
    (("min(microbatches, pp)", "microbatches"),
     "activations off by 8x: got 275,414,777,856 bytes, expected 34,426,847,232: counted all m = 64 micro-batches "
     "(GPipe's stash); 1F1B's first stage holds min(m, pp) = 8"),
    (("min(microbatches, pp)", "pp"), "did you count 4 bytes per value? this plan stores 2-byte values "
     "(value_bytes=2); or counted pp = 16 micro-batches, but only m = 8 exist: min(m, pp) = 8"),  # both 2x
    ((" + math.ceil(V / t) * h + s * h", ""), "params off by -3.6%: got 2,718,922,752, expected 2,821,294,080: left "
     "out the embeddings: the first stage also holds the token embedding, ⌈V/t⌉·h = 77,205,504, and the position "
     "embedding, s·h = 25,165,824"),
    (("math.ceil(V / t)", "(V // t)"), "split the vocabulary as V // t; Megatron pads it"),
    (("(dp if zero1 else 1)", "1"), "optimizer off by 8x: got 33,855,528,960 bytes, expected 4,231,941,120: ZeRO-1 "
     "shards Adam's 12 bytes per parameter over the dp = 8 replicas: 12·P/dp"),
    (("(dp if zero1 else 1)", "dp"), "without ZeRO-1 every data-parallel replica holds all of Adam's state"),
    (("weights = gradients = 2 * params", "weights = gradients = 4 * params"), "weights off by 2x"),
    (("per_layer = sbh * (whole + split) / t if sequence_parallel else", "per_layer = sbh * (whole + split) / t if "
      "True else"), "split every tensor by t: without sequence parallelism"),
    (("L // pp * ((12", "L * ((12"), "counted all 96 blocks; the first of 8 stages holds L/pp = 12"),
    (("(12 * h * h + 7 * h) // t + 6 * h", "(12 * h * h + 13 * h) // t"), "split every block parameter by t"),
    (("if recompute == \"none\":", "if recompute != \"full\":"), "that is the count for recompute='none'; this plan "
     "has recompute='selective': drop only the attention scores (recomputed in the backward)"),
])
def test_a_wrong_formula_fails_with_the_entry_the_factor_and_the_slip(change, reason):
    old, new = change
    assert old in SOLUTION
    failure = first_wrong(SOLUTION.replace(old, new))
    assert failure is not None and reason in failure, failure


def test_answers_of_the_wrong_shape_fail_with_a_reason():
    case = CASES[0]
    assert wrong({"type": "list"}, case, expected(case)) == \
        "my_device_memory returned a list, not a dict with params, weights, gradients, optimizer, activations"
    values = dict.fromkeys(FIELDS, 1.0)
    assert wrong({"values": {**values, "optimizer": None}}, case, expected(case)) == \
        "my_device_memory returned no 'optimizer' (the dict needs params, weights, gradients, optimizer, activations)"
    assert wrong({"values": {**values, "params": {"type": "str"}}}, case, expected(case)) == \
        "params is a str, not a number"
    assert wrong({"error": "KeyError: 'vocab'"}, case, expected(case)) == "my_device_memory raised KeyError: 'vocab'"


# ----------------------------------------------------------------------------------------------
# On a rank.

ranks = pytest.mark.ranks

PASSED = [
    "device memory: PASSED: 8/8 plans equal the memory model (parameters, weights, gradients, Adam state and "
    "activations of the first stage under 1F1B)",
    "device memory on the course GPT: PASSED: the first stage's parameters equal its real modules (pp 2, 4); one "
    "block's activations equal the bytes autograd saves, less the per-token statistics (recompute none, selective, "
    "full)",
]


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_correct_formula_pass():
    for source in (SOLUTION, INTEGERS):
        verdict = EXERCISE.check(source)
        assert verdict.passed, verdict
        assert verdict.lines == PASSED


@ranks
@pytest.mark.timeout(300)
def test_two_byte_values_fail_against_the_model_and_the_real_tensors_deterministically():
    two_bytes = SOLUTION.replace("b, t, v = micro_batch, tp, value_bytes", "b, t, v = micro_batch, tp, 2")
    verdict = EXERCISE.check(two_bytes)
    assert not verdict.passed
    assert verdict.lines == [
        "device memory: FAILED (7/8 plans equal the memory model)",
        "  GPT-3 1.3B, TP 2 + SP × PP 4 × DP 2, 3 micro-batches of 4, recompute 'none', 4-byte values, no dropout: "
        "activations off by 1/2: got 12,079,595,520 bytes, expected 24,159,191,040: did you count 2 bytes per value? "
        "this plan stores 4-byte values (value_bytes=4)",
        "device memory on the course GPT: FAILED: one block of the course GPT (s 32, b 3, h 64, 4 heads, 4-byte "
        "values, no dropout), recompute 'none': autograd saves 443,904 bytes, 1,536 of them per-token statistics the "
        "paper neglects, so 442,368: activations off by 1/2: got 221,184 bytes, expected 442,368: did you count 2 "
        "bytes per value? this plan stores 4-byte values (value_bytes=4)"]
    assert EXERCISE.check(two_bytes).lines == verdict.lines
    raises = EXERCISE.check(SOLUTION.replace('model["vocab"]', 'model["vocabulary"]'))
    first, *where = raises.lines[1].splitlines()
    assert first == "  " + describe(CASES[0]) + ": my_device_memory raised KeyError: 'vocabulary'"
    assert where and where[0].startswith("  your answer, line 6, in my_device_memory: ")  # the line that raised


def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none", sequence_parallel=False,
                     zero1=False, value_bytes=2, dropout=True):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_device_memory(my_device_memory)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_device_memory"):
        check_device_memory(answers)
