"""Exercise checks: the answer's source is reviewed here, run only on fresh ranks that return raw
results, and judged here. Shortcuts fail with a reason; patches on a rank change nothing; a correct
answer written another way passes; every verdict is deterministic text."""

import pickle

import pytest
import torch

from parallel_lab import exercises
from parallel_lab.exercises import check, policy
from parallel_lab.exercises.ring_all_reduce import EXERCISE as RING
from parallel_lab.runtime import demos, launcher, rank_process

RING_SOLUTION = '''import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(p))
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(2 * (p - 1)):
        send = (rank - step) % p if step < p - 1 else (rank + 1 - (step - (p - 1))) % p
        recv = (send - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=right)
        dist.recv(buffer, src=left)
        request.wait()
        if step < p - 1:
            chunks[recv] += buffer
        else:
            chunks[recv].copy_(buffer)
    return tensor
'''

# The same ring written differently: blocking send/recv ordered by parity (no isend), a helper
# function in the cell, and the result returned as a new tensor.
RING_BY_PARITY = '''import torch.distributed as d


def _exchange(out, into, rank, p):
    if rank % 2 == 0:
        d.send(out, (rank + 1) % p)
        d.recv(into, (rank - 1) % p)
    else:
        d.recv(into, (rank - 1) % p)
        d.send(out, (rank + 1) % p)


def my_ring_all_reduce(tensor):
    rank, p = d.get_rank(), d.get_world_size()
    parts = list(tensor.tensor_split(p))
    for step in range(p - 1):
        incoming = parts[(rank - step - 1) % p].clone()
        _exchange(parts[(rank - step) % p].clone(), incoming, rank, p)
        parts[(rank - step - 1) % p] += incoming
    for step in range(p - 1):
        incoming = parts[(rank - step) % p].clone()
        _exchange(parts[(rank + 1 - step) % p].clone(), incoming, rank, p)
        parts[(rank - step) % p].copy_(incoming)
    return tensor.clone()
'''

STUB = '''import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    # YOUR CODE HERE
    raise NotImplementedError
    return tensor
'''


def answer(body: str) -> str:
    return f"def my_ring_all_reduce(tensor):\n{body}\n"


# ----------------------------------------------------------------------------------------------
# Review: from the source alone, before any process starts.


@pytest.mark.parametrize("source,reason", [
    (answer("    dist.all_reduce(tensor)\n    return tensor"),
     "uses dist.all_reduce; this exercise builds it from isend/recv"),
    (answer("    torch.distributed.all_reduce(tensor)\n    return tensor"), "uses dist.all_reduce"),
    ("from torch.distributed import all_reduce\n" + answer("    all_reduce(tensor)\n    return tensor"),
     "uses dist.all_reduce"),
    ("from parallel_lab.runtime.collectives import ring_all_reduce\n" + answer("    return ring_all_reduce(tensor)"),
     "imports parallel_lab.runtime.collectives: the library's own implementation is not an answer"),
    ("import parallel_lab\n" + answer("    return tensor"), "imports parallel_lab"),
    ("import os\n" + answer("    return tensor"), "imports os: this exercise may import only torch"),
    (answer("    f = getattr(dist, 'all_' + 'reduce')\n    f(tensor)\n    return tensor"), "uses getattr"),
    (answer("    dist.__dict__['all_reduce'](tensor)\n    return tensor"), "uses __dict__"),
    ("import torch\ntorch.equal = lambda a, b: True\n" + answer("    return tensor"), "changes torch.equal"),
    (answer("    dist.isend = dist.send\n    return tensor"), "changes dist.isend"),
    ("def ring(tensor):\n    return tensor\n", "defines no my_ring_all_reduce"),
    (answer("    return tensor +"), "does not compile"),
])
def test_shortcuts_are_refused_from_the_source_with_a_reason(source, reason):
    verdict = RING.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("ring all-reduce: FAILED: your answer ")
    assert reason in verdict.lines[0]


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = RING.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["ring all-reduce: NOT YET: my_ring_all_reduce still raises NotImplementedError; "
                             "write your code where it says # YOUR CODE HERE (and remove that raise), then run "
                             "this cell again"]
    assert launcher.pool_pids() == before


def test_a_rank_cannot_send_back_anything_but_plain_data():
    assert rank_process.plain_loads(pickle.dumps({"a": [1, 2.5, "x", None, (3,)]})) == {"a": [1, 2.5, "x", None, (3,)]}
    with pytest.raises(pickle.UnpicklingError, match="a rank sent torch._utils._rebuild_tensor_v2"):
        rank_process.plain_loads(pickle.dumps(torch.ones(2)))

    class Evil:
        def __reduce__(self):
            return (print, ("this would run in the checking process",))
    with pytest.raises(pickle.UnpicklingError, match="builtins.print, which is not plain data"):
        rank_process.plain_loads(pickle.dumps(Evil()))


def test_policy_names_what_it_allows():
    p = policy.Policy("f", dist=("isend",), builds="it from isend")
    assert policy.review("def f():\n    dist.recv(x)\n", p) == \
        "uses dist.recv; this exercise builds it from isend (allowed: dist.isend)"
    assert policy.review("import math\ndef f():\n    return math.pi\n", p) is None
    assert check.is_stub("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError\n", "f")
    assert not check.is_stub("def f():\n    raise ValueError('no')\n", "f")


