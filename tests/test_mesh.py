"""The device mesh (parallel_lab.runtime.mesh): the pure rank grid, its errors, and real groups on 4 and 8 ranks."""

import json

import pytest
import torch

from parallel_lab.runtime import launcher, mesh
from parallel_lab.runtime.mesh import Coord, ParallelDims
from parallel_lab.show.mesh import mesh_figure

# ----------------------------------------------------------------------------------------------
# Pure: no processes.


def test_grid_is_picotrons_arange_view():
    dims = ParallelDims(dp=2, pp=2, tp=2, nodes=2)
    assert torch.equal(dims.grid(), torch.arange(8).view(2, 2, 2))
    assert dims.world_size == 8 and dims.devices_per_node == 4


def test_coords_and_rank_of_are_inverse_and_tp_is_fastest():
    dims = ParallelDims(dp=3, pp=2, tp=2)
    assert dims.coords(0) == Coord(0, 0, 0)
    assert dims.coords(1) == Coord(0, 0, 1)  # the next rank is the next TP shard
    assert dims.coords(2) == Coord(0, 1, 0)  # then the next pipeline stage
    assert dims.coords(4) == Coord(1, 0, 0)  # then the next replica
    grid = dims.grid()
    for rank in range(dims.world_size):
        c = dims.coords(rank)
        assert dims.rank_of(*c) == rank == grid[c.dp, c.pp, c.tp].item()


def test_groups_partition_the_ranks():
    dims = ParallelDims(dp=2, pp=2, tp=2, nodes=2)
    assert dims.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.pp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.dp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for dim in mesh.DIMS:
        members = sorted(r for g in dims.groups(dim) for r in g)
        assert members == list(range(8))
        for rank in range(8):
            assert rank in dims.group_of(dim, rank)
            assert len(dims.group_of(dim, rank)) == getattr(dims, dim)


def test_groups_agree_with_the_grid_axes():
    dims = ParallelDims(dp=2, pp=3, tp=2)
    grid = dims.grid()
    for rank in range(dims.world_size):
        d, p, t = dims.coords(rank)
        assert dims.group_of("tp", rank) == grid[d, p, :].tolist()
        assert dims.group_of("pp", rank) == grid[d, :, t].tolist()
        assert dims.group_of("dp", rank) == grid[:, p, t].tolist()


def test_tp_inside_nodes_pp_and_dp_across():
    dims = ParallelDims(dp=2, pp=4, tp=4, nodes=4)  # 32 ranks, 8 per node
    assert [dims.node_of(r) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]
    assert not dims.crosses_nodes("tp")
    assert dims.crosses_nodes("pp") and dims.crosses_nodes("dp")
    for group in dims.tp_groups():
        assert len({dims.node_of(r) for r in group}) == 1


