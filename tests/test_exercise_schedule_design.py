"""Lesson 10's open exercise, a schedule designed under a memory cap (parallel_lab.exercises.schedule_design):
the lesson's solution and a different correct design pass every case, simulated and on real ranks;
the stub is NOT YET without a process; a schedule over the cap, one short of the bubble, an invalid
one and one that raises each fail the case they fail, and the verdict counts the cases passed;
the library, its search included, is refused from the source; every target is one a search
reaches; every verdict is deterministic text."""

import pytest
from exercise_support import lesson_solution

from parallel_lab.exercises import REGISTRY, check_schedule_design
from parallel_lab.exercises.check import compile_answer
from parallel_lab.exercises.schedule_design import CASES, EXERCISE, design_case, judge_cases
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.search.api import search
from parallel_lab.runtime import launcher

SOLUTION = lesson_solution("10_schedule_search.py", "schedule-design")

# Another correct design: list scheduling by events (a heap of rank clocks) instead of time slots.
EVENTS = '''def my_schedule(p, m, cap):
    import heapq
    end = {}                          # (rank, kind, j) -> when it ends
    count = {(r, k): 0 for r in range(p) for k in "FIW"}
    memory = [0.0] * p
    out = [[] for _ in range(p)]
    clocks = [(0, r) for r in range(p)]
    heapq.heapify(clocks)
    while clocks:
        now, r = heapq.heappop(clocks)
        f, i, w = count[r, "F"], count[r, "I"], count[r, "W"]
        inp = 0 if r == 0 else end.get((r - 1, "F", f))
        grad = end.get((r, "F", i)) if r == p - 1 else end.get((r + 1, "I", i))
        if f < m and f - i < p - r and memory[r] + 1 <= cap + 1e-9 and inp is not None and inp <= now:
            kind, change = "F", 1.0
        elif i < f and grad is not None and grad <= now:
            kind, change = "I", -2 / 34
        elif w < i:
            kind, change = "W", -32 / 34
        elif w == m:
            continue                  # this rank is done
        else:
            heapq.heappush(clocks, (now + 1, r))   # wait one unit
            continue
        j = count[r, kind]
        count[r, kind] += 1
        memory[r] += change
        end[r, kind, j] = now + 1
        out[r].append(f"{r}{kind}{j}")
        heapq.heappush(clocks, (now + 1, r))
    return out
'''

# A rule by hand, no clock at all: ZB-H1's order with the warm-up and the W's held back trimmed to
# the cap. Right at ZB-H1's memory, too slow below it: one case of three.
TRIMMED = '''def my_schedule(p, m, cap):
    ranks = []
    for r in range(p):
        ahead = min(p - r, int(cap), m)  # forwards in flight before the first I
        hold = min(r, int((cap - ahead) * 34 / 32 + 1e-9))  # W's held back: each keeps 32/34
        actions = [f"{r}F{j}" for j in range(ahead - 1)]
        w = 0
        for k in range(m):
            if ahead - 1 + k < m:
                actions.append(f"{r}F{ahead - 1 + k}")
            actions.append(f"{r}I{k}")
            if k + 1 - w > hold:
                actions.append(f"{r}W{w}")
                w += 1
        actions += [f"{r}W{j}" for j in range(w, m)]
        ranks.append(actions)
    return ranks
'''

STUB = '''def my_schedule(p, m, cap):
    # YOUR CODE HERE
    raise NotImplementedError
'''

# Lesson 07's ZB-H1 order under this exercise's name and arguments.
ZB_H1 = lesson_solution("07_zero_bubble.py", "zb-h1-order").replace("def my_zb_h1(p, m):",
                                                                   "def my_schedule(p, m, cap):")

# GPipe's shape with full backwards, one micro-batch at a time: always under any cap >= 1, slow.
ONE_AT_A_TIME = '''def my_schedule(p, m, cap):
    return [[a for j in range(m) for a in (f"{r}F{j}", f"{r}B{j}")] for r in range(p)]
'''


