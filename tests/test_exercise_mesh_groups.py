"""Lesson 11's exercise, the dp/pp/tp groups of a mesh (parallel_lab.exercises.mesh_groups): the
checker's own reference agrees with the library's mesh; a correct answer written two ways passes on
real ranks, with an all-reduce over each of its groups; the stub is NOT YET without a process; wrong
groups fail naming the rank, its group and the right one; answers of the wrong shape fail with a
reason instead of crashing; the library's mesh and torch.distributed are refused from the source."""

import pytest
from exercise_support import lesson_solution

from parallel_lab.exercises import REGISTRY, check_mesh_groups
from parallel_lab.exercises.mesh_groups import CASES, EXERCISE, WORLD, expected_group, judge_case, plain_groups
from parallel_lab.i18n import translations, using
from parallel_lab.runtime import demos, launcher
from parallel_lab.runtime.mesh import ParallelDims

SOLUTION = lesson_solution("11_3d_parallelism.py", "mesh-groups")

# The same groups another way: picotron's grid, each axis moved last, rows read off as tensors, and
# the groups of each axis listed in an order of their own (last group first).
WITH_TORCH = '''import torch


def my_mesh_groups(dp, pp, tp):
    grid = torch.arange(dp * pp * tp).view(dp, pp, tp)
    out = {}
    for axis, order in (("dp", (1, 2, 0)), ("pp", (0, 2, 1)), ("tp", (0, 1, 2))):
        rows = grid.permute(*order).reshape(-1, grid.shape[order[-1]])
        out[axis] = list(rows.flip(0))
    return out
'''

STUB = '''def my_mesh_groups(dp, pp, tp):
    """{"dp": [...], "pp": [...], "tp": [...]}"""
    # YOUR CODE HERE
    raise NotImplementedError
'''

ON_RANKS = "an all-reduce of 2^rank over each summed exactly its members"
AS_LISTS = "each the ranks that share the other two coordinates"
PASSED = [
    f"mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: PASSED (4 dp, 2 pp, 2 tp groups; {ON_RANKS})",
    f"mesh groups dp 2 × pp 1 × tp 2 on 4 ranks: PASSED (2 dp, 4 pp, 2 tp groups; {ON_RANKS})",
    f"mesh groups dp 2 × pp 2 × tp 1 on 4 ranks: PASSED (2 dp, 2 pp, 4 tp groups; {ON_RANKS})",
    f"mesh groups dp 2 × pp 2 × tp 2 (8 ranks, as lists): PASSED (4 dp, 4 pp, 4 tp groups; {AS_LISTS})",
    f"mesh groups dp 2 × pp 3 × tp 4 (24 ranks, as lists): PASSED (12 dp, 8 pp, 6 tp groups; {AS_LISTS})",
]


def answer(body: str) -> str:
    return f"def my_mesh_groups(dp, pp, tp):\n{body}\n"


def groups_of(source: str, dp: int, pp: int, tp: int) -> dict:
    """What an answer returns, run here (tests only: a check never runs an answer in its own process)."""
    namespace = {}
    exec(source, namespace)
    return namespace["my_mesh_groups"](dp, pp, tp)


def right(dp, pp, tp):
    return plain_groups(groups_of(SOLUTION, dp, pp, tp))


def found(dp, pp, tp):
    """What every rank's all-reduces sum for the right groups."""
    return [{axis: expected_group(axis, r, dp, pp, tp) for axis in ("dp", "pp", "tp")} for r in range(dp * pp * tp)]


# ----------------------------------------------------------------------------------------------
# The reference and the judge, without ranks.


@pytest.mark.parametrize("dp,pp,tp", [(2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1), (3, 2, 1), (1, 1, 1)])
def test_the_checkers_reference_is_the_librarys_mesh(dp, pp, tp):
    dims = ParallelDims(dp, pp, tp)
    for axis in ("dp", "pp", "tp"):
        for rank in range(dims.world_size):
            assert expected_group(axis, rank, dp, pp, tp) == dims.group_of(axis, rank)
    assert right(dp, pp, tp) == {axis: dims.groups(axis) for axis in ("dp", "pp", "tp")}


def test_the_cases_cover_every_axis_on_ranks_and_three_axes_as_lists_and_the_exercise_is_registered():
    on_ranks = [case for case in CASES if case[0] * case[1] * case[2] == WORLD]
    assert WORLD <= 4 and len(on_ranks) == 3 and {case.index(1) for case in on_ranks} == {0, 1, 2}
    assert (2, 2, 2) in CASES and any(len(set(case)) == 3 and 1 not in case for case in CASES)
    assert REGISTRY["mesh-groups"] is EXERCISE and "runtime.mesh" in EXERCISE.forbids


