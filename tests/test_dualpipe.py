"""DualPipeV (DeepSeek-V3 technical report 2024, section 3.2.1; PyTorch's ``ScheduleDualPipeV``)
against its peer, ZB-V and 1F1B: the order, the makespan, the bubble, memory counted until W, the
closed form. Pure: PyTorch's schedule is read from its order generator, no process starts.

PyTorch's order comes from ``ScheduleDualPipeV._calculate_single_rank_operations(rank)``, the
function its ``__init__`` fills ``pipeline_order`` with; it reads only ``pp_group_size`` and
``_n_microbatches``, so an instance made with ``__new__`` and those two attributes gives the same
order without stages or a process group. Its actions map to ours one to one (FORWARD F,
FULL_BACKWARD B, BACKWARD_INPUT I, BACKWARD_WEIGHT W), and an overlapped ``OVERLAP_F_B`` becomes its
two sub-actions in their order, F then B: what PyTorch's runtime does with it too unless a custom
overlap function is registered (``_PipelineScheduleRuntime._step_microbatches``).
"""

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from parallel_lab.pipeline.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    build,
    dualpipe_v,
    one_f_one_b,
    zb_v,
)
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.planning.cost import pipeline_makespan

KIND = {torch_schedules.FORWARD: "F", torch_schedules.FULL_BACKWARD: "B",
        torch_schedules.BACKWARD_INPUT: "I", torch_schedules.BACKWARD_WEIGHT: "W"}
UNIT = Costs(F=1, B=2, I=1, W=1)  # per model stage (half a rank's layers)
SLOW_I = Costs(F=1, B=3, I=2, W=1)  # the input gradient twice the weight gradient
LINK = Costs(F=1, B=2, I=1, W=1, latency=0.5)  # a message costs half a forward
CASES = [(p, m) for p in range(1, 9) for m in (2 * p, 2 * p + 1, 3 * p, 4 * p + 3)]


def torch_dualpipe_v(p: int, m: int) -> Schedule:
    """PyTorch's ScheduleDualPipeV order in our notation (see the module doc)."""
    peer = torch_schedules.ScheduleDualPipeV.__new__(torch_schedules.ScheduleDualPipeV)
    peer.pp_group_size, peer._n_microbatches = p, m
    rows = []
    for rank in range(p):
        row = []
        for a in peer._calculate_single_rank_operations(rank):
            subs = a.sub_actions if a.computation_type == torch_schedules.OVERLAP_F_B else (a,)
            row += [Action(s.stage_index, KIND[s.computation_type], s.microbatch_index) for s in subs]
        rows.append(row)
    placement = torch_schedules.generate_stage_to_rank_mapping(p, 2 * p, style="v")
    return Schedule("torch-dualpipe-v", p, m, 2, tuple(placement[s] for s in range(2 * p)), rows)


def split(schedule: Schedule) -> list[list[Action]]:
    """Every full backward B written as I followed at once by W."""
    return [[x for a in row for x in ((Action(a.stage, "I", a.microbatch), Action(a.stage, "W", a.microbatch))
                                      if a.kind == "B" else (a,))] for row in schedule.ranks]


# ---------------------------------------------------------------- the order


def test_registered_built_and_placed_like_zb_v():
    assert SCHEDULES["dualpipe-v"] is dualpipe_v
    s = build("dualpipe-v", 4, 8)
    assert s == build("dualpipe-v", 4, 8, virtual=2) == dualpipe_v(4, 8)
    assert (s.name, s.n_stages, s.virtual, s.split_backward) == ("dualpipe-v", 8, 2, True)
    assert s.stage_to_rank == zb_v(4, 8).stage_to_rank == torch_dualpipe_v(4, 8).stage_to_rank


def test_is_pytorchs_order_with_every_full_backward_split_into_i_then_w():
    for p, m in CASES:
        ours, theirs = dualpipe_v(p, m), torch_dualpipe_v(p, m)
        validate(ours)
        validate(theirs)  # PyTorch mixes B and I/W, never for the same (stage, micro-batch)
        assert ours.ranks == split(theirs), (p, m)
        assert all(a.kind != "B" for _, _, a in ours.actions())