def answer(source: str, p: int, m: int, cap: float) -> dict:
    """What the rank's harness would send back for one case (the answer run here, in the test)."""
    return {"ranks": compile_answer(source, "my_schedule")(p, m, cap)}


def judged(source: str, case) -> tuple[bool, list]:
    p, m, cap, target = case
    return design_case(answer(source, p, m, cap), p, m, cap, target)


# ----------------------------------------------------------------------------------------------
# Without processes.


def test_registered_with_what_it_forbids():
    assert REGISTRY["schedule-design"] is EXERCISE
    assert EXERCISE.policy.name == "my_schedule" and "search" in EXERCISE.forbids


def test_every_target_is_reached_by_the_library_search_and_missed_by_the_fixed_rule_below_it():
    """A target a search reaches under the same cap (so the case can be passed), and stricter than
    what the case's obvious fallback gives (so it asks for a design)."""
    for p, m, cap, target in CASES:
        found = search(p, m, cap)
        assert found.bubble_fraction <= target + 1e-9 and max(found.peak_rank_activations) <= cap
    passed, lines = judged(ONE_AT_A_TIME, CASES[0])
    assert not passed and "FAILED: bubble" in lines[0]


@pytest.mark.parametrize("source", [SOLUTION, EVENTS])
def test_both_designs_fit_every_cap_and_reach_every_bubble_in_the_simulator(source, monkeypatch):
    from parallel_lab.exercises import one_f_one_b

    def no_ranks(schedule, timeout):  # no real run: only the first three conditions are tested here
        return {"max_grad_diff": 1.0, "loss_diff": 0.0, "grad_diffs": {"(not run)": 1.0}}

    monkeypatch.setattr(one_f_one_b, "run_pipeline", no_ranks)  # every order exercise runs ranks there
    for case in CASES:
        passed, lines = judged(source, case)
        assert lines[0].endswith("FAILED on 4 real ranks: the loss or the gradients differ from the "
                                 "single-process model (first at parameter (not run))"), lines
    trimmed = [judged(TRIMMED, case) for case in CASES]
    assert "FAILED on 4 real ranks" in trimmed[0][1][0]
    assert [lines[0].split(": FAILED: ")[1][:10] for _, lines in trimmed[1:]] == ["bubble 36."] + ["bubble 54."]


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = EXERCISE.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["Your schedule: NOT YET: my_schedule still raises NotImplementedError; write your code "
                             "where it says # YOUR CODE HERE (and remove that raise), then run this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source, reason", [
    ("from parallel_lab.pipeline.search.api import search\n\n\ndef my_schedule(p, m, cap):\n"
     "    return search(p, m, cap).schedule.ranks\n",
     "imports parallel_lab.pipeline.search.api: the library's own implementation is not an answer"),
    ("import parallel_lab.pipeline.schedules as s\n\n\ndef my_schedule(p, m, cap):\n"
     "    return s.build('zb-h1', p, m).ranks\n", "imports parallel_lab.pipeline.schedules"),
    ("import os\n" + SOLUTION, "imports os: this exercise may import only"),
    ("def my_schedule(p, m, cap):\n    return eval('[]')\n", "uses eval"),
])
def test_the_library_and_other_shortcuts_are_refused_from_the_source(source, reason):
    before = launcher.pool_pids()
    verdict = EXERCISE.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("Your schedule: FAILED: your answer ")
    assert reason in verdict.lines[0]
    assert launcher.pool_pids() == before


def test_zb_h1_fits_its_own_memory_only():
    passed, lines = judged(ZB_H1, CASES[1])
    assert not passed and lines == [
        "schedule p=4, m=8, cap 3: FAILED: rank 0 holds up to 4 micro-batches of activations at once, over the cap 3 "
        "(counted until W: an I frees M_B − M_W, its W the rest); peak per rank [4, 3.941, 3.882, 3.824]: start fewer "
        "forwards before their backward, or run a pending W before the next F"]