@pytest.mark.parametrize("value,reason", [
    ([[0, 1], [2, 3]], "returned a list, not a dict {'dp': [...], 'pp': [...], 'tp': [...]} of the groups"),
    (None, "returned a NoneType, not a dict"),
    ({"dp": [], "tp": []}, "returned a dict without 'pp': give the groups of every axis, dp, pp and tp"),
    ({"dp": [], "pp": [], "tp": [], "ep": []}, "returned a dict with 'ep' besides 'dp', 'pp' and 'tp'"),
    ({"dp": 3, "pp": [], "tp": []}, "returned 3 (a int) for 'dp': give a list of groups, each a list of ranks"),
    ({"dp": [0, 1], "pp": [], "tp": []}, "returned 0 (a int) as one of the dp groups: each group is a list of ranks"),
    ({"dp": [["0", "1"]], "pp": [], "tp": []},
     "returned '0' (a str) in a dp group: a group lists ranks, which are ints"),
    ({"dp": [[0.0, 1.0]], "pp": [], "tp": []}, "returned 0.0 (a float) in a dp group"),
    ({"dp": [[True]], "pp": [], "tp": []}, "returned a bool in a dp group"),
])
def test_an_answer_of_the_wrong_shape_fails_with_a_reason(value, reason):
    wrong = plain_groups(value)
    assert isinstance(wrong, str) and wrong.startswith(reason), wrong
    assert judge_case(2, 2, 2, {"wrong": wrong}, found(2, 2, 2)) == f"my_mesh_groups(2, 2, 2) {wrong}"


@pytest.mark.parametrize("change,reason", [
    (lambda g: g["dp"].append([]), "the dp groups include an empty one, []"),
    (lambda g: g["pp"][0].append(8), "the pp group [0, 2, 8] holds rank 8, but the ranks are 0..7"),
    (lambda g: g["tp"][1].append(0), "the tp group [2, 3, 0] and the tp group [0, 1] both hold rank 0: each "
                                     "rank belongs to exactly one group of each axis"),
    (lambda g: g["tp"][0].append(1), "the tp group [0, 1, 1] lists rank 1 twice"),
    (lambda g: g["dp"].pop(), "rank 3 is in no dp group: each rank belongs to exactly one group of each axis"),
    (lambda g: g["pp"][3].reverse(), "the pp group [7, 5] is out of order: list it by pp coordinate, [5, 7] "
                                     "(member i of a group is the one at pp coordinate i)"),
])
def test_groups_that_do_not_split_the_ranks_or_are_out_of_order_fail_with_a_reason(change, reason):
    groups = right(2, 2, 2)
    change(groups)
    assert judge_case(2, 2, 2, {"groups": groups}, found(2, 2, 2)).startswith(reason)


def test_the_judge_compares_what_the_all_reduces_summed_too():
    """A rank whose all-reduce summed other ranks than the listed group (a rank that lies, or a group
    created differently) fails even when the listed groups are right."""
    sums = found(2, 2, 2)
    sums[5]["pp"] = [5]
    assert judge_case(2, 2, 2, {"groups": right(2, 2, 2)}, sums) == \
        "rank 5's all-reduce over its pp group [5, 7] summed the values of ranks [5]"
    sums[5] = {}
    assert "summed the values of no group" in judge_case(2, 2, 2, {"groups": right(2, 2, 2)}, sums)
    assert judge_case(2, 2, 2, {"groups": right(2, 2, 2)}, found(2, 2, 2)) is None


# ----------------------------------------------------------------------------------------------
# Review: from the source alone, before any process starts.


