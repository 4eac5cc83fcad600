"""Bucketed gradient all-reduce (parallel_lab.parallel3d.data_parallel) against the whole batch on one process."""

import pytest
import torch
from torch import nn

from parallel_lab import models
from parallel_lab.parallel3d import data_parallel
from parallel_lab.parallel3d.data_parallel import batch_slice, buckets
from parallel_lab.runtime import launcher


def _params(*sizes, dtype=torch.float32):
    return [nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes]


def test_buckets_go_in_reverse_order_and_respect_the_cap():
    params = _params(10, 20, 30, 40)  # float32: 40, 80, 120, 160 bytes
    assert buckets(params, 200) == [[3], [2, 1], [0]]  # 160 | 120 + 80 | 40
    assert buckets(params, 10**6) == [[3, 2, 1, 0]]
    assert buckets(params, 1) == [[3], [2], [1], [0]]  # a parameter larger than the cap gets its own


def test_buckets_split_on_dtype_and_skip_frozen():
    params = _params(4, 4) + _params(4, dtype=torch.float64)
    params[0].requires_grad_(False)
    assert buckets(params, 10**6) == [[2], [1]]


def test_buckets_of_the_tiny_gpt_cover_every_parameter_once():
    model = models.GPT(data_parallel.SMALL_GPT)
    plan = buckets(model.parameters(), 4096)
    flat = [i for bucket in plan for i in bucket]
    assert sorted(flat) == list(range(len(list(model.parameters()))))
    assert flat == sorted(flat, reverse=True)
    sizes = [sum(list(model.parameters())[i].numel() * 4 for i in bucket) for bucket in plan]
    assert all(size <= 4096 or len(bucket) == 1 for size, bucket in zip(sizes, plan))


def test_batch_slice():
    assert [batch_slice(8, r, 4) for r in range(4)] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    with pytest.raises(ValueError, match="batch 6 % dp 4 != 0"):
        batch_slice(6, 0, 4)


def test_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match="bucket_bytes must be a positive integer, got bucket_bytes 0"):
        buckets(_params(1), 0)


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dp, tp, bucket_bytes", [(2, 1, 4096), (4, 1, 4096), (2, 2, 4096), (2, 1, 10**9), (4, 1, 1)])
def test_matches_the_whole_batch_on_one_process(dp, tp, bucket_bytes):
    results = launcher.run(data_parallel.check_against_reference, dp * tp,
                           kwargs=dict(dp=dp, tp=tp, batch=4, bucket_bytes=bucket_bytes), timeout=90)
    n_params = len(list(models.GPT(data_parallel.SMALL_GPT).parameters()))
    for result in results:
        assert len(result["checked"]) == n_params  # every gradient compared
        assert result["max_grad_diff"] < 1e-12  # fp64: the same numbers up to summation order
        assert result["buckets"] == result["expected_buckets"] == result["all_reduce_calls"]
    expected = {10**9: 1, 1: n_params}.get(bucket_bytes)  # one bucket for all / one per parameter
    assert results[0]["buckets"] == expected if expected else 1 < results[0]["buckets"] < n_params
