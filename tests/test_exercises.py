"""Exercise checks: the answer's source is reviewed here, run only on fresh ranks that return raw
results, and judged here. Shortcuts fail with a reason; patches on a rank change nothing; a correct
answer written another way passes; every verdict is deterministic text."""

import ast
import inspect
import pickle
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from parallel_lab import exercises
from parallel_lab.course import tags
from parallel_lab.exercises import check, copies, policy
from parallel_lab.exercises.ring_all_reduce import EXERCISE as RING
from parallel_lab.runtime import demos, launcher, rank_process

RING_SOLUTION = '''import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(p))
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(2 * (p - 1)):
        send = (rank - step) % p if step < p - 1 else (rank + 1 - (step - (p - 1))) % p
        recv = (send - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=right)
        dist.recv(buffer, src=left)
        request.wait()
        if step < p - 1:
            chunks[recv] += buffer
        else:
            chunks[recv].copy_(buffer)
    return tensor
'''

# The same ring written differently: blocking send/recv ordered by parity (no isend), a helper
# function in the cell, and the result returned as a new tensor.
RING_BY_PARITY = '''import torch.distributed as d


def _exchange(out, into, rank, p):
    if rank % 2 == 0:
        d.send(out, (rank + 1) % p)
        d.recv(into, (rank - 1) % p)
    else:
        d.recv(into, (rank - 1) % p)
        d.send(out, (rank + 1) % p)


def my_ring_all_reduce(tensor):
    rank, p = d.get_rank(), d.get_world_size()
    parts = list(tensor.tensor_split(p))
    for step in range(p - 1):
        incoming = parts[(rank - step - 1) % p].clone()
        _exchange(parts[(rank - step) % p].clone(), incoming, rank, p)
        parts[(rank - step - 1) % p] += incoming
    for step in range(p - 1):
        incoming = parts[(rank - step) % p].clone()
        _exchange(parts[(rank + 1 - step) % p].clone(), incoming, rank, p)
        parts[(rank - step) % p].copy_(incoming)
    return tensor.clone()
'''

STUB = '''import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    # YOUR CODE HERE
    raise NotImplementedError
    return tensor
'''


def answer(body: str) -> str:
    return f"def my_ring_all_reduce(tensor):\n{body}\n"


# The library's ring (runtime.collectives.ring_all_reduce) as a student would copy it: every name
# changed, the layout changed, its comments and docstring gone, its helper written into the cell.
LIBRARY_RING_RENAMED = """
def _g(grp, r):
    return r if grp is None else dist.get_global_rank(grp, r)

def my_ring_all_reduce(t, g=None):
    me, n = dist.get_rank(g), dist.get_world_size(g)
    if n == 1: return t
    f = t.view(-1)
    parts = list(f.tensor_split(n))   # the chunks
    nxt, prv = _g(g, (me + 1) % n), _g(g, (me - 1) % n)
    buf = torch.empty_like(parts[0]) if parts[0].numel() else torch.empty(0, dtype=f.dtype)
    for s in range(2 * (n - 1)):
        red = s < n - 1
        si = (me - s) % n if red else (me + 1 - (s - n + 1)) % n
        ri = (si - 1) % n
        b = buf[: parts[ri].numel()]
        req = dist.isend(parts[si].contiguous(), dst=nxt, group=g)
        dist.recv(b, src=prv, group=g)
        req.wait()
        if red:
            parts[ri] += b
        else:
            parts[ri].copy_(b)
    return t
"""


