"""Pure tests of pipeline schedules: representation, generators, validation, send/recv, grid."""

import json
from collections import Counter
from dataclasses import replace

import pytest

from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError, format_grid, parse_actions
from parallel_lab.pipeline.communication import Comm, communication
from parallel_lab.pipeline.schedules import (
    SCHEDULES,
    build,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    naive,
    one_f_one_b,
    zb_h1,
    zb_v,
)
from parallel_lab.pipeline.validate import validate


def all_schedules(max_p=6, max_m=10):
    """Every registered schedule over a grid of (p, m, v) it accepts."""
    for p in range(1, max_p + 1):
        yield naive(p)
        for m in range(1, max_m + 1):
            yield gpipe(p, m)
            yield one_f_one_b(p, m)
            yield zb_h1(p, m)
            yield zb_v(p, m)
            if m >= 2 * p:
                yield dualpipe_v(p, m)
            if m % p == 0:
                for v in (1, 2, 3):
                    yield interleaved_1f1b(p, m, v)


def rows(schedule):
    return [" ".join("." if a is None else str(a) for a in actions) for actions in schedule.ranks]


def with_rows(schedule, *lines):
    return replace(schedule, ranks=[parse_actions(line) for line in lines])


def error_of(schedule):
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    return str(info.value)


# ---------------------------------------------------------------- representation


def test_action_text_round_trip():
    a = Action(1, "F", 3)
    assert str(a) == "1F3"
    assert Action.parse("1F3") == a
    assert Action.parse("12W105") == Action(12, "W", 105)
    assert parse_actions("0F0 . 0B0") == [Action(0, "F", 0), None, Action(0, "B", 0)]


@pytest.mark.parametrize("bad", ["1X3", "F3", "1F", "a1F3", ""])
def test_action_parse_rejects_malformed(bad):
    with pytest.raises(ScheduleError, match="cannot parse action"):
        Action.parse(bad)


def test_to_dict_is_json_and_round_trips():
    s = interleaved_1f1b(2, 4, 2)
    data = json.loads(json.dumps(s.to_dict()))
    assert Schedule.from_dict(data) == s
    assert data["stage_to_rank"] == [0, 1, 0, 1]


def test_to_text_lines_parse_back():
    s = zb_h1(3, 4)
    lines = s.to_text().splitlines()
    assert lines[0].startswith("rank 0: 0F0 0F1 0F2 0I0 0W0")
    assert [parse_actions(line.split(":", 1)[1]) for line in lines] == s.ranks


# ---------------------------------------------------------------- generators


def test_every_generated_schedule_validates_and_is_complete():
    n = 0
    for s in all_schedules():
        validate(s)
        kinds = Counter(a.kind for _, _, a in s.actions())
        pairs = s.n_stages * s.n_microbatches
        assert kinds["F"] == pairs, s.name
        assert kinds["B"] + kinds["I"] == pairs and kinds["I"] == kinds["W"], s.name
        assert s.split_backward == (s.name in ("zb-h1", "zb-v", "dualpipe-v"))
        n += 1
    assert n > 300


def test_naive_is_one_microbatch_through_every_stage():
    assert rows(naive(3)) == ["0F0 0B0", "1F0 1B0", "2F0 2B0"]
    assert naive(3).n_microbatches == 1


def test_gpipe_all_forwards_then_all_backwards():
    assert rows(gpipe(2, 3)) == ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]


def test_1f1b_warmup_steady_cooldown():
    assert rows(one_f_one_b(3, 5)) == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0F4 0B2 0B3 0B4",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1F4 1B3 1B4",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4",
    ]


def test_1f1b_with_fewer_microbatches_than_stages():
    assert rows(one_f_one_b(4, 2))[0] == "0F0 0F1 0B0 0B1"  # warm-up capped at m
    assert rows(one_f_one_b(4, 2))[3] == "3F0 3B0 3F1 3B1"


def test_interleaved_maps_stage_to_rank_mod_p_and_orders_chunks_in_groups_of_p():
    s = interleaved_1f1b(2, 4, 2)
    assert s.n_stages == 4 and s.stage_to_rank == (0, 1, 0, 1)
    # rank 0 warm-up: (v-1)*p + 2*(p-1) = 4 forwards: mb 0,1 through chunk 0, then through chunk 1
    assert rows(s)[0].split()[:4] == ["0F0", "0F1", "2F0", "2F1"]
    # first backwards are on the last chunk (stage 2), in microbatch order
    assert [str(a) for a in s.ranks[0] if a.kind == "B"][:2] == ["2B0", "2B1"]


