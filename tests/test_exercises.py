"""Exercise checks run the student's cell code on real ranks and print deterministic verdicts."""

import pytest
import torch
import torch.distributed as dist

from parallel_lab import exercises
from parallel_lab.exercises import check

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def ring_correct(tensor):
    from parallel_lab.runtime.collectives import ring_all_reduce
    return ring_all_reduce(tensor)


def ring_forgets_to_gather(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.tensor_split(p))
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=(rank + 1) % p)
        dist.recv(buffer, src=(rank - 1) % p)
        request.wait()
        chunks[recv] += buffer
    return tensor


def ring_that_raises(tensor):
    return tensor + undefined_name  # noqa: F821


def ring_that_waits_forever(tensor):
    buffer = torch.empty_like(tensor)
    dist.recv(buffer, src=(dist.get_rank() - 1) % dist.get_world_size())
    return buffer


def test_correct_solution_passes_on_2_and_4_ranks(capsys):
    verdict = exercises.check_ring_all_reduce(ring_correct)
    assert verdict.passed
    assert capsys.readouterr().out == ("ring all-reduce on 2 ranks: PASSED (5/5 cases)\n"
                                       "ring all-reduce on 4 ranks: PASSED (5/5 cases)\n")


def test_wrong_solution_fails_with_the_first_wrong_case():
    verdict = exercises.check_ring_all_reduce(ring_forgets_to_gather, world_sizes=(2,))
    assert not verdict.passed
    # Rank 0 keeps only its own half-done chunk: for one element it never receives rank 1's value.
    assert verdict.lines == ["ring all-reduce on 2 ranks: FAILED: tensor of 1 element: rank 0: "
                             "got [0], expected [1]"]


def test_exception_in_student_code_names_rank_and_error():
    verdict = exercises.check_ring_all_reduce(ring_that_raises, world_sizes=(2,))
    assert not verdict.passed
    assert verdict.lines[0].startswith("ring all-reduce on 2 ranks: FAILED: rank 0 raised NameError: "
                                       "name 'undefined_name' is not defined")


def test_hanging_student_code_is_reported_not_frozen(monkeypatch):
    monkeypatch.setattr(check, "CHECK_TIMEOUT", 3.0)
    verdict = exercises.check_ring_all_reduce(ring_that_waits_forever, world_sizes=(2,))
    assert not verdict.passed
    assert "did not finish within 3 s" in verdict.lines[0]
    assert verdict.lines[1] == "    rank 0: recv(src=1, shape=(1,), dtype=float64)"


def test_a_lambda_or_non_function_is_refused_before_ranks_start():
    with pytest.raises(TypeError, match="expected the function you wrote"):
        exercises.check_ring_all_reduce(42)