def test_pipeline_neighbours():
    dims = ParallelDims(dp=1, pp=3, tp=2)
    assert dims.pp_neighbours(0) == (None, 2)
    assert dims.pp_neighbours(3) == (1, 5)
    assert dims.pp_neighbours(5) == (3, None)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp=1, pp=2, tp=2, nodes=3, devices_per_node=2), "world_size 6 != dp 1 x pp 2 x tp 2"),
    (dict(dp=1, pp=1, tp=8, nodes=2, devices_per_node=4),
     "tp 8 > devices_per_node 4: tensor parallel groups would cross nodes"),
    (dict(dp=3, pp=1, tp=4, nodes=2, devices_per_node=6),
     "devices_per_node 6 % tp 4 != 0: tensor parallel groups would cross nodes (ranks 4..7 span nodes 0 and 1)"),
    (dict(dp=3, pp=1, tp=1, nodes=2), "world_size 3 (dp 3 x pp 1 x tp 1) is not divisible by nodes 2"),
    (dict(dp=0, pp=1, tp=1), "dp must be a positive integer, got dp 0"),
    (dict(dp=1, pp=1.5, tp=1), "pp must be a positive integer"),
])
def test_errors_name_the_invariant_with_values(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelDims(**kwargs)


def test_check_world_size_and_from_world():
    dims = ParallelDims(dp=1, pp=2, tp=2)
    dims.check_world_size(4)
    with pytest.raises(ValueError, match="world_size 6 != dp 1 x pp 2 x tp 2"):
        dims.check_world_size(6)
    assert ParallelDims.from_world(8, tp=2, pp=2) == ParallelDims(2, 2, 2)
    with pytest.raises(ValueError, match="world_size 6 is not divisible by pp 4 x tp 1"):
        ParallelDims.from_world(6, pp=4)
    with pytest.raises(ValueError, match="rank must be in 0..3, got rank 4"):
        dims.coords(4)


def test_figure_is_deterministic_and_complete():
    dims = ParallelDims(dp=2, pp=2, tp=2, nodes=2)
    fig = mesh_figure(dims)
    again = mesh_figure(dims)
    assert json.dumps(fig.to_plotly_json(), sort_keys=True) == json.dumps(again.to_plotly_json(), sort_keys=True)
    assert [trace.name for trace in fig.data] == ["pp stage 0", "pp stage 1"]
    labels = [text for trace in fig.data for text in trace.text]
    assert sorted(labels) == sorted(f"r{r}<br>tp{dims.coords(r).tp} dp{dims.coords(r).dp}" for r in range(8))
    assert len([s for s in fig.layout.shapes if s.type == "rect"]) == 2  # one box per node
    # devices sit in their node's row, in rank order
    for trace in fig.data:
        for x, y, data in zip(trace.x, trace.y, trace.customdata):
            assert (y, x) == divmod(data[0], 4)


# ----------------------------------------------------------------------------------------------
# Real groups on real ranks.


def _expected(dims, rank):
    prev, nxt = dims.pp_neighbours(rank)
    groups = {dim: dims.group_of(dim, rank) for dim in mesh.DIMS}
    return groups, prev, nxt


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dp, pp, tp, nodes", [(1, 2, 2, 1), (2, 1, 2, 2), (2, 2, 1, 1), (2, 2, 2, 2), (1, 4, 2, 2)])
def test_groups_on_ranks(dp, pp, tp, nodes):
    dims = ParallelDims(dp, pp, tp, nodes)
    results = launcher.run(mesh.check_groups, dims.world_size, args=(dp, pp, tp, nodes), timeout=90)
    for rank, result in enumerate(results):
        groups, prev, nxt = _expected(dims, rank)
        assert result["rank"] == rank
        assert result["coords"] == tuple(dims.coords(rank))
        assert result["found"] == groups  # members discovered by all-reducing over each group
        assert result["listed"] == groups
        assert (result["pp_prev"], result["pp_next"]) == (prev, nxt)
        assert result["received_from_prev"] == prev  # a real send/recv along the pipeline


@pytest.mark.ranks
@pytest.mark.timeout(60)
def test_build_groups_refuses_a_world_of_the_wrong_size():
    with pytest.raises(launcher.RankError, match="world_size 4 != dp 1 x pp 2 x tp 1"):
        launcher.run(mesh.check_groups, 4, args=(1, 2, 1), timeout=30)


def test_lesson_11s_traffic_table_is_what_its_text_quotes():
    """Lesson 11 quotes the table's numbers (the α-β model, deterministic): TP's all-reduces against a
    layer's compute, and the pipeline's message whole (about 2 ms over InfiniBand) and as 1/t slices."""
    from pathlib import Path

    from parallel_lab.hardware import SYSTEMS
    from parallel_lab.show import mesh as mesh_figures

    rows = mesh_figures.layer_traffic(SYSTEMS["DGX H100"], b=1, s=2048, h=12288, t=8)
    ms = [(round(fast * 1e3, 2), round(slow * 1e3, 2)) for _, fast, slow in rows]
    assert ms == [(7.04, 7.04), (0.95, 7.61), (0.23, 2.03), (0.03, 0.27)]
    source = (Path(__file__).resolve().parent.parent / "lessons" / "src" / "11_3d_parallelism.py").read_text()
    for quoted in ("(7.61 ms)", "(7.04 ms)", "14 % of it", "2.03 ms over InfiniBand", "0.27 ms"):
        assert quoted in source, quoted