@pytest.mark.parametrize("source,reason", [
    ("from parallel_lab.runtime.mesh import ParallelDims\n"
     + answer("    dims = ParallelDims(dp, pp, tp)\n    return {a: dims.groups(a) for a in ('dp', 'pp', 'tp')}"),
     "imports parallel_lab.runtime.mesh: the library's own implementation is not an answer; write my_mesh_groups "
     "yourself"),
    ("import parallel_lab.runtime.mesh as mesh\n" + answer("    return mesh"), "imports parallel_lab.runtime.mesh"),
    (answer("    from parallel_lab.runtime import mesh\n    return mesh"), "imports parallel_lab.runtime"),
    (answer("    dist.new_group([0, 1])\n    return {}"),
     "uses dist.new_group; this exercise builds the groups as lists of ranks, by arithmetic; the check creates them "
     "on the ranks (allowed: nothing from torch.distributed)"),
    ("import torch.distributed as d\n" + answer("    return {'world': d.get_world_size()}"),
     "uses dist.get_world_size"),
    (answer("    torch.distributed.get_rank()\n    return {}"), "uses dist.get_rank"),
    ("from torch.distributed import new_group\n" + answer("    return {}"), "uses dist.new_group"),
    ("import os\n" + answer("    return {}"), "imports os: this exercise may import only torch, math, itertools"),
    (answer("    return getattr(torch, 'x')"), "uses getattr"),
    ("def groups(dp, pp, tp):\n    return {}\n", "defines no my_mesh_groups"),
])
def test_shortcuts_are_refused_from_the_source_with_a_reason(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("mesh groups: FAILED: your answer ")
    assert reason in verdict.lines[0], verdict.lines[0]
    assert launcher.pool_pids() == before


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["mesh groups: NOT YET: my_mesh_groups still raises NotImplementedError; write your "
                             "code where it says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


def my_mesh_groups(dp, pp, tp):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_mesh_groups(my_mesh_groups)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_mesh_groups"):
        check_mesh_groups(right)


# ----------------------------------------------------------------------------------------------
# On real ranks: 4 and 8.

ranks = pytest.mark.ranks


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_correct_answer_pass():
    assert groups_of(WITH_TORCH, 2, 2, 2)["tp"][0].tolist() == [6, 7]  # a tensor per group, in its own order
    for source in (SOLUTION, WITH_TORCH):
        verdict = EXERCISE.check(source)
        assert verdict.passed and verdict.lines == PASSED, verdict


@ranks
@pytest.mark.timeout(300)
def test_swapped_axes_fail_naming_the_rank_its_group_and_the_right_one():
    swapped = SOLUTION.replace('"dp": [[rank(d, p, t) for d in', '"xx": [[rank(d, p, t) for d in') \
        .replace('"pp": [[rank(d, p, t) for p in', '"dp": [[rank(d, p, t) for p in').replace('"xx"', '"pp"')
    verdict = EXERCISE.check(swapped)
    assert not verdict.passed
    assert verdict.lines[0] == ("mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: the dp group of rank 0 is "
                                "[0, 2], should be [0]: the ranks that share its pp and tp coordinates (pp 0, tp 0)")
    assert verdict.lines[3] == ("mesh groups dp 2 × pp 2 × tp 2 (8 ranks, as lists): FAILED: the dp group of rank "
                                "0 is [0, 2], should be [0, 4]: the ranks that share its pp and tp coordinates "
                                "(pp 0, tp 0)")
    assert verdict == EXERCISE.check(swapped)  # deterministic

    # dp fastest instead of tp: right on no mesh with two axes of size 2 or more
    dp_fastest = answer('''    def rank(d, p, t):
        return d + dp * (p + pp * t)
    return {"dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)]}''')
    verdict = EXERCISE.check(dp_fastest)
    assert not verdict.passed and all(": FAILED: " in line for line in verdict.lines)
    assert verdict.lines[0] == ("mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: the pp group of rank 0 is "
                                "[0, 1], should be [0, 2]: the ranks that share its dp and tp coordinates (dp 0, tp 0)")


@ranks
@pytest.mark.timeout(300)
def test_the_lessons_printed_groups_and_answers_of_the_wrong_shape_fail_without_a_crash():
    printed = answer('    return {"dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],\n'
                     '            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]]}')
    verdict = EXERCISE.check(printed)
    assert not verdict.passed and verdict.lines[3] == PASSED[3]
    assert verdict.lines[0] == ("mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: the dp group [0, 4] holds "
                                "rank 4, but the ranks are 0..3")
    assert verdict.lines[4] == ("mesh groups dp 2 × pp 3 × tp 4 (24 ranks, as lists): FAILED: rank 8 is in no dp "
                                "group: each rank belongs to exactly one group of each axis")

    a_list = EXERCISE.check(answer("    return [[r] for r in range(dp * pp * tp)]"))
    assert a_list.lines[0] == ("mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: my_mesh_groups(1, 2, 2) "
                               "returned a list, not a dict {'dp': [...], 'pp': [...], 'tp': [...]} of the groups "
                               "along each axis")
    raises = EXERCISE.check(answer("    return {'dp': [], 'pp': [], 'tp': [[r] for r in range(8 // (dp - 1))]}"))
    assert raises.lines[0] == ("mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: my_mesh_groups(1, 2, 2) raised "
                               "ZeroDivisionError: integer division or modulo by zero\n  your answer, line 2, in "
                               "my_mesh_groups: return {'dp': [], 'pp': [], 'tp': [[r] for r in range(8 // (dp - 1))]}")
    assert raises.lines[1] == "mesh groups dp 2 × pp 1 × tp 2 on 4 ranks: FAILED: rank 0 is in no dp group: each " \
                              "rank belongs to exactly one group of each axis"
    broken = EXERCISE.check(answer("    return undefined_name"))
    assert broken.lines[0].splitlines()[0] == (
        "mesh groups dp 1 × pp 2 × tp 2 on 4 ranks: FAILED: my_mesh_groups(1, 2, 2) raised NameError: name "
        "'undefined_name' is not defined")
    assert launcher.run(demos.rank_id, 2) == [0, 1]  # the next run works


@ranks
@pytest.mark.timeout(300)
def test_the_reason_worded_on_a_rank_is_in_the_lessons_language():
    # plain_groups runs on rank 0 beside the answer: its reason comes back in the language of the check
    zh = translations("zh-Hant").gettext
    with using("zh-Hant"):
        a_list = EXERCISE.check(answer("    return [[r] for r in range(dp * pp * tp)]"))
    reason = zh("returned {value}, not a dict {{'dp': [...], 'pp': [...], 'tp': [...]}} of the groups along each "
                "axis").format(value=zh("a {type}").format(type="list"))
    assert reason != "returned a list, not a dict {'dp': [...], 'pp': [...], 'tp': [...]} of the groups along each axis"
    assert a_list.lines[0].endswith("my_mesh_groups(1, 2, 2) " + reason)