def test_steady_state_pairs_a_forward_with_another_micro_batchs_backward_on_the_other_stage():
    """DualPipe's signature (F0 & B1), (F1 & B0): rank 0 of p = 4, m = 8, after PyTorch's warm-up
    (6 down forwards, 1 forward pair, 3 I-W-F triples of the up stage): 0F7 is paired with 7I3,
    7F4 with 0I0. Every overlapped pair of PyTorch's is an adjacent F, I (then W) of ours."""
    row = [str(a) for a in dualpipe_v(4, 8).ranks[0]]
    assert row[:17] == ["0F0", "0F1", "0F2", "0F3", "0F4", "0F5", "0F6", "7F0", "7I0", "7W0", "7F1",
                        "7I1", "7W1", "7F2", "7I2", "7W2", "7F3"]
    assert row[17:29] == ["0F7", "7I3", "7W3", "7F4", "0I0", "0W0", "7I4", "7W4", "7F5", "0I1", "0W1", "7I5"]
    for p, m in CASES:
        peer = torch_schedules.ScheduleDualPipeV.__new__(torch_schedules.ScheduleDualPipeV)
        peer.pp_group_size, peer._n_microbatches = p, m
        for rank, actions in enumerate(dualpipe_v(p, m).ranks):
            overlapped = [a.sub_actions for a in peer._calculate_single_rank_operations(rank)
                          if a.computation_type == torch_schedules.OVERLAP_F_B]
            assert len(overlapped) == 2 * (m - 2 * p + rank + 1) + (p - rank - 1) - (rank == p - 1)
            adjacent = {(str(f), str(b)) for f, b in zip(actions, actions[1:]) if f.kind == "F" and b.kind == "I"}
            for f, b in overlapped:
                assert f.stage_index != b.stage_index and f.microbatch_index != b.microbatch_index
                assert (f"{f.stage_index}F{f.microbatch_index}", f"{b.stage_index}I{b.microbatch_index}") in adjacent


@pytest.mark.parametrize("args,message", [
    (("dualpipe-v", 4, 7), "dualpipe-v needs microbatches >= 2 * ranks (at least one micro-batch per model "
                           "stage, as PyTorch's ScheduleDualPipeV), got microbatches 7, ranks 4 (2 * ranks = 8)"),
    (("dualpipe-v", 1, 1), "got microbatches 1, ranks 1 (2 * ranks = 2)"),
    (("dualpipe-v", 4, 8, 3), "dualpipe-v has a fixed 2 stage(s) per rank, got virtual 3"),
    (("dualpipe-v", 0, 8), "dualpipe-v: ranks must be a positive integer, got ranks 0"),
    (("dualpipe-v", 4, 513), "microbatches 513 > 512"),
])
def test_build_checks_the_parameters(args, message):
    with pytest.raises(ScheduleError) as info:
        build(*args)
    assert message in str(info.value)


def test_pytorch_refuses_the_same_micro_batch_counts():
    """Our m >= 2p is PyTorch's own check ("at least as many microbatches as stages")."""
    source = torch_schedules.ScheduleDualPipeV.__init__.__code__.co_consts
    assert any("DualPipeV requires at least as many microbatches as stages" in str(c) for c in source)


# ---------------------------------------------------------------- against PyTorch's order


@pytest.mark.parametrize("costs", [UNIT, SLOW_I], ids=["F=I=W=1", "F=1,I=2,W=1"])
def test_makespan_equals_pytorchs_at_equal_costs(costs):
    """With free links, B = I + W and nothing waiting on W, splitting B changes no start time."""
    for p, m in CASES:
        assert simulate(dualpipe_v(p, m), costs).makespan == simulate(torch_dualpipe_v(p, m), costs).makespan


def test_makespan_beats_pytorchs_when_messages_cost_time():
    """The gradient leaves at I instead of at the end of B: with a link of half a forward, shorter
    for every p >= 2 (and never longer: list scheduling is monotone in when inputs arrive)."""
    for p, m in CASES:
        ours, theirs = simulate(dualpipe_v(p, m), LINK).makespan, simulate(torch_dualpipe_v(p, m), LINK).makespan
        assert ours < theirs if p > 1 else ours == theirs, (p, m)


