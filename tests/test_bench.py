"""The benchmark tables' limit columns: what a row says about the machine's limit, never how fast.

Nothing here times anything (the machine is shared): the rank test runs the tensor-parallel suite
once on tiny shapes and checks the columns and how they are computed.
"""

import os

import pytest

from parallel_lab.bench import measure, suites
from parallel_lab.bench import tensor as bench_tensor
from parallel_lab.runtime import launcher


def test_limit_is_the_work_over_the_cores_the_ranks_get():
    cores = len(os.sched_getaffinity(0))
    assert measure.cores(1) == 1
    assert measure.cores(64) == cores  # never more cores than this process may use
    cols = measure.limit_columns(0.3, 0.4, 2)
    assert cols["cores"] == min(2, cores)
    assert cols["limit_s"] == pytest.approx(0.4 / cols["cores"])
    assert cols["limit_ratio"] == pytest.approx(0.3 / cols["limit_s"])


@pytest.mark.parametrize("sides", [2, 3, 4])
def test_rotation_puts_every_side_in_every_place_and_none_after_itself(sides):
    orders = [measure.rotation(sides, i) for i in range(2 * sides)]
    assert all(sorted(order) == list(range(sides)) for order in orders)  # each side once an iteration
    for place in range(sides):  # each place taken by every side, once per `sides` iterations
        assert sorted(order[place] for order in orders[:sides]) == list(range(sides))
    sequence = [k for order in orders for k in order]
    after_itself = sum(a == b for a, b in zip(sequence, sequence[1:]))
    if sides >= 3:
        assert after_itself == 0
    else:  # two sides: ABBA, each side after itself equally often
        repeats = [a for a, b in zip(sequence, sequence[1:]) if a == b]
        assert repeats.count(0) - repeats.count(1) in (-1, 0, 1) and repeats


def test_table_has_limit_columns_and_dashes_where_a_row_has_none():
    rows = [{"suite": "pipeline", "name": "x", "ours_s": 0.03, "peer": "p", "peer_s": 0.04, "ratio": 0.75,
             **measure.limit_columns(0.03, 0.02, 1)},
            {"suite": "simulator", "name": "y", "ours_s": 0.01, "peer": "-", "peer_s": None, "ratio": None}]
    header, _, piped, simulated = suites.format_table(rows).splitlines()
    assert header.endswith("| ratio | limit | ours / limit |")
    assert piped.endswith("| 0.75 | 20.00 ms | 1.50 |")
    assert simulated.endswith("| - | - | - |")


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_tensor_rows_carry_the_limit():
    rows = launcher.run(bench_tensor.bench_rank, 2, kwargs=dict(repeats=1, warmup=1, mlp_shapes=((4, 16),),
                                                                 block_shape=(2, 4, 16, 2)), timeout=120)[0]
    assert [r["name"] for r in rows] == ["mlp h16 b4 tp2", "block h16 b2 s4 tp2"]
    for r in rows:
        assert {"name", "ours_s", "peer", "peer_s", "ratio", "compute_s", "cores", "limit_s", "limit_ratio"} <= set(r)
        assert r["ratio"] == pytest.approx(r["ours_s"] / r["peer_s"])
        assert r["compute_s"] > 0 and 1 <= r["cores"] <= 2
        assert r["limit_s"] == pytest.approx(r["compute_s"] / r["cores"])
        assert r["limit_ratio"] == pytest.approx(r["ours_s"] / r["limit_s"])
    mlp, block = rows
    assert mlp["kernels_s"] > 0 and mlp["kernels_ratio"] == pytest.approx(mlp["kernels_s"] / mlp["peer_s"])
    assert "kernels_s" not in block  # the floor is the MLP's arithmetic only


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_the_kernels_floor_computes_what_our_layers_compute():
    # bench tensor's kernels_ratio is a floor only if its arithmetic is ours: outputs and every
    # gradient, once its partial sums are all-reduced, equal our layers' forward and backward.
    assert max(launcher.run(bench_tensor.kernels_match, 2, timeout=120)) < 1e-12


# ----------------------------------------------------------------------------------------------
# The worker the pipeline benchmark's MLP runs on: the same numbers and bytes as autograd's.


def _workers(stage_index, spec, split=False, recompute=False):
    import copy

    from parallel_lab.pipeline.chain import ChainWorker, make_worker
    from parallel_lab.pipeline.stages import cut
    from parallel_lab.pipeline.worker import StageWorker

    stage = cut(spec, 4, keep={stage_index})[stage_index]
    twin = stage._replace(module=copy.deepcopy(stage.module))
    first, last = stage_index == 0, stage_index == 3
    plain = StageWorker(stage, spec.loss, 3, first, last, recompute, split)
    fast = make_worker(twin, spec.loss, 3, first, last, recompute, split)
    assert isinstance(fast, ChainWorker) and not isinstance(plain, ChainWorker)
    return plain, fast


@pytest.mark.parametrize("stage_index", (0, 1, 3))
@pytest.mark.parametrize("variant", ("fused", "split", "recompute", "split-recompute"))
def test_chain_worker_computes_and_counts_what_autograd_does(stage_index, variant):
    import torch

    from parallel_lab.pipeline.stages import ModelSpec

    spec = ModelSpec("mlp", hidden=8, layers=8, batch=12)
    x, target = spec.data()
    grad = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    first, last = stage_index == 0, stage_index == 3
    split, recompute = "split" in variant, "recompute" in variant
    runs = []
    for w in _workers(stage_index, spec, split=split, recompute=recompute):
        w.start_step(counting=True)
        out, counted = [], []
        for j in range(3):
            rows = slice(4 * j, 4 * j + 4)
            out.append(w.act("F", j, x[rows] if first else x[rows].clone(), target[rows] if last else None)
                       .detach().clone())
            counted.append(w.memory())
        for j in range(3):
            dx = w.act("I" if split else "B", j, None if last else grad)
            counted.append(w.memory())
            if split:
                w.act("W", j)
                counted.append(w.memory())
            out.append(None if dx is None else dx.clone())
        out += [p.grad.clone() for p in w.params]
        runs.append((out, counted + [w.w_bytes]))
    (plain, plain_bytes), (fast, fast_bytes) = runs
    assert plain_bytes[0][2] > 0 and (not split or plain_bytes[-1][1] > 0)  # something was counted
    assert fast_bytes == plain_bytes  # the same tensors kept: the memory figures do not change
    for a, b in zip(plain, fast):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_chain_worker_refuses_a_stage_that_is_not_a_linear_gelu_chain():
    from parallel_lab.pipeline.chain import ChainWorker, make_worker
    from parallel_lab.pipeline.stages import ModelSpec, cut
    from parallel_lab.pipeline.worker import StageWorker

    gpt = cut(ModelSpec("gpt", hidden=16, layers=2, heads=2), 2)[0]
    with pytest.raises(ValueError, match="stage 0 is not one"):
        ChainWorker(gpt, None, 2, True, False)
    assert type(make_worker(gpt, None, 2, True, False)) is StageWorker
    mlp = cut(ModelSpec("mlp", hidden=8, layers=2), 2)[0]
    with pytest.raises(ValueError, match=r"fuse False"):
        ChainWorker(mlp, None, 2, True, False, fuse=False)
    assert type(make_worker(mlp, None, 2, True, False, fuse=False)) is StageWorker


def test_all_reduce_timing_names_its_algorithms():
    from parallel_lab.planning.calibration import time_all_reduce

    with pytest.raises(ValueError,
                       match="unknown all-reduce algorithm 'tree'; choose one of gloo, ring, one-shot, shared-memory"):
        time_all_reduce([1024], algorithm="tree")
