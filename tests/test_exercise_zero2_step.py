"""Lesson 12's exercise, ZeRO-2's step (parallel_lab.exercises.zero2_step): the solution passes on 2
and 4 real ranks; the stub is NOT YET without a process; shortcuts fail with a reason: an all-reduce
of the whole gradient then slicing (not sharded, N x the shard), Adam's state for the whole
parameter, a missing all-gather, a missing average; torch.optim and the library are refused from the
source; every verdict is deterministic text."""

import pytest

from parallel_lab.exercises import REGISTRY, check_zero2_step
from parallel_lab.exercises.zero2_step import EXERCISE, reference

ADAM = '''
    if not state:
        state["step"] = 0
        state["m"] = torch.zeros_like(g)
        state["v"] = torch.zeros_like(g)
    state["step"] += 1
    t = state["step"]
    state["m"].mul_(0.9).add_(g, alpha=0.1)
    state["v"].mul_(0.999).addcmul_(g, g, value=0.001)
    m_hat = state["m"] / (1 - 0.9 ** t)
    v_hat = state["v"] / (1 - 0.999 ** t)
    mine.sub_(lr * m_hat / (v_hat.sqrt() + 1e-8))
'''

SOLUTION = '''def my_zero2_step(param, grad, state, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    g = torch.empty(shard, dtype=grad.dtype)
    dist.reduce_scatter_single(g, grad)
    g /= world
    mine = param[rank * shard:(rank + 1) * shard]
''' + ADAM + '''
    dist.all_gather_single(param, mine.clone())
'''

# The shortcut the exercise is about: every rank gets the whole averaged gradient, then slices it.
ALL_REDUCE_THEN_SLICE = '''def my_zero2_step(param, grad, state, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    full = grad.clone()
    dist.all_reduce(full)
    g = full[rank * shard:(rank + 1) * shard] / world
    mine = param[rank * shard:(rank + 1) * shard]
''' + ADAM + '''
    dist.all_gather_single(param, mine.clone())
'''

# Reduce-scatter, then all-gather the gradient back and run Adam on everything: right numbers,
# the same traffic, but every rank keeps Adam's moments for the whole parameter.
FULL_OPTIMIZER = '''def my_zero2_step(param, grad, state, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    part = torch.empty(shard, dtype=grad.dtype)
    dist.reduce_scatter_single(part, grad)
    g = torch.empty_like(grad)
    dist.all_gather_single(g, part / world)
    mine = param
''' + ADAM

NO_ALL_GATHER = SOLUTION.replace("    dist.all_gather_single(param, mine.clone())\n", "")
NO_AVERAGE = SOLUTION.replace("    g /= world\n", "")

USES_OPTIM = '''def my_zero2_step(param, grad, state, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    g = torch.empty(shard, dtype=grad.dtype)
    dist.reduce_scatter_single(g, grad)
    mine = param[rank * shard:(rank + 1) * shard].clone().requires_grad_(True)
    if not state:
        state["opt"] = torch.optim.Adam([mine], lr=lr)
    mine.grad = g / world
    state["opt"].step()
    dist.all_gather_single(param, mine.detach())
'''

USES_LIBRARY = '''from parallel_lab.zero.adam import adam_step

def my_zero2_step(param, grad, state, lr):
    pass
'''

STUB = '''def my_zero2_step(param, grad, state, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    # YOUR CODE HERE
    raise NotImplementedError
'''


def test_registered():
    assert REGISTRY["zero2-step"] is EXERCISE
    assert "torch.optim" in EXERCISE.forbids and "parallel_lab" in EXERCISE.forbids


def test_stub_is_not_yet_without_a_process():
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet and "NOT YET" in str(verdict)


@pytest.mark.ranks
def test_solution_passes_on_2_and_4_ranks():
    verdict = EXERCISE.check(SOLUTION)
    assert verdict.passed, str(verdict)
    assert [line.split(":")[0] for line in verdict.lines] == ["ZeRO-2 step on 2 ranks", "ZeRO-2 step on 4 ranks"]
    assert str(EXERCISE.check(SOLUTION)) == str(verdict)  # deterministic


@pytest.mark.ranks
def test_all_reduce_then_slicing_fails_as_not_sharded():
    verdict = EXERCISE.check(ALL_REDUCE_THEN_SLICE)
    assert not verdict.passed
    assert "all-reduced" in verdict.reason and "not sharded" in verdict.reason and "2x the" in verdict.reason


@pytest.mark.ranks
def test_whole_optimizer_state_fails():
    verdict = EXERCISE.check(FULL_OPTIMIZER)
    assert not verdict.passed
    assert "values of optimizer state" in verdict.reason and "not sharded" in verdict.reason


@pytest.mark.parametrize("source, words", [(NO_ALL_GATHER, "all-gather the updated shards"),
                                           (NO_AVERAGE, "one process has")])
@pytest.mark.ranks
def test_wrong_numbers_fail_naming_the_shard(source, words):
    verdict = EXERCISE.check(source)
    assert not verdict.passed and words in verdict.reason, str(verdict)


@pytest.mark.parametrize("source, words", [(USES_OPTIM, "torch.optim"), (USES_LIBRARY, "parallel_lab")])
def test_forbidden_sources_are_refused_before_any_rank(source, words):
    verdict = EXERCISE.check(source)
    assert not verdict.passed and words in verdict.reason


def test_reference_is_adam_on_the_mean_gradient():
    # one rank: the mean is the gradient itself; two steps differ from one (Adam moves every value)
    assert not reference(8, 1, 2).equal(reference(8, 2, 2))


def test_check_object_needs_the_named_function():
    with pytest.raises(TypeError):
        check_zero2_step(print)