def test_the_comparison_table():
    """The numbers of the report: makespan, bubble and peak per rank (in stashes of one stage, half a
    rank's layers; 1F1B runs the same model on p stages, so its whole-rank stash counts 2)."""
    rows = {}
    for p, m in [(4, 8), (4, 16), (8, 16)]:
        for costs, label in [(UNIT, "unit"), (SLOW_I, "slow I")]:
            whole = Costs(F=2 * costs.F, B=2 * costs.B, I=2 * costs.I, W=2 * costs.W)
            for name, schedule, c, unit in [("1f1b", one_f_one_b(p, m), whole, 2), ("zb-v", zb_v(p, m), costs, 1),
                                            ("dualpipe-v", dualpipe_v(p, m), costs, 1),
                                            ("torch", torch_dualpipe_v(p, m), costs, 1)]:
                t = simulate(schedule, c)
                rows[p, m, label, name] = (t.makespan, round(t.bubble_fraction, 3),
                                           [unit * x for x in t.peak_rank_activations])
    assert rows[4, 8, "unit", "1f1b"] == (66, 0.273, [8, 6, 4, 2])
    assert rows[4, 8, "unit", "zb-v"] == (51, 0.059, [8] * 4)
    assert rows[4, 8, "unit", "dualpipe-v"] == rows[4, 8, "unit", "torch"] == (51, 0.059, [9] * 4)
    assert rows[4, 8, "slow I", "zb-v"] == (70, 0.086, [8] * 4)
    assert rows[4, 8, "slow I", "dualpipe-v"] == rows[4, 8, "slow I", "torch"] == (72, 0.111, [9] * 4)
    assert rows[8, 16, "unit", "dualpipe-v"] == (103, 0.068, [17] * 8)
    assert rows[8, 16, "slow I", "dualpipe-v"][:2] == (148, 0.135) and rows[8, 16, "slow I", "zb-v"][:2] == (142, 0.099)


# ---------------------------------------------------------------- bubble, memory, closed form


def test_bubble_at_unit_costs_is_zb_vs_start_up_lower_bound():
    """F = I = W = 1 per stage: 6m + p - 1, bubble (p-1)/(6m+p-1), as ZB-V; 1F1B on the same model
    (F = 2, B = 4 per rank) idles (p-1)/(m+p-1)."""
    for p, m in CASES:
        t = simulate(dualpipe_v(p, m), UNIT)
        assert t.makespan == 6 * m + p - 1 == simulate(zb_v(p, m), UNIT).makespan, (p, m)
        assert t.bubble_fraction == pytest.approx((p - 1) / (6 * m + p - 1))
        one = simulate(one_f_one_b(p, m), Costs(F=2, B=4)).bubble_fraction
        assert one == pytest.approx((p - 1) / (m + p - 1)) and t.bubble_fraction <= one


@pytest.mark.parametrize("f,b", [(1, 2), (1, 1), (1, 3), (1, 4), (2, 1), (3, 2), (1, 6), (1, 0.5), (0.7, 2.9)])
def test_closed_form_of_the_makespan_equals_the_simulator(f, b):
    """Free links, I = W = B/2, m >= 2p, per-stage F = f, B = b:
    2m(f + b) + max((p-1) max(2f - b, f), (p-1) b/2 - f); the warm-up and cool-down never depend on m.
    ``planning.cost.pipeline_makespan`` has it in whole-rank costs (fwd = 2f, bwd = 2b)."""
    for p, m in CASES:
        t = simulate(dualpipe_v(p, m), Costs(F=f, B=b))
        closed = 2 * m * (f + b) + max((p - 1) * max(2 * f - b, f), (p - 1) * b / 2 - f)
        assert t.makespan == pytest.approx(closed), (p, m)
        assert pipeline_makespan("dualpipe-v", p, m, 2, 2 * f, 2 * b) == pytest.approx(t.makespan), (p, m)


@pytest.mark.parametrize("w", [1.0, 32 / 34, 0.5, 0.0])
def test_peak_memory_counted_until_w_is_2p_plus_1_stage_stashes_on_every_rank(w):
    """Rank r holds 2p stashes after its warm-up (2p - r - 1 down, r + 1 up forwards), like ZB-V's
    2p; the first pair's forward starts before its partner backward frees anything: 2p + 1 (p + 1/2
    of a rank's layers), whatever W keeps, since every deferred W comes after the last forward.
    1F1B on the same model: p - r whole-rank stashes on rank r."""
    for p, m in CASES:
        ours = simulate(dualpipe_v(p, m), w_share=w)
        assert ours.peak_rank_activations == [2 * p + 1] * p, (p, m, w)
        assert simulate(zb_v(p, m), w_share=w).peak_rank_activations == [2 * p] * p, (p, m, w)
        assert [2 * x for x in simulate(one_f_one_b(p, m)).peak_rank_activations] == [2 * (p - r) for r in range(p)]
        assert simulate(torch_dualpipe_v(p, m), w_share=w).peak_rank_activations == ours.peak_rank_activations