class _Rename(ast.NodeTransformer):
    """Every identifier renamed (``x`` -> ``renamed_x``), annotations and docstrings dropped."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(f"renamed_{node.id}", node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = f"renamed_{node.arg}", None
        return node

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
        node.returns = None
        return node


def renamed_copy(spec: str, name: str) -> str:
    """The library function ``spec`` renamed to ``name``, every other name changed, laid out anew by
    ``ast.unparse`` (no comments, no docstring)."""
    module, _, qualname = spec.partition(":")
    obj = getattr(__import__(module, fromlist=[qualname]), qualname)
    tree = _Rename().visit(ast.parse(textwrap.dedent(inspect.getsource(obj))))
    tree.body[0].name = name
    return ast.unparse(ast.fix_missing_locations(tree))


def test_the_librarys_ring_renamed_and_reformatted_fails_naming_the_copy():
    verdict = RING.check(LIBRARY_RING_RENAMED)
    assert not verdict.passed and verdict.cases == (0, 0)
    assert verdict.lines == ["ring all-reduce: FAILED: your my_ring_all_reduce is a copy of the library's "
                             "collectives.ring_all_reduce (100% alike once names, layout, comments and "
                             "docstrings are set aside); write my_ring_all_reduce yourself"]
    edited = LIBRARY_RING_RENAMED.replace("        req.wait()\n", "        req.wait()\n        last = s\n")
    assert "is a copy of the library's collectives.ring_all_reduce (9" in RING.check(edited).lines[0]


@pytest.mark.parametrize("exercise", [e for e in exercises.REGISTRY.values() if e.copies], ids=lambda e: e.id)
def test_every_named_library_function_renamed_is_a_copy_and_the_lessons_solution_is_not(exercise):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import build_lessons

    for spec in exercise.copies:
        copied = copies.copy_of(renamed_copy(spec, exercise.name), exercise.copies)
        assert copied is not None and copied.ratio == 1.0, spec
    solutions = [build_lessons.solution_source(cell.source) for source in sorted(build_lessons.SOURCES.glob("*.py"))
                 for check_id, cell in tags.answer_cells(build_lessons.parse(source.read_text())).items()
                 if check_id == exercise.id]
    assert solutions, f"no lesson answers {exercise.id}"
    for solution in solutions:
        assert copies.copy_of(solution, exercise.copies) is None


def test_copies_are_compared_after_normalising_names_layout_comments_and_docstrings():
    a = 'def f(x, y):\n    """Add."""\n    z = x + y  # sum\n    return z.clone()\n'
    b = "def g(p,q):\n  r=p+q\n  return r.clone()"
    assert copies.tokens(a) == copies.tokens(b)
    assert copies.tokens(a) != copies.tokens(b.replace("clone", "detach"))  # attributes are kept
    assert copies.tokens(a) != copies.tokens(b.replace("+", "-"))  # and operators
    assert copies.similarity(copies.tokens(RING_SOLUTION), copies.tokens(RING_BY_PARITY)) < 0.8
    assert copies.copy_of(RING_SOLUTION, RING.copies) is None and copies.copy_of(RING_BY_PARITY, RING.copies) is None


# ----------------------------------------------------------------------------------------------
# Review: from the source alone, before any process starts.


@pytest.mark.parametrize("source,reason", [
    (answer("    dist.all_reduce(tensor)\n    return tensor"),
     "uses dist.all_reduce; this exercise builds it from isend/recv"),
    (answer("    torch.distributed.all_reduce(tensor)\n    return tensor"), "uses dist.all_reduce"),
    ("from torch.distributed import all_reduce\n" + answer("    all_reduce(tensor)\n    return tensor"),
     "uses dist.all_reduce"),
    ("from parallel_lab.runtime.collectives import ring_all_reduce\n" + answer("    return ring_all_reduce(tensor)"),
     "imports parallel_lab.runtime.collectives: the library's own implementation is not an answer"),
    ("import parallel_lab\n" + answer("    return tensor"), "imports parallel_lab"),
    ("import os\n" + answer("    return tensor"), "imports os: this exercise may import only torch"),
    (answer("    f = getattr(dist, 'all_' + 'reduce')\n    f(tensor)\n    return tensor"), "uses getattr"),
    (answer("    dist.__dict__['all_reduce'](tensor)\n    return tensor"), "uses __dict__"),
    ("import torch\ntorch.equal = lambda a, b: True\n" + answer("    return tensor"), "changes torch.equal"),
    (answer("    dist.isend = dist.send\n    return tensor"), "changes dist.isend"),
    ("def ring(tensor):\n    return tensor\n", "defines no my_ring_all_reduce"),
    (answer("    return tensor +"), "does not compile"),
])
def test_shortcuts_are_refused_from_the_source_with_a_reason(source, reason):
    verdict = RING.check(source)
    assert not verdict.passed and verdict.lines[0].startswith("ring all-reduce: FAILED: your answer ")
    assert reason in verdict.lines[0]


def test_the_stub_is_not_yet_without_starting_a_process():
    before = launcher.pool_pids()
    verdict = RING.check(STUB)
    assert not verdict.passed and verdict.not_yet
    assert verdict.lines == ["ring all-reduce: NOT YET: my_ring_all_reduce still raises NotImplementedError; "
                             "write your code where it says # YOUR CODE HERE (and remove that raise), then run "
                             "this cell again"]
    assert launcher.pool_pids() == before


@pytest.mark.parametrize("source,stub", [
    ("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError\n", True),
    ("def f(x):\n    \"\"\"Doc.\"\"\"\n    y = x + 1  # given\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
     "    return y\n", True),
    ("def f(p):\n    out = []\n    for r in range(p):\n        # YOUR CODE HERE\n        raise NotImplementedError\n"
     "        out.append(r)\n    return out\n", True),
    ("def f(x):\n    if x > 0:\n        return x\n    else:\n        raise NotImplementedError('x <= 0')\n", False),
    ("def f(x):\n    try:\n        return 1 / x\n    except ZeroDivisionError:\n"
     "        raise NotImplementedError\n", False),
    ("def f(x):\n    return x\n    raise NotImplementedError\n", False),
    ("def f(x):\n    raise ValueError('no')\n", False),
    ("class f:\n    @staticmethod\n    def forward(ctx, x):\n        return x\n\n    @staticmethod\n"
     "    def backward(ctx, g):\n        # YOUR CODE HERE\n        raise NotImplementedError\n", True),
    ("class f:\n    @staticmethod\n    def forward(ctx, x):\n        if x is None:\n"
     "            raise NotImplementedError\n        return x\n", False),
    ("def g(x):\n    raise NotImplementedError\n\n\ndef f(x):\n    return g(x) if x else x\n", False),
], ids=["stub", "given-code-around", "in-a-loop", "else-branch", "except", "after-return", "other-error",
        "class-one-method-left", "class-guard", "another-function"])
def test_a_stub_is_a_raise_every_call_reaches_not_any_raise(source, stub):
    assert check.is_stub(source, "f") is stub


def test_a_verdicts_reason_is_the_line_made_as_a_failure_whatever_its_words():
    """Verdict.reason is found by what a line is (``check.failure``), not by the words FAILED / NOT YET
    or their translation: a verdict in any language, or one whose passing line quotes such a word."""
    wrong = check.failure("環狀 all-reduce，4 個 rank：答錯了")
    verdict = check.Verdict(False, ["環狀 all-reduce，2 個 rank：正確", wrong, "  第 1 個 rank：得到 [0]，應為 [1]"])
    assert verdict.reason == "環狀 all-reduce，4 個 rank：答錯了" and type(verdict.reason) is str
    quoting = check.Verdict(False, ["x on 2 ranks: PASSED (your FAILED flag was ignored)", check.failure("x on 4: no")])
    assert quoting.reason == "x on 4: no"
    assert check.Verdict(False, ["a line nobody marked"]).reason == "a line nobody marked"
    assert check.Verdict(True, ["x: PASSED"]).reason == ""


def test_a_rank_cannot_send_back_anything_but_plain_data():
    assert rank_process.plain_loads(pickle.dumps({"a": [1, 2.5, "x", None, (3,)]})) == {"a": [1, 2.5, "x", None, (3,)]}
    with pytest.raises(pickle.UnpicklingError, match="a rank sent torch._utils._rebuild_tensor_v2"):
        rank_process.plain_loads(pickle.dumps(torch.ones(2)))

    class Evil:
        def __reduce__(self):
            return (print, ("this would run in the checking process",))
    with pytest.raises(pickle.UnpicklingError, match="builtins.print, which is not plain data"):
        rank_process.plain_loads(pickle.dumps(Evil()))


def test_policy_names_what_it_allows():
    p = policy.Policy("f", dist=("isend",), builds="it from isend")
    assert policy.review("def f():\n    dist.recv(x)\n", p) == \
        "uses dist.recv; this exercise builds it from isend (allowed: dist.isend)"
    assert policy.review("import math\ndef f():\n    return math.pi\n", p) is None
    assert check.is_stub("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError\n", "f")
    assert not check.is_stub("def f():\n    raise ValueError('no')\n", "f")


# ----------------------------------------------------------------------------------------------
# On real ranks.

ranks = pytest.mark.ranks


@ranks
@pytest.mark.timeout(300)
def test_the_solution_and_a_different_correct_ring_pass_on_2_and_4_ranks():
    for source in (RING_SOLUTION, RING_BY_PARITY):
        verdict = RING.check(source)
        assert verdict.passed, verdict
        assert verdict.lines == [
            "ring all-reduce on 2 ranks: PASSED (5/5 cases; send/recv only, 2(p−1)/p of the tensor per rank)",
            "ring all-reduce on 4 ranks: PASSED (5/5 cases; send/recv only, 2(p−1)/p of the tensor per rank)"]


@ranks
@pytest.mark.timeout(300)
def test_the_library_ring_passes_the_judge_students_rings_face():
    # collectives.ring_all_reduce (lesson 01's reference, timed by calibration's "ring") judged as an
    # answer: the policy would refuse the import, the judge checks values, send/recv only and bytes.
    library = "from parallel_lab.runtime.collectives import ring_all_reduce as my_ring_all_reduce"
    passed, lines, cases = RING.judge(library)
    assert passed and cases == (10, 10), lines


@ranks
@pytest.mark.timeout(300)
def test_a_wrong_ring_fails_with_the_first_wrong_case_and_expected_against_actual():
    forgets_to_gather = answer('''    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.tensor_split(p))
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=(rank + 1) % p)
        dist.recv(buffer, src=(rank - 1) % p)
        request.wait()
        chunks[recv] += buffer
    return tensor''')
    verdict = RING.check(forgets_to_gather)
    assert not verdict.passed
    assert verdict.lines[0].startswith("ring all-reduce on 2 ranks: FAILED (0/5 cases): tensor of 1 element: rank 0: "
                                       "got [")
    assert verdict.cases == (0, 10)
    assert ", expected [" in verdict.lines[0]
    assert verdict == RING.check(forgets_to_gather)  # deterministic


@ranks
@pytest.mark.timeout(300)
def test_a_ring_that_sends_the_whole_tensor_around_fails_on_the_bytes():
    """Right sums, wrong algorithm: p-1 steps that each pass the whole running sum around."""
    naive = answer('''    rank, p = dist.get_rank(), dist.get_world_size()
    total, passing = tensor.clone(), tensor.clone()
    for _ in range(p - 1):
        incoming = torch.empty_like(passing)
        request = dist.isend(passing, dst=(rank + 1) % p)
        dist.recv(incoming, src=(rank - 1) % p)
        request.wait()
        total += incoming
        passing = incoming
    tensor.copy_(total)
    return tensor''')
    verdict = RING.check(naive)
    assert not verdict.passed and verdict.lines[0].startswith("ring all-reduce on 2 ranks: PASSED")  # p = 2: alike
    assert verdict.cases == (5, 10)  # p = 2's five cases pass
    assert verdict.lines[1] == ("ring all-reduce on 4 ranks: FAILED (0/5 cases): tensor of 1 element: the ranks "
                                "sent 96 bytes in all; a ring sends 2(p−1)·n = 48 bytes (2(p−1)/p of the tensor per "
                                "rank): reduce-scatter then all-gather, one chunk per step")


@ranks
@pytest.mark.timeout(300)
def test_patching_torch_on_a_rank_does_not_change_the_comparison():
    """The review misses an alias; the rank's torch.equal is patched; the comparison happens in the
    checking process all the same."""
    patched = "t = torch\nt.equal = lambda a, b: True\n" + answer("    return tensor")
    verdict = RING.check(patched)
    assert not verdict.passed and "FAILED (0/5 cases): tensor of 1 element: rank 0: got [" in verdict.lines[0]


@ranks
@pytest.mark.timeout(300)
def test_errors_and_hangs_on_a_rank_become_failed_lines(monkeypatch):
    raises = RING.check(answer("    return tensor + undefined_name"))
    assert raises.lines[0] == ("ring all-reduce on 2 ranks: FAILED: rank 0 raised NameError: "
                               "name 'undefined_name' is not defined\n"
                               "  your answer, line 2, in my_ring_all_reduce: return tensor + undefined_name")
    from parallel_lab import i18n

    with i18n.using("zh-Hant"):  # what the rank raised, said once, from the error's own message
        first = RING.check(answer("    return tensor + undefined_name")).lines[0].splitlines()[0]
    assert first.endswith("引發 NameError：name 'undefined_name' is not defined") and first.count("引發") == 1, first
    monkeypatch.setenv("PARALLEL_LAB_CHECK_TIMEOUT", "3")
    waits = RING.check(answer("    buffer = torch.empty_like(tensor)\n"
                              "    dist.recv(buffer, src=(dist.get_rank() - 1) % dist.get_world_size())\n"
                              "    return buffer"))
    assert not waits.passed
    assert waits.lines[0].startswith("ring all-reduce on 2 ranks: FAILED: did not finish within 3 s")
    assert "rank 0: recv(src=1, shape=(1,), dtype=float64)" in waits.lines[0]
    assert launcher.run(demos.rank_id, 2) == [0, 1]  # the next call works


# ----------------------------------------------------------------------------------------------
# The notebook's entry point: the same check, on the cell that defines the function.


def my_ring_all_reduce(tensor):
    # YOUR CODE HERE
    raise NotImplementedError


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_an_answer_raising_not_implemented_error_on_its_ranks_fails_that_run_not_yet_nothing():
    """Written, not the stub (its raise is under an if): on 4 ranks it refuses, and that run fails with
    the rank's error and the answer's line, while the 2-rank run counts its cases."""
    refusing = RING_SOLUTION.replace("def my_ring_all_reduce(tensor):\n", "def my_ring_all_reduce(tensor):\n"
                                     "    if dist.get_world_size() == 4:\n"
                                     "        raise NotImplementedError('two ranks only')\n", 1)
    assert refusing != RING_SOLUTION and not check.is_stub(refusing, "my_ring_all_reduce")
    verdict = RING.check(refusing)
    assert not verdict.passed and not verdict.not_yet, str(verdict)
    assert verdict.lines[0].startswith("ring all-reduce on 2 ranks: PASSED")
    assert verdict.reason.startswith("ring all-reduce on 4 ranks: FAILED: rank 0 raised NotImplementedError: two "
                                     "ranks only\n  your answer, line 7, in my_ring_all_reduce: raise "), verdict.reason
    assert 0 < verdict.cases[0] < verdict.cases[1]


def test_the_notebook_check_reads_the_function_and_prints_the_verdict(capsys):
    verdict = exercises.check_ring_all_reduce(my_ring_all_reduce)
    assert verdict.not_yet and capsys.readouterr().out == str(verdict) + "\n"
    with pytest.raises(TypeError, match="pass the function you wrote, my_ring_all_reduce"):
        exercises.check_ring_all_reduce(demos.rank_id)
    with pytest.raises(TypeError, match="pass the"):
        exercises.check_ring_all_reduce(42)


def test_every_exercise_is_registered_with_what_it_forbids():
    assert set(exercises.REGISTRY) == {"ring-all-reduce", "row-parallel-forward", "g-operator", "one-f-one-b",
                                       "zb-h1-order", "balanced-cut", "mesh-groups", "device-memory",
                                       "lse-merge", "zero2-step", "moe-dispatch", "schedule-design", "capstone",
                                       "bubble-share", "hand-schedule"}
    for exercise in exercises.REGISTRY.values():
        assert exercise.forbids and exercise.policy.name


@ranks
@pytest.mark.timeout(300)
def test_a_verdict_counts_the_cases_that_pass():
    """A 1F1B order that forgets min(·, m) in its warm-up is wrong only when m < p: 2 of 3 cases."""
    from parallel_lab.exercises.one_f_one_b import EXERCISE as ONE_F_ONE_B

    forgets = """def my_one_f_one_b(p, m):
    ranks = []
    for r in range(p):
        warm = p - r - 1
        f = [f"{r}F{i}" for i in range(m)]
        b = [f"{r}B{i}" for i in range(m)]
        order = f[:warm]
        for i in range(m - warm):
            order += [f[warm + i], b[i]]
        ranks.append(order + b[m - warm:])
    return ranks
"""
    verdict = ONE_F_ONE_B.check(forgets)
    assert not verdict.passed and verdict.cases == (2, 3)
    assert [line.split(":")[0] for line in verdict.lines if "PASSED" in line] == ["1F1B p=2, m=3", "1F1B p=4, m=8"]