def test_a_slow_schedule_fails_on_its_bubble_naming_the_target():
    passed, lines = judged(ONE_AT_A_TIME, CASES[2])
    assert not passed and lines == [
        "schedule p=4, m=8, cap 2: FAILED: bubble 75.0% with F = I = W = 1, the target is at most 41.5% (step 96, "
        "idle per rank [72, 72, 72, 72]); let no rank wait while it could run a forward the cap allows, an input "
        "gradient that has arrived, or a pending W"]


def test_an_invalid_schedule_fails_with_the_grid_marked_and_an_error_is_reported():
    backwards_first = SOLUTION.replace('orders[r].append(f"{r}{kind}{n[kind]}")',
                                       'orders[r].insert(0, f"{r}{kind}{n[kind]}")')
    passed, lines = judged(backwards_first, CASES[1])
    assert not passed and lines[0].startswith("schedule p=4, m=8, cap 3: FAILED: my_schedule: rank 3, step 0: 3W7 "
                                              "runs before its input 3I7")
    assert any(">3W7<" in line for line in lines[1:])
    assert design_case({"error": "ZeroDivisionError: division by zero"}, 4, 8, 3, 0.25) == (False, [
        "schedule p=4, m=8, cap 3: FAILED: my_schedule(4, 8, 3) raised ZeroDivisionError: division by zero"])


def test_the_generators_order_is_what_the_lesson_solution_gives_at_zb_h1s_memory():
    ranks = compile_answer(SOLUTION, "my_schedule")(4, 8, 4)
    assert ranks == [[str(a) for a in row] for row in build("zb-h1", 4, 8).ranks]


# ----------------------------------------------------------------------------------------------
# On real ranks.

ranks = pytest.mark.ranks

PASSED = [
    "schedule p=4, m=8, cap 4: PASSED: valid; peak per rank [4, 3.941, 3.882, 3.824] <= 4; bubble 11.1% <= 11.2%; "
    "on 4 real ranks: loss and gradients equal the single-process model, measured stash as simulated",
    "schedule p=4, m=8, cap 3: PASSED: valid; peak per rank [3, 3, 2.941, 2.882] <= 3; bubble 25.0% <= 25.0%; "
    "on 4 real ranks: loss and gradients equal the single-process model, measured stash as simulated",
    "schedule p=4, m=8, cap 2: PASSED: valid; peak per rank [2, 2, 2, 1.941] <= 2; bubble 41.5% <= 41.5%; "
    "on 4 real ranks: loss and gradients equal the single-process model, measured stash as simulated",
]


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_design_pass_every_case_on_real_ranks_deterministically():
    for source in (SOLUTION, EVENTS):
        verdict = EXERCISE.check(source)
        assert verdict.passed, verdict
        assert verdict.lines == PASSED


@ranks
@pytest.mark.timeout(300)
def test_partial_credit_counts_the_cases_passed():
    passed, lines, cases = judge_cases(ZB_H1)  # ZB-H1 fits its own memory only
    assert not passed and cases == (1, 3)
    assert lines[0] == PASSED[0] and "FAILED: rank 0 holds up to 4" in lines[1]
    verdict = EXERCISE.check(ZB_H1)
    assert verdict.lines == lines and verdict.cases == (1, 3)
    raises = "def my_schedule(p, m, cap):\n    return undefined_name if cap == 2 else [[]] * p\n"
    passed, lines, cases = judge_cases(raises)
    assert not passed and cases == (0, 3)
    assert ("schedule p=4, m=8, cap 2: FAILED: my_schedule(4, 8, 2) raised NameError: name 'undefined_name' is "
            "not defined") in lines


def my_schedule(p, m, cap):
    # YOUR CODE HERE
    raise NotImplementedError


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = check_schedule_design(my_schedule)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_schedule"):
        check_schedule_design(answer)
