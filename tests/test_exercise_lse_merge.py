"""Lesson 14's exercise, the log-sum-exp merge (parallel_lab.exercises.lse_merge): the stub is NOT YET
without a process; the solution passes, directly and inside ring attention on 4 real ranks; a plain
average and a naive exp (overflow) fail with a reason; the library's merge and torch's shortcuts are
refused from the source; the expected values are the attention over both blocks, from the scores."""

import pytest
import torch

from parallel_lab.context.blockwise import merge
from parallel_lab.exercises import REGISTRY, check_lse_merge
from parallel_lab.exercises.check import compile_answer
from parallel_lab.exercises.lse_merge import (
    DIRECT,
    EXERCISE,
    SHORTCUTS,
    _pair,
    direct_expected,
    direct_inputs,
    judge_direct,
)

SOLUTION = '''def my_merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / total.unsqueeze(-1)
    return out, lse
'''

STUB = '''def my_merge(out_a, lse_a, out_b, lse_b):
    # YOUR CODE HERE
    raise NotImplementedError
'''

AVERAGE = '''def my_merge(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)
'''

NAIVE = '''def my_merge(out_a, lse_a, out_b, lse_b):
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
'''

# Stable, but nan where neither block saw a key (-inf - -inf): the library's own formula.
NO_IDENTITY = '''def my_merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
'''


def local(source: str) -> list[dict]:
    """What rank 0's harness would send back for the direct cases (the answer run here)."""
    fn = compile_answer(source, "my_merge")
    return [_pair(fn(*direct_inputs(case))) for case, _ in DIRECT]


def test_registered_with_what_it_forbids():
    assert REGISTRY["lse-merge"] is EXERCISE
    assert "softmax" in SHORTCUTS and "logaddexp" in SHORTCUTS


def test_the_stub_is_not_yet_without_a_process():
    verdict = EXERCISE.check(STUB)
    assert verdict.not_yet and not verdict.passed
    assert "not yet" in str(verdict).lower()


def test_the_expected_values_are_the_attention_over_both_blocks():
    for case, _ in DIRECT:
        out, lse = direct_expected(case)
        lib_out, lib_lse = merge(*direct_inputs(case))
        finite = torch.isfinite(lse)
        torch.testing.assert_close(lib_lse, lse, rtol=1e-12, atol=1e-12)
        rows = finite.unsqueeze(-1).expand_as(out)
        torch.testing.assert_close(lib_out[rows], out[rows], rtol=1e-12, atol=1e-12)
    out, lse = direct_expected("empty")
    assert torch.isneginf(lse[..., :3]).all() and (out[..., :3, :] == 0).all()
    assert torch.isfinite(direct_expected("large")[1]).all()


@pytest.mark.ranks
def test_the_solution_passes_directly_and_on_ranks():
    verdict = EXERCISE.check(SOLUTION)
    assert verdict.passed, str(verdict)
    assert "direct: PASSED (5/5" in str(verdict) and "on 4 ranks: PASSED (3/3" in str(verdict)
    assert str(EXERCISE.check(SOLUTION)) == str(verdict)  # deterministic text


@pytest.mark.ranks
def test_a_plain_average_fails_with_a_reason():
    verdict = EXERCISE.check(AVERAGE)
    assert not verdict.passed
    assert "ordinary scores: lse differs" in verdict.reason
    assert "ring attention on 4 ranks: FAILED (" in str(verdict) and "cases): causal, zig-zag" in str(verdict)


@pytest.mark.ranks
def test_a_naive_exp_overflows_and_fails():
    verdict = EXERCISE.check(NAIVE)
    assert not verdict.passed
    assert "scores near 1000" in verdict.reason and "overflows" in verdict.reason
    assert "sharp scores" in str(verdict)  # the ring with sharp attention overflows too


def test_a_merge_without_the_identity_fails_on_empty_rows():
    why = judge_direct(local(NO_IDENTITY))
    assert why.startswith("no key in either block") and "nan" in why
    assert judge_direct(local(SOLUTION)) is None


def test_the_library_and_the_shortcuts_are_refused():
    lib = "from parallel_lab.context.blockwise import merge\n\ndef my_merge(out_a, lse_a, out_b, lse_b):\n" \
          "    return merge(out_a, lse_a, out_b, lse_b)\n"
    assert "library's own implementation" in EXERCISE.check(lib).reason
    for shortcut in ("torch.logaddexp(lse_a, lse_b)", "torch.stack((lse_a, lse_b)).logsumexp(0)",
                     "torch.softmax(torch.stack((lse_a, lse_b)), 0)[0]"):
        source = f"def my_merge(out_a, lse_a, out_b, lse_b):\n    lse = {shortcut}\n    return out_a, lse\n"
        verdict = EXERCISE.check(source)
        assert not verdict.passed and "does this exercise's work" in verdict.reason


def test_the_notebook_check_needs_the_function():
    try:
        check_lse_merge(42)
    except TypeError as err:
        assert "my_merge" in str(err)
    else:
        raise AssertionError("expected a TypeError")