@pytest.mark.parametrize("p,m", [(1, 3), (3, 6), (4, 8)])
def test_interleaved_with_one_chunk_is_1f1b(p, m):
    assert interleaved_1f1b(p, m, 1).ranks == one_f_one_b(p, m).ranks


def test_zb_h1_defers_r_weight_passes_on_rank_r():
    assert rows(zb_h1(3, 4)) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    ]


def test_zb_v_places_stages_in_a_v():
    s = zb_v(4, 8)
    assert s.n_stages == 8 and s.virtual == 2
    assert s.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert {a.stage for a in s.ranks[0]} == {0, 7}
    assert {a.stage for a in s.ranks[3]} == {3, 4}


def test_zb_v_with_few_microbatches_drops_the_padding():
    s = zb_v(4, 2)
    validate(s)
    assert max(a.microbatch for _, _, a in s.actions()) == 1


def test_registry_and_build_names():
    assert list(SCHEDULES) == ["naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]
    assert build("1f1b", 4, 8) == one_f_one_b(4, 8)
    assert build("interleaved-1f1b", 4, 8, virtual=2).n_stages == 8
    assert build("zb-v", 4, 8).n_stages == 8 and build("zb-v", 4, 8, virtual=2).n_stages == 8
    assert build("dualpipe-v", 4, 8) == dualpipe_v(4, 8) and build("dualpipe-v", 4, 8).n_stages == 8
    assert build("naive", 4, 1).n_stages == 4


@pytest.mark.parametrize(
    "args,message",
    [
        (("interleaved-1f1b", 4, 6, 2),
         "interleaved-1f1b needs microbatches % ranks == 0, got microbatches 6, ranks 4"),
        (("1f1b", 0, 4), "1f1b: ranks must be a positive integer, got ranks 0"),
        (("gpipe", 2, 0), "gpipe: microbatches must be a positive integer, got microbatches 0"),
        (("interleaved-1f1b", 2, 4, 0), "virtual must be a positive integer, got virtual 0"),
        (("1f1b", 2.5, 4), "ranks must be a positive integer, got ranks 2.5"),
        (("pipedream", 2, 4), "unknown schedule 'pipedream'; choose one of naive, gpipe"),
        (("naive", 4, 8), "naive runs the whole batch as one microbatch, got microbatches 8"),
        (("gpipe", 4, 8, 2), "gpipe has a fixed 1 stage(s) per rank, got virtual 2"),
        (("zb-v", 4, 8, 3), "zb-v has a fixed 2 stage(s) per rank, got virtual 3"),
        (("1f1b", 65, 8), "ranks 65 > 64"),
        (("1f1b", 4, 513), "microbatches 513 > 512"),
    ],
)
def test_build_rejects_bad_parameters_with_the_values(args, message):
    with pytest.raises(ScheduleError) as info:
        build(*args)
    assert message in str(info.value)


# ---------------------------------------------------------------- validation


def test_missing_action_is_named_with_its_rank():
    msg = error_of(with_rows(one_f_one_b(2, 2), "0F0 0F1 0B0", "1F0 1B0 1F1 1B1"))
    assert "0B1 (stage 0, microbatch 1) is missing (expected on rank 0)" in msg


def test_missing_weight_pass_is_named():
    msg = error_of(with_rows(zb_h1(1, 2), "0F0 0I0 0W0 0F1 0I1"))
    assert "0W1 (stage 0, microbatch 1) is missing" in msg


def test_duplicate_action_points_at_second_copy():
    msg = error_of(with_rows(one_f_one_b(2, 2), "0F0 0F1 0B0 0B1 0B1", "1F0 1B0 1F1 1B1"))
    assert "rank 0, step 4: 0B1 appears twice (first at rank 0, step 3)" in msg
    assert ">0B1<" in msg


def test_backward_before_its_forward():
    msg = error_of(with_rows(one_f_one_b(2, 2), "0F0 0B0 0F1 0B1", "1B0 1F0 1F1 1B1"))
    assert "rank 1, step 0: 1B0 runs before its input 1F0 (stage 1, microbatch 0)" in msg
    assert ">1B0<" in msg


def test_weight_pass_before_input_pass():
    msg = error_of(with_rows(zb_h1(1, 2), "0F0 0W0 0I0 0F1 0I1 0W1"))
    assert "rank 0, step 1: 0W0 runs before its input 0I0" in msg


def test_full_backward_mixed_with_split_backward():
    msg = error_of(with_rows(zb_h1(1, 1), "0F0 0I0 0B0"))
    assert "rank 0, step 2: 0B0 mixes full backward B with split I/W" in msg
    msg = error_of(with_rows(zb_h1(1, 1), "0F0 0B0 0W0"))
    assert "0W0 mixes full backward B with split I/W" in msg


def test_action_on_the_wrong_rank():
    msg = error_of(with_rows(one_f_one_b(2, 2), "0F0 0F1 0B0 0B1", "1F0 1B0 0F1 1B1"))
    assert "rank 1, step 2: 0F1 is on rank 1 but stage 0 lives on rank 0" in msg


def test_out_of_range_and_wrong_rank_count():
    assert "out of range" in error_of(with_rows(one_f_one_b(1, 1), "0F0 0B0 0F1"))
    assert "has 1 rank lists, expected n_ranks 2" in error_of(with_rows(one_f_one_b(2, 1), "0F0 0B0"))


def test_cyclic_wait_is_a_deadlock_naming_the_first_stuck_action():
    # rank 0 waits for 1B0 before sending 0F1; rank 1 waits for 0F1 before running 1B0
    msg = error_of(with_rows(one_f_one_b(2, 2), "0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"))
    assert "no rank can progress (deadlock)" in msg
    assert "rank 0, step 1: 0B0 waits for its input 1B0 (stage 1, microbatch 0) from rank 1" in msg
    assert "rank 1, step 1: 1F1 waits for its input 0F1 (stage 0, microbatch 1) from rank 0" in msg
    assert "back to rank 0, a cycle" in msg
    assert ">0B0<" in msg


def test_three_rank_deadlock_follows_the_chain():
    msg = error_of(
        with_rows(gpipe(3, 2), "0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1", "2F0 2F1 2B0 2B1")
    )
    assert "rank 0, step 1: 0B0 waits for its input 1B0" in msg
    assert "rank 1, step 1: 1F1 waits for its input 0F1" in msg


def test_out_of_order_microbatches_across_ranks_is_not_a_deadlock():
    validate(with_rows(one_f_one_b(2, 2), "0F0 0F1 0B1 0B0", "1F1 1B1 1F0 1B0"))


def test_explicit_idle_slots_are_allowed():
    validate(with_rows(one_f_one_b(2, 1), "0F0 . . 0B0", ". 1F0 1B0 ."))


# ---------------------------------------------------------------- communication


def test_communication_of_1f1b():
    ops = communication(one_f_one_b(2, 2))
    assert [str(op) for op in ops[0]] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"]
    assert [str(op) for op in ops[1]] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]
    assert ops[1][0] == Comm("recv", "act", 1, 0, 0, 0)