# ----------------------------------------------------------------------------------------------
# On real ranks.

ranks = pytest.mark.ranks


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_correct_ring_pass_on_2_and_4_ranks():
    for source in (RING_SOLUTION, RING_BY_PARITY):
        verdict = RING.check(source)
        assert verdict.passed, verdict
        assert verdict.lines == [
            "ring all-reduce on 2 ranks: PASSED (5/5 cases; send/recv only, 2(p−1)/p of the tensor per rank)",
            "ring all-reduce on 4 ranks: PASSED (5/5 cases; send/recv only, 2(p−1)/p of the tensor per rank)"]


@ranks
@pytest.mark.timeout(300)
def test_the_library_ring_passes_the_judge_students_rings_face():
    # collectives.ring_all_reduce (lesson 01's reference, timed by calibration's "ring") judged as an
    # answer: the policy would refuse the import, the judge checks values, send/recv only and bytes.
    passed, lines = RING.judge("from parallel_lab.runtime.collectives import ring_all_reduce as my_ring_all_reduce")
    assert passed, lines


@ranks
@pytest.mark.timeout(300)
def test_a_wrong_ring_fails_with_the_first_wrong_case_and_expected_against_actual():
    forgets_to_gather = answer('''    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.tensor_split(p))
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=(rank + 1) % p)
        dist.recv(buffer, src=(rank - 1) % p)
        request.wait()
        chunks[recv] += buffer
    return tensor''')
    verdict = RING.check(forgets_to_gather)
    assert not verdict.passed
    assert verdict.lines[0].startswith("ring all-reduce on 2 ranks: FAILED: tensor of 1 element: rank 0: got [")
    assert ", expected [" in verdict.lines[0]
    assert verdict == RING.check(forgets_to_gather)  # deterministic


@ranks
@pytest.mark.timeout(300)
def test_a_ring_that_sends_the_whole_tensor_around_fails_on_the_bytes():
    """Right sums, wrong algorithm: p-1 steps that each pass the whole running sum around."""
    naive = answer('''    rank, p = dist.get_rank(), dist.get_world_size()
    total, passing = tensor.clone(), tensor.clone()
    for _ in range(p - 1):
        incoming = torch.empty_like(passing)
        request = dist.isend(passing, dst=(rank + 1) % p)
        dist.recv(incoming, src=(rank - 1) % p)
        request.wait()
        total += incoming
        passing = incoming
    tensor.copy_(total)
    return tensor''')
    verdict = RING.check(naive)
    assert not verdict.passed and verdict.lines[0].startswith("ring all-reduce on 2 ranks: PASSED")  # p = 2: alike
    assert verdict.lines[1] == ("ring all-reduce on 4 ranks: FAILED: tensor of 1 element: the ranks sent 96 bytes "
                                "in all; a ring sends 2(p−1)·n = 48 bytes (2(p−1)/p of the tensor per rank): "
                                "reduce-scatter then all-gather, one chunk per step")


@ranks
@pytest.mark.timeout(300)
def test_patching_torch_on_a_rank_does_not_change_the_comparison():
    """The review misses an alias; the rank's torch.equal is patched; the comparison happens in the
    checking process all the same."""
    patched = "t = torch\nt.equal = lambda a, b: True\n" + answer("    return tensor")
    verdict = RING.check(patched)
    assert not verdict.passed and "FAILED: tensor of 1 element: rank 0: got [" in verdict.lines[0]


@ranks
@pytest.mark.timeout(300)
def test_errors_and_hangs_on_a_rank_become_failed_lines(monkeypatch):
    raises = RING.check(answer("    return tensor + undefined_name"))
    assert raises.lines[0] == ("ring all-reduce on 2 ranks: FAILED: rank 0 raised NameError: "
                               "name 'undefined_name' is not defined\n"
                               "  your answer, line 2, in my_ring_all_reduce: return tensor + undefined_name")
    monkeypatch.setenv("PARALLEL_LAB_CHECK_TIMEOUT", "3")
    waits = RING.check(answer("    buffer = torch.empty_like(tensor)\n"
                              "    dist.recv(buffer, src=(dist.get_rank() - 1) % dist.get_world_size())\n"
                              "    return buffer"))
    assert not waits.passed
    assert waits.lines[0].startswith("ring all-reduce on 2 ranks: FAILED: did not finish within 3 s")
    assert "rank 0: recv(src=1, shape=(1,), dtype=float64)" in waits.lines[0]
    assert launcher.run(demos.rank_id, 2) == [0, 1]  # the next call works


# ----------------------------------------------------------------------------------------------
# The notebook's entry point: the same check, on the cell that defines the function.


def my_ring_all_reduce(tensor):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = exercises.check_ring_all_reduce(my_ring_all_reduce)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_ring_all_reduce"):
        exercises.check_ring_all_reduce(demos.rank_id)
    with pytest.raises(TypeError, match="pass the"):
        exercises.check_ring_all_reduce(42)


def test_every_exercise_is_registered_with_what_it_forbids():
    assert set(exercises.REGISTRY) == {"ring-all-reduce", "row-parallel-forward", "g-operator", "one-f-one-b",
                                       "zb-h1-order", "balanced-cut", "mesh-groups", "device-memory",
                                       "lse-merge", "zero2-step", "moe-dispatch", "schedule-design"}
    for exercise in exercises.REGISTRY.values():
        assert exercise.forbids and exercise.policy.name
