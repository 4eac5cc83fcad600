"""The optimizer step after a pipeline step with gradient clipping (parallel_lab.pipeline.post_validation):
synchronised by an all-reduce, or post-validated as in Qi et al. 2023 section 4 (steps at once, rolls
back when the full norm says clipping was needed); both equal one process running clipped SGD, on
real ranks, whichever ranks had to roll back."""

import pytest
import torch

from parallel_lab.pipeline.post_validation import MODES, clip_coefficient, run_clipped
from parallel_lab.pipeline.schedules import build

EXACT = 1e-15  # one SGD step in fp64; a rolled-back step is undone and redone in place


def test_the_clip_coefficient_is_torchs():
    for norm, max_norm in ((3.0, 1.0), (0.5, 1.0), (2.0, 2.0)):
        g = torch.full((4,), norm / 2, dtype=torch.float64)  # |g| = norm
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_([p], max_norm)
        assert torch.allclose(p.grad, g * clip_coefficient(norm ** 2, max_norm), rtol=0, atol=1e-15)


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name, virtual", [("zb-h1", 1), ("zb-v", 2)])
def test_both_steps_equal_one_process_and_only_early_steps_roll_back(name, virtual):
    schedule = build(name, 4, 8, virtual)
    probe = run_clipped(schedule, max_norms=(1e9,))
    norm = probe["norm"]
    result = run_clipped(schedule, max_norms=(1e9, 0.95 * norm, 1e-6 * norm))
    free, some, all_clipped = result["cases"]
    for case in result["cases"]:
        for mode in MODES:
            assert case[mode]["max_param_diff"] < EXACT, (case["max_norm"], mode, case[mode])
        assert case["synchronised"]["stepped_early"] == case["synchronised"]["rolled_back"] == []
    # no clipping: every rank steps at once and none rolls back
    assert not free["clipped"] and free["post-validated"]["stepped_early"] == [0, 1, 2, 3]
    assert free["post-validated"]["rolled_back"] == []
    # clipping the whole norm needs: the ranks whose partial sum was still under it stepped and roll back;
    # the last rank holds the full sum and waits
    assert some["clipped"] and some["post-validated"]["rolled_back"] == some["post-validated"]["stepped_early"]
    assert 0 in some["post-validated"]["rolled_back"] and 3 not in some["post-validated"]["stepped_early"]
    # a threshold every partial sum exceeds: nobody steps early, nothing to roll back
    assert all_clipped["post-validated"]["stepped_early"] == [] == all_clipped["post-validated"]["rolled_back"]


def test_bad_thresholds_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="max_norms must be > 0, got 0"):
        run_clipped("zb-h1", max_norms=(1.0, 0))