def test_every_send_has_its_matching_recv():
    for s in all_schedules(max_p=4, max_m=6):
        sends, recvs = Counter(), Counter()
        for rank, ops in communication(s).items():
            for op in ops:
                if isinstance(op, Comm):
                    key = (rank, op.peer, op.stage, op.peer_stage, op.tensor, op.microbatch)
                    (sends if op.op == "send" else recvs)[key] += 1
        matched = Counter({(src, dst, s1, s0, t, j): n for (dst, src, s0, s1, t, j), n in recvs.items()})
        assert sends == matched, s.name
        assert all(n == 1 for n in sends.values())


def test_zb_v_turns_around_on_the_last_rank_without_a_message():
    p, m = 3, 4
    ops = communication(zb_v(p, m))
    assert not [op for op in ops[p - 1] if isinstance(op, Comm) and {op.stage, op.peer_stage} == {p - 1, p}]
    sends = [op for rank_ops in ops.values() for op in rank_ops if isinstance(op, Comm) and op.op == "send"]
    # 2p stages have 2p-1 boundaries, one of them inside rank p-1; each carries one act and one grad per mb
    assert len(sends) == 2 * (2 * p - 2) * m


def test_communication_validates_first():
    with pytest.raises(ScheduleError, match="deadlock"):
        communication(with_rows(one_f_one_b(2, 2), "0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"))


# ---------------------------------------------------------------- grid


def test_format_grid_steps_as_rows_ranks_as_columns():
    grid = format_grid(with_rows(one_f_one_b(2, 1), "0F0 . 0B0", ". 1F0 1B0"), mark=(1, 2))
    lines = grid.splitlines()
    assert lines[0].split() == ["step", "rank", "0", "rank", "1"]
    assert lines[1].split() == ["0", "0F0", "."]
    assert lines[3].split() == ["2", "0B0", ">1B0<"]


def test_format_grid_of_a_mapping_and_a_window():
    grid = format_grid({0: ["0F0", None, "0B0"] * 10, 1: [None] * 30}, rows=(5, 7))
    lines = grid.splitlines()
    assert lines[1] == "  ..." and lines[-1] == "  ..."
    assert [line.split()[0] for line in lines[2:-1]] == ["5", "6", "7"]
