"""Lesson 02 (tensor parallelism): its pictures, the compute-vs-communication model and widget, the
rank functions it runs, and the checks of its two exercises (correct and wrong solutions).

The pure tests start no process; the ``ranks`` tests run real gloo ranks (2 and 4).
"""

import inspect
import linecache
import re

import pytest
import torch
import torch.distributed as dist

from parallel_lab import exercises
from parallel_lab.exercises import check
from parallel_lab.exercises.g_operator import EXERCISE as G
from parallel_lab.exercises.row_parallel import EXERCISE as ROW
from parallel_lab.hardware import LINKS, Link, ring_all_reduce_time
from parallel_lab.planning import cost
from parallel_lab.runtime import launcher
from parallel_lab.show import tensor as figures
from parallel_lab.show import tp_cost as widgets
from parallel_lab.tensor import demos as lesson

# ----------------------------------------------------------------------------------------------
# Pictures: deterministic, small, and drawing what they say.


def _texts(fig):
    return [a.text for a in fig.layout.annotations]


@pytest.mark.parametrize("kind", ["column", "row"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_figure_is_deterministic_and_small(kind, tp):
    a, b = figures.split_figure(kind, tp), figures.split_figure(kind, tp)
    assert a.to_json() == b.to_json()
    assert len(a.to_json()) < 30_000
    assert sum(f"<b>rank {r}</b>" in _texts(a) for r in range(tp)) == tp


def test_column_split_shows_each_rank_its_columns_and_the_all_gather():
    texts = _texts(figures.split_figure("column", 4))
    assert {"W₀", "W₁", "W₂", "W₃", "Y₀", "Y₃"} <= set(texts)
    assert texts.count("X (all)") == 4  # every rank holds all of X
    assert any(t.startswith("<b>all-gather</b>") for t in texts)
    assert not any("all-reduce" in t for t in texts)


def test_row_split_shows_partial_sums_and_the_all_reduce():
    fig = figures.split_figure("row", 2)
    texts = _texts(fig)
    assert {"X₀", "X₁", "W₀", "W₁", "X₀·W₀ (partial)", "X₁·W₁ (partial)"} <= set(texts)
    assert texts.count("Y = Σ partials") == 2
    assert any(t.startswith("<b>all-reduce</b>") for t in texts)
    # Rank 1's rows of W are the lower half of its outline of W.
    rows = [s for s in fig.layout.shapes if s.fillcolor == figures.RANK_COLOURS[1] and s.x0 == figures.W0]
    assert len(rows) == 1 and rows[0].y1 - rows[0].y0 == figures.K / 2


def test_split_figure_refuses_bad_arguments():
    with pytest.raises(ValueError, match="kind must be"):
        figures.split_figure("diagonal")
    with pytest.raises(ValueError, match="tp must divide"):
        figures.split_figure("row", 3)


def test_heads_figure_gives_each_rank_consecutive_whole_heads():
    fig = figures.heads_figure(heads=24, tp=4, head_dim=8)
    assert fig.to_json() == figures.heads_figure(heads=24, tp=4, head_dim=8).to_json()
    assert len(fig.to_json()) < 30_000
    (heat,) = fig.data
    assert all(list(row) == [h // 6 for h in range(24)] for row in heat.z)
    assert "<b>rank 3</b>: heads 18–23" in _texts(fig)
    assert heat.customdata[0][7] == "W_q columns 56–63"
    with pytest.raises(ValueError, match="heads 10 is not divisible by tp 4"):
        figures.heads_figure(heads=10, tp=4)


# ----------------------------------------------------------------------------------------------
# The compute-vs-communication model: formulas, the default numbers, the chart and the widget.


def test_compute_is_three_times_24_b_s_h_squared_over_t():
    """A layer's forward matmuls are 24·b·s·h² FLOPs, its backward twice that (Narayanan et al. 2021)."""
    assert cost.layer_flops(tokens=2048, hidden=12288) == 24 * 2048 * 12288**2
    compute, _ = cost.tp_layer_step(2048, 12288, 8, LINKS["nvlink4"], 400e12)
    assert compute == pytest.approx(3 * 24 * 2048 * 12288**2 / 8 / 400e12)


def test_communication_is_four_ring_all_reduces_of_the_activation():
    n = 2048 * 12288 * 2
    link = Link("test", 300e9, 3e-6)
    expected = 4 * ring_all_reduce_time(n, 8, 3e-6, 300e9)  # g, g forward; f, f backward
    assert cost.tp_layer_step(2048, 12288, 8, link, 1.0)[1] == pytest.approx(expected)
    assert expected == pytest.approx(4 * (2 * 7 / 8 * n / 300e9 + 14 * 3e-6))
    assert cost.tp_layer_step(2048, 12288, 1, link, 1.0)[1] == 0.0


@pytest.mark.parametrize("tp", [2, 8, 64])
def test_ratio_without_latency_is_t_minus_1_bytes_f_over_9_h_b(tp):
    # The lesson's closed form: the tokens cancel.
    for tokens in (512, 8192):
        compute, comm = cost.tp_layer_step(tokens, 4096, tp, Link("no latency", 50e9, 0.0), 300e12)
        assert comm / compute == pytest.approx((tp - 1) * 2 * 300e12 / (9 * 4096 * 50e9))


def test_presets_are_2026_hardware_with_sources():
    from parallel_lab.hardware import SYSTEMS

    assert LINKS["nvlink4"].bandwidth == 450e9 and LINKS["nvlink5"].bandwidth == 900e9  # per direction
    assert LINKS["ndr"].bandwidth == 50e9  # 400 Gb/s per GPU
    assert SYSTEMS["GB200 NVL72"].domain == 72 and SYSTEMS["DGX H100"].domain == 8
    assert all(system.source for system in SYSTEMS.values())
    assert widgets.PRESETS["nvlink4"] == (LINKS["nvlink4"], SYSTEMS["DGX H100"].tflops * 1e12)
    # GB200's dense BF16 peak is 2500 TFLOP/s (B200's 2250): 1000 at the course's 40 %; GB300 (shipping since
    # 2H2025) has 288 GB per GPU and one 800 Gb/s ConnectX-8 per GPU
    assert SYSTEMS["GB200 NVL72"].tflops == 1000 and SYSTEMS["DGX B200"].tflops == 900
    assert widgets.PRESETS["nvlink5"] == (LINKS["nvlink5"], 1000e12)
    assert SYSTEMS["GB300 NVL72"].gpu_mem_gb == SYSTEMS["DGX B300"].gpu_mem_gb == 288
    assert SYSTEMS["GB300 NVL72"].network == LINKS["xdr"] and LINKS["xdr"].bandwidth == 100e9


def test_default_summary_is_the_lessons_text():
    assert widgets.default_summary().splitlines() == [
        "h = 12288, t = 8, 2048 tokens (b·s), 16-bit activations; each of the 4 all-reduces sums 50.3 MB",
        "NVLink 4 (H100/H200, in an 8-GPU node), 450 GB/s, α 3 µs, 396 TFLOP/s: compute 7.04 ms, "
        "communication 951 µs per layer (forward + backward) -> comm/compute = 0.14",
        "InfiniBand NDR (400 Gb/s per GPU, between nodes), 50 GB/s, α 10 µs, 396 TFLOP/s: compute 7.04 ms, "
        "communication 7.61 ms per layer (forward + backward) -> comm/compute = 1.1",
        "NVLink 5 (B200/GB200), 900 GB/s, α 3 µs, 1000 TFLOP/s: compute 2.78 ms, communication 559 µs per "
        "layer (forward + backward) -> comm/compute = 0.2",
        "ConnectX-8 (800 Gb/s per GPU, between NVLink domains), 100 GB/s, α 10 µs, 1000 TFLOP/s: compute 2.78 ms, "
        "communication 4.08 ms per layer (forward + backward) -> comm/compute = 1.5",
    ]


def test_times_are_written_without_exponents():
    assert [widgets._time(s) for s in (3e-6, 6.71e-4, 2.32e-3, 57.3, 5730.0)] == \
        ["3 µs", "671 µs", "2.32 ms", "57.3 s", "5,730 s"]


def test_cost_figure_draws_compute_and_communication_against_t():
    link, flops = widgets.PRESETS["nvlink4"]
    fig = widgets.cost_figure(link, 12288, 8, 2048, flops, others=[LINKS["ndr"]])
    assert fig.to_json() == widgets.cost_figure(link, 12288, 8, 2048, flops, others=[LINKS["ndr"]]).to_json()
    compute, comm, other = fig.data
    assert list(compute.x) == list(widgets.TPS) and list(comm.x) == list(widgets.TPS[1:])
    assert compute.y[3] == pytest.approx(7.036, rel=1e-3)  # t = 8
    assert comm.y[2] == pytest.approx(0.9508, rel=1e-3)
    assert all(o > c for o, c in zip(other.y, comm.y))  # InfiniBand costs more at every t
    assert "ratio 0.14" in fig.layout.title.text
    assert len(fig.to_json()) < 20_000


def test_cost_widget_presets_fill_the_editable_fields():
    machine = {"link": Link("this machine (gloo)", 1.5e9, 80e-6), "flops": 20e9}
    box = widgets.cost_widget(machine)
    controls, _, text = box.children
    (hidden, tp, tokens, value_bytes), (preset, bandwidth, alpha, tflops) = (v.children for v in controls.children)
    assert (bandwidth.value, alpha.value, tflops.value) == (450.0, 3.0, 395.6)
    assert "comm/compute = 0.14" in text.value
    preset.value = "machine"
    assert (bandwidth.value, alpha.value, tflops.value) == (1.5, 80.0, 0.02)
    assert text.value.startswith("<b>this machine (gloo), 1.5 GB/s")
    tp.value = 1
    assert "communication 0 µs" in text.value


# ----------------------------------------------------------------------------------------------
# The rank functions the lesson runs.


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_column_and_row_match_the_dense_layer_on_2_ranks():
    per_rank = launcher.run(lesson.column_and_row, 2)
    for r in per_rank:
        assert all(split["max_diff"] < lesson.TOLERANCE for split in r.values())
    mine = per_rank[0]
    assert mine["column"]["collectives"] == {}
    assert mine["column"]["W_r"] == (192, 192) and mine["column"]["Y_r"] == (2, 24, 192)
    assert mine["column + all-gather"]["collectives"] == {"all_gather_single": {"count": 1, "bytes": 73728}}
    assert mine["row"]["collectives"] == {"all_reduce": {"count": 1, "bytes": 73728}}
    assert mine["row"]["W_r"] == (192, 192)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_block_runs_two_all_reduces_each_way_in_groups_of_2_and_4():
    per_rank = launcher.run(lesson.block_runs, 4, kwargs=dict(tps=(2, 4), sequence_parallel=(False, True)))
    for runs in per_rank:
        assert all(r["matches"] for r in runs)
    runs = {(r["tp"], r["sequence_parallel"]): r for r in per_rank[0]}
    for tp in (2, 4):
        plain = runs[tp, False]
        assert plain["forward"] == plain["backward"] == {"all_reduce": {"count": 2, "bytes": 147456}}
        assert plain["output_shape"] == (2, 24, 192)
        sp = runs[tp, True]
        assert sp["forward"] == {"all_gather_single": {"count": 2, "bytes": 147456 // tp},
                                 "reduce_scatter_single": {"count": 2, "bytes": 147456}}
        assert sp["output_shape"] == (2, 24 // tp, 192)


# ----------------------------------------------------------------------------------------------
# Exercise 1: the row-parallel forward.


def row_correct(x_shard, w_shard, bias, group):
    partial = x_shard @ w_shard
    dist.all_reduce(partial, group=group)
    return partial + bias


def row_bias_on_every_rank(x_shard, w_shard, bias, group):
    partial = x_shard @ w_shard + bias
    dist.all_reduce(partial, group=group)
    return partial


def row_without_all_reduce(x_shard, w_shard, bias, group):
    return x_shard @ w_shard + bias


def row_ignores_group(x_shard, w_shard, bias, group):
    partial = x_shard @ w_shard
    dist.all_reduce(partial)
    return partial + bias


def as_answer(obj, name: str) -> str:
    """A test's function or class as an answer cell named as the exercise asks."""
    return inspect.getsource(obj).replace(f"{'class' if inspect.isclass(obj) else 'def'} {obj.__name__}",
                                          f"{'class' if inspect.isclass(obj) else 'def'} {name}", 1)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_row_parallel_correct_solution_passes_on_2_and_4_ranks():
    verdict = ROW.check(as_answer(row_correct, "my_row_parallel_forward"))
    assert verdict.passed
    assert verdict.lines == ["row-parallel forward on 2 ranks: PASSED (2/2 cases)",
                             "row-parallel forward on 4 ranks: PASSED (4/4 cases)"]


def failed(line: str) -> str:
    """A verdict line without its count of passed cases ("FAILED (1/2 cases): ..." -> "FAILED: ...")."""
    return re.sub(r"FAILED \(\d+/\d+ cases\)", "FAILED", line)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_row_parallel_wrong_solutions_fail_with_a_hint():
    bias = ROW.check(as_answer(row_bias_on_every_rank, "my_row_parallel_forward"))
    assert not bias.passed
    assert failed(bias.lines[0]) == ("row-parallel forward on 2 ranks: FAILED: x (3, 8), W (8, 5), the whole world "
                                     "(tp=2): rank 0: the bias was added 2 times (once per rank before the sum): "
                                     "add it once, after the all-reduce")
    local = ROW.check(as_answer(row_without_all_reduce, "my_row_parallel_forward"))
    assert failed(local.lines[0]) == ("row-parallel forward on 2 ranks: FAILED: x (3, 8), W (8, 5), the whole world "
                                      "(tp=2): rank 0: this is the rank's own partial product: sum it over the "
                                      "group with dist.all_reduce")


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_row_parallel_collective_without_group_fails_in_groups_of_2():
    verdict = ROW.check(as_answer(row_ignores_group, "my_row_parallel_forward"))
    assert not verdict.passed
    assert verdict.lines[0] == "row-parallel forward on 2 ranks: PASSED (2/2 cases)"  # one group: no difference
    assert failed(verdict.lines[1]).startswith("row-parallel forward on 4 ranks: FAILED: x (3, 8), W (8, 5), "
                                       "groups {0,1} and {2,3} (tp=2): rank 0: got [")
    assert verdict.lines[1].endswith("pass group=group to the collective, or it sums over every rank")


def test_row_parallel_may_not_use_the_library_or_another_collective():
    library = "from parallel_lab.tensor.mappings import reduce_from_tensor_parallel_region as g\n" + \
        "def my_row_parallel_forward(x_shard, w_shard, bias, group):\n    return g(x_shard @ w_shard, group) + bias\n"
    assert "imports parallel_lab.tensor.mappings: the library's own implementation is not an answer" in \
        ROW.check(library).lines[0]
    gather = "def my_row_parallel_forward(x_shard, w_shard, bias, group):\n    dist.all_gather(x_shard)\n"
    assert "uses dist.all_gather" in ROW.check(gather).lines[0]


# ----------------------------------------------------------------------------------------------
# Exercise 2: the operator g as an autograd Function.


class GCorrect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GSumsTheGradient(torch.autograd.Function):
    """f's backward by mistake: the gradient comes out tp times too large."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_g_correct_solution_passes_on_2_and_4_ranks():
    verdict = G.check(as_answer(GCorrect, "MyG"))
    assert verdict.passed
    assert verdict.lines == ["g operator on 2 ranks: PASSED (2/2 cases)", "g operator on 4 ranks: PASSED (4/4 cases)"]


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_g_wrong_solutions_fail_with_the_first_wrong_case():
    summed = G.check(as_answer(GSumsTheGradient, "MyG"))
    assert not summed.passed
    line = failed(summed.lines[0])
    assert line.startswith("g operator on 2 ranks: FAILED: row-parallel layer with g, forward and backward, "
                           "the whole world (tp=2): rank 0: grad of x_r: got [")
    assert line.endswith("(2x too large: the gradient of g's output is already the same on every rank, "
                         "so its backward must pass it on unchanged, not sum it)")
    identity = G.check(as_answer(GIdentity, "MyG"))
    assert failed(identity.lines[0]).startswith("g operator on 2 ranks: FAILED: forward sums over the whole world "
                                        "(tp=2): rank 0: got [")


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_zh_hant_g_failure_reads_chinese():
    """The verdict's detail (which case, which gradient, why) is the catalog's, not only its head: a
    zh-Hant student reads no English sentence in it, only code names and numbers."""
    from parallel_lab import i18n

    with i18n.using("zh-Hant"):
        summed = G.check(as_answer(GSumsTheGradient, "MyG"))
        identity = G.check(as_answer(GIdentity, "MyG"))
    line = summed.lines[0]
    assert not summed.passed and "未通過" in line
    assert "用 g 組成的列平行層，前向與反向，整個 world（tp=2）：rank 0：x_r 的梯度：得到 [" in line, line
    assert "（大了 2 倍：g 的輸出的梯度在每個 rank 上本來就相同" in line, line
    assert "前向在整個 world（tp=2）上加總：rank 0：得到 [" in identity.lines[0], identity.lines[0]
    for text in (line, identity.lines[0]):
        assert not re.search(r"[A-Za-z]+ [A-Za-z]+ [A-Za-z]+", text), text


def test_g_check_refuses_what_is_not_the_class():
    with pytest.raises(TypeError, match="pass the class you wrote, MyG"):
        exercises.check_g_operator(row_correct)
    with pytest.raises(TypeError, match="pass the class you wrote, MyG"):
        exercises.check_g_operator(dict)


def test_class_source_is_read_back_from_a_notebook_cell():
    # A notebook cell: a file only linecache knows, in a module without __file__ (like __main__).
    cell = ("import torch\n\n\nclass MyG(torch.autograd.Function):\n    @staticmethod\n"
            "    def forward(ctx, x, group):\n        return x.clone()\n\n"
            "    @staticmethod\n    def backward(ctx, grad):\n        return grad, None\n\nother = 1\n")
    filename = "/tmp/ipykernel_0/0123456789.py"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(keepends=True), filename)
    try:
        namespace = {"__name__": "a_notebook_cell"}
        exec(compile(cell, filename, "exec"), namespace)
        source = check.answer_source(namespace["MyG"])
    finally:
        del linecache.cache[filename]
    assert source == cell  # the whole cell: the grader reads the same cell from the submitted file


def test_class_source_of_a_module_class_uses_inspect():
    assert check.answer_source(GCorrect).startswith("class GCorrect(torch.autograd.Function):")
