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

    from parallel_lab.pipeline.stages import cut
    from parallel_lab.pipeline.worker import ChainWorker, StageWorker, make_worker

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
    import contextlib

    import torch

    from parallel_lab.pipeline.executor import _saved_bytes
    from parallel_lab.pipeline.stages import ModelSpec

    spec = ModelSpec("mlp", hidden=8, layers=8, batch=12)
    x, target = spec.data()
    grad = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    first, last = stage_index == 0, stage_index == 3
    split, recompute = "split" in variant, "recompute" in variant
    runs = []
    for w in _workers(stage_index, spec, split=split, recompute=recompute):
        out, counted = [], []
        for j in range(3):
            with _saved_bytes(w, j):
                out.append(w.forward(j, x[4 * j:4 * j + 4] if first else x[4 * j:4 * j + 4].clone(),
                                     target[4 * j:4 * j + 4] if last else None).detach().clone())
            counted.append(w.saved_bytes[j])
        for j in range(3):
            g = None if last else grad
            with _saved_bytes(w, j) if recompute else contextlib.nullcontext():  # as the executor counts
                dx = w.input_grad(j, g) if split else w.backward(j, g)
            counted.append(w.saved_bytes.get(j))  # under recompute: what the second forward kept
            if split:
                counted.append(w.held_bytes(j))
                w.weight_grad(j)
            out.append(None if dx is None else dx.clone())
        out += [p.grad.clone() for p in w.params]
        runs.append((out, counted))
    (plain, plain_bytes), (fast, fast_bytes) = runs
    assert fast_bytes == plain_bytes  # the same tensors kept: the memory figures do not change
    for a, b in zip(plain, fast):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_all_reduce_timing_names_its_algorithms():
    from parallel_lab.planning.calibration import time_all_reduce

    with pytest.raises(ValueError,
                       match="unknown all-reduce algorithm 'tree'; choose one of gloo, ring, one-shot, shared-memory"):
        time_all_reduce([1024], algorithm="tree")