def test_the_lesson_comparison_table_and_curves_take_it():
    from parallel_lab.planning import memory_model
    from parallel_lab.show import schedules as sf

    rows = sf.compare_schedules(cases=((4, 8),), schedules=sf.SCHEDULES + (("dualpipe-v", 2),))
    ours = rows[-1]
    assert ours["schedule"] == "dualpipe-v" and ours["peak"] == 4.5  # whole-rank stashes: p + 1/2
    assert ours["bubble"] == pytest.approx(3 / 51) and ours["messages"] == 2 * (2 * 4 - 2) * 8  # as ZB-V
    fig = sf.bubble_curves(ranks=4, microbatches=(8, 12, 16), schedules=(("dualpipe-v", 2),))
    assert list(fig.data[0].y) == [round(3 / (6 * m + 3), 4) for m in (8, 12, 16)]
    assert memory_model.in_flight("dualpipe-v", 4, 40, virtual=2) == [9] * 4  # capped m, same peak


# ---------------------------------------------------------------- DeepSeek's bubble formula


def paired_idle(p: int, m: int, costs=(("F", 1), ("B", 2), ("I", 1), ("W", 1))) -> list[float]:
    """Idle time per rank of PyTorch's DualPipeV order when every paired action (``OVERLAP_F_B``) is
    one block, as DeepSeek's README counts it: it starts once the inputs of both halves have arrived
    and ends as one (a full backward's input gradient leaves at its end), free links, list scheduling."""
    cost, last = dict(costs), 2 * p - 1
    peer = torch_schedules.ScheduleDualPipeV.__new__(torch_schedules.ScheduleDualPipeV)
    peer.pp_group_size, peer._n_microbatches = p, m

    def inputs(kind, stage, j):
        if kind == "F":
            return [("F", stage - 1, j)] if stage > 0 else []
        if kind in "BI":
            return [("F", stage, j)] + ([("I", stage + 1, j)] if stage < last else [])
        return [("I", stage, j)]

    blocks = [[[(KIND[s.computation_type], s.stage_index, s.microbatch_index)
                for s in (a.sub_actions if a.computation_type == torch_schedules.OVERLAP_F_B else (a,))]
               for a in peer._calculate_single_rank_operations(rank)] for rank in range(p)]
    done, free, at, busy = {}, [0.0] * p, [0] * p, [0.0] * p
    while any(at[r] < len(blocks[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if at[r] == len(blocks[r]):
                continue
            block = blocks[r][at[r]]
            need = [d for action in block for d in inputs(*action)]
            if all(d in done for d in need):
                start = max([free[r]] + [done[d] for d in need])
                end = start + sum(cost[kind] for kind, _, _ in block)
                for kind, stage, j in block:
                    done[(kind, stage, j)] = end
                    if kind == "B":
                        done[("I", stage, j)] = end
                busy[r] += end - start
                free[r], at[r], moved = end, at[r] + 1, True
        assert moved, "deadlock"
    return [max(free) - b for b in busy]


@pytest.mark.parametrize("p,m", CASES)
def test_deepseeks_formula_counts_a_pair_as_one_block(p, m):
    """DeepSeek's README gives DualPipeV's bubble as (PP/2 − 1)(F&B + B − 3W), PP = 2p stages. With a
    pair run one after the other (F&B = F + B) at F = I = W = 1 that is 2(p − 1) per rank: what its
    order gives when each pair is one block, while our executor's separate actions idle p − 1 (lesson
    07 states both and why)."""
    f, i, w = 1, 1, 1
    formula = (p - 1) * ((f + i + w) + (i + w) - 3 * w)
    assert paired_idle(p, m) == [formula] * p
    t = simulate(dualpipe_v(p, m), UNIT)
    assert [t.makespan - b for b in t.busy] == [p - 1] * p
