"""The check mechanism: an answer's source in, a deterministic verdict out, computed out of its reach.

    EXERCISE.check(source)          # -> Verdict; what the grader calls in a fresh, sandboxed process
    check_ring_all_reduce(my_fn)    # in a notebook: the same check on the cell that defines my_fn

How a check keeps the student's code away from its own verdict:

1. **Review** (``exercises.policy``, ``exercises.copies``): the answer's source is read, never run,
   in the checking process; a copy of the library's own implementation (renamed, reformatted), an
   import of the library, a collective the exercise forbids, reflection or a patch of torch is
   refused with a reason the student can act on.
2. **Run, on ranks only**: the source is compiled and run on fresh rank processes
   (``launcher.run(..., untrusted=True)``: a pool of its own, discarded afterwards, whose answers are
   read as plain data only, so a rank cannot send an object that runs code here). A rank's harness
   (trusted code of this package) feeds the answer inputs the checker can recompute, records what it
   sent (``runtime.commlog``) and returns raw results: numbers, lists, strings.
3. **Judge, here**: the checking process recomputes the expected values itself and compares. Patching
   torch or the library on a rank changes nothing here.

The verdict is deterministic text (no timings, no addresses): nbval compares it in the lessons, and
the grader's feedback quotes it. It also counts the cases the judge tried and how many passed
(``Verdict.cases``), which a grading policy with partial credit turns into points. A stub (the
lesson's ``# YOUR CODE HERE`` / ``raise NotImplementedError``, which every call still reaches:
``is_stub``) gets the "not yet" verdict without starting a process; a written answer that raises
NotImplementedError itself, for a case it does not handle, fails like any wrong answer.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import re
import textwrap
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from parallel_lab.exercises.copies import copy_of
from parallel_lab.exercises.policy import Policy, review
from parallel_lab.i18n import _, ngettext
from parallel_lab.runtime import launcher

CHECK_TIMEOUT = 20.0  # seconds for one run of an answer on its ranks
STUB = "# YOUR CODE HERE\nraise NotImplementedError"


class Failure(str):
    """A verdict line that says why a check did not pass (``failure(line)``, where the line is made):
    a verdict's ``reason`` is its first, found by what the line is, never by the words in it (which
    are the student's language)."""


def failure(line: str) -> Failure:
    """``line``, marked as one that says why the check failed (``Verdict.reason``)."""
    return Failure(line)


@dataclass
class Verdict:
    """The outcome of one check: ``passed``, the lines printed for the student, ``not_yet`` when
    the answer is still the stub, and ``cases``: (cases passed, cases tried) -- (0, 0) when nothing
    was tried (the answer was refused from its source, or is the stub). ``reason``: the first of its
    lines made as a ``failure``."""

    passed: bool
    lines: list
    not_yet: bool = False
    cases: tuple = (0, 0)

    def __str__(self):
        return "\n".join(self.lines)

    @property
    def reason(self) -> str:
        """Why the check did not pass ("" when it passed): the first line made as a ``failure``, else
        the first line. A plain str, so that it travels as data (the checker's record)."""
        if self.passed:
            return ""
        first = self.lines[0] if self.lines else ""
        return str(next((line for line in self.lines if isinstance(line, Failure)), first))


Judged = tuple  # (passed, lines, (cases passed, cases tried)): what a judge returns; (passed, lines) is one case


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``id`` (its check's tag in the lesson, ``check:<id>``), ``label`` (how verdicts
    name it), ``policy`` (what its answer must define and may use), ``judge(source)`` -> whether it
    passes, the verdict lines and (cases passed, cases tried) (the dynamic part: ranks run, this
    process compares), and ``copies``: the library's own implementations of what the exercise asks
    for (``"parallel_lab.<module>:<qualname>"``), which an answer may not copy (``exercises.copies``)."""

    id: str
    label: str
    policy: Policy
    judge: Callable[[str], Judged]
    forbids: str = ""
    copies: tuple = ()

    @property
    def name(self) -> str:
        return self.policy.name

    def screen(self, source: str) -> Verdict | None:
        """The verdict that needs no process (the answer is refused, or still the stub), or None.
        Reads the source only: safe in any process, the grader's included."""
        copied = copy_of(source, self.copies)
        if copied:
            return Verdict(False, [failure(_("{label}: FAILED: your {defined} is a copy of the library's {copied} "
                                             "({percent} alike once names, layout, comments and docstrings are set "
                                             "aside); write {name} yourself").format(
                label=str(self.label), defined=copied.defined, copied=copied.library_name, name=self.name,
                percent=f"{copied.ratio:.0%}"))])
        reason = review(source, self.policy)
        if reason:
            return Verdict(False, [failure(_("{label}: FAILED: your answer {reason}").format(
                label=str(self.label), reason=reason))])
        if is_stub(source, self.name):
            return self.not_yet()
        return None

    def check(self, source: str) -> Verdict:
        """The verdict on an answer cell's source (``screen``, then ``judge``)."""
        screened = self.screen(source)
        if screened is not None:
            return screened
        passed, lines, *counts = self.judge(source)  # a judge that counts no cases is one case
        cases = tuple(counts[0]) if counts else (int(bool(passed)), 1)
        return Verdict(passed, lines, cases=cases)

    def not_yet(self) -> Verdict:
        return Verdict(False, [failure(_("{label}: NOT YET: {name} still raises NotImplementedError; write your code "
                                         "where it says # YOUR CODE HERE (and remove that raise), then run this cell "
                                         "again").format(
            label=str(self.label), name=self.name))], not_yet=True)

    def check_object(self, obj) -> Verdict:
        """The notebook's check: the verdict on the cell that defines ``obj``, printed and returned."""
        if getattr(obj, "__name__", None) != self.name:
            raise TypeError(f"{self.label}: pass the {'class' if inspect.isclass(obj) else 'function'} you wrote, "
                            f"{self.name}; got {obj!r}")
        verdict = self.check(answer_source(obj))
        if verdict.passed:
            PASSED_HERE.add(self.id)
        print(verdict)
        return verdict


REGISTRY: dict[str, Exercise] = {}
PASSED_HERE: set[str] = set()  # exercises whose notebook check passed in this process (``reveal``)


def register(exercise: Exercise) -> Exercise:
    REGISTRY[exercise.id] = exercise
    return exercise


def reveal(check_id: str, obj) -> None:
    """Print the library's own version of an exercise's answer (``inspect.getsource(obj)``), once the
    student's answer has passed its check in this notebook; until then, say so. The student edition
    is saved before any answer passes, so it never shows the library's solution."""
    exercise = REGISTRY[check_id]
    if check_id in PASSED_HERE:
        print(inspect.getsource(obj))
    else:
        print(_("The library's version appears here once your {name} passes its check above (run the check cell, "
                "then this one).").format(name=exercise.name))


# ----------------------------------------------------------------------------------------------
# The answer's source.


def answer_source(obj) -> str:
    """The source of the answer that defines ``obj`` (a function or a class): the whole notebook cell
    it was written in -- the grader reads the same cell from the submitted file -- or, for code in a
    file, the object's own source."""
    functions = [obj] if inspect.isfunction(obj) else [
        inspect.unwrap(v.__func__ if isinstance(v, (staticmethod, classmethod)) else v)
        for v in vars(obj).values()] if inspect.isclass(obj) else []
    codes = [f.__code__ for f in functions if hasattr(f, "__code__")]
    if not codes:
        raise TypeError(f"expected the function or class you wrote, got {type(obj).__name__}: {obj!r}")
    filename = codes[0].co_filename
    if not os.path.exists(filename):  # a notebook cell: IPython keeps its text in linecache
        lines = linecache.getlines(filename)
        if lines:
            return "".join(lines)
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError) as exc:
        raise ValueError(f"cannot read the source of {obj.__name__}: {exc}. Define it in a cell.") from None


def is_stub(source: str, name: str) -> bool:
    """True when the definition of ``name`` is still the lesson's stub: a ``raise NotImplementedError``
    that every call reaches, where the solution region was (``# YOUR CODE HERE``) -- a statement of
    the function's own body, or of a loop or ``with`` in it, before any ``return`` or other ``raise``.
    For a class, any of its methods. A raise under an ``if``, a ``try`` or a ``match`` (an answer
    refusing a case it does not support) is the answer's own code, not the stub."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return _reaches_not_implemented(node.body)
        if isinstance(node, ast.ClassDef) and node.name == name:
            return any(_reaches_not_implemented(sub.body) for sub in node.body
                       if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return False


def _reaches_not_implemented(body: list) -> bool:
    """Whether running ``body`` from its start raises NotImplementedError whatever the inputs: a
    ``raise NotImplementedError`` among its statements (or a loop's or a ``with``'s), before the
    first statement that leaves it."""
    for statement in body:
        if isinstance(statement, ast.Raise):
            exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
        if isinstance(statement, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            if _reaches_not_implemented(statement.body):
                return True
        if isinstance(statement, (ast.Return, ast.Break, ast.Continue)):
            return False
    return False


# ----------------------------------------------------------------------------------------------
# On the ranks: the harnesses' common parts (trusted code that runs beside an answer).


ANSWER_FILE = "<answer>"  # the name the answer cell is compiled under, on the ranks


def compile_answer(source: str, name: str):
    """On a rank (never in the checking process): run the answer cell with ``torch`` and ``dist`` in
    scope and return what it defines under ``name``. The cell's lines go to ``linecache``, so that a
    traceback through the answer shows them (``answer_lines``)."""
    linecache.cache[ANSWER_FILE] = (len(source), None, source.splitlines(True), ANSWER_FILE)
    namespace = {"torch": torch, "dist": dist, "__name__": "answer"}
    exec(compile(source, ANSWER_FILE, "exec"), namespace)
    return namespace[name]


_FRAME = re.compile(r'^  File "<answer>", line (\d+), in (.+)$')


def answer_lines(traceback_text: str) -> list:
    """The lines of a traceback that are in the student's answer: ``  your answer, line 7, in
    my_ring: x = y / 0`` (the answer cell's line numbers; the library's frames left out)."""
    lines, out = traceback_text.splitlines(), []
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            code = lines[index + 1].strip() if index + 1 < len(lines) and lines[index + 1].startswith("    ") else ""
            out.append(_("  your answer, line {line}, in {function}: {code}").format(
                line=match[1], function=match[2], code=code))
    return out


def answer_error(err: BaseException) -> str:
    """On a rank: an exception the answer raised, as a verdict shows it: ``ZeroDivisionError:
    division by zero`` and, below, the lines of the answer it went through (``answer_lines``)."""
    head = f"{type(err).__name__}: {err}"
    return "\n".join([head, *answer_lines("".join(traceback.format_exception(err)))])


def plain(value) -> dict:
    """A value an answer returned, as plain data the checking process can read: a tensor's dtype,
    shape and values (floats), or the type of anything else."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "values": t.double().flatten().tolist()}
    return {"type": type(value).__name__}


def tensor_of(data: dict) -> torch.Tensor | None:
    """The tensor ``plain`` described (fp64), or None when the answer returned something else."""
    if "values" not in data:
        return None
    return torch.tensor(data["values"], dtype=torch.float64).reshape(data["shape"])


def describe(data: dict) -> str:
    """How a verdict names what an answer returned."""
    if "values" in data:
        return short(tensor_of(data))
    return _("a {type}, not a tensor").format(type=data["type"])


def short(t: torch.Tensor) -> str:
    values = t.flatten()[:6].tolist()
    more = ", ..." if t.numel() > 6 else ""
    return "[" + ", ".join(f"{v:g}" for v in values) + more + "]"


def integers(gen, *shape):
    """Small integers as fp64: every order of additions gives exactly the same sums."""
    return torch.randint(-3, 4, shape, generator=gen).to(torch.float64)


def row_problem(leading, n_in, n_out, seed):
    """``(X, W, bias)`` of a dense ``Y = X·W + bias``, the same wherever ``seed`` is used."""
    gen = torch.Generator().manual_seed(seed)
    return integers(gen, *leading, n_in), integers(gen, n_in, n_out), integers(gen, n_out)


def tp_groups():
    """On a rank: ``[(label, group, tp, group index)]`` to check on this world: the whole world, and on
    4 ranks also two groups of 2 (every rank creates every group, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [(f"the whole world (tp={world})", dist.group.WORLD, world, 0)]
    if world == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        groups.append(("groups {0,1} and {2,3} (tp=2)", pairs[rank // 2], 2, rank // 2))
    return groups


def tp_group_labels(world: int) -> list[tuple[str, int, int]]:
    """In the checking process: ``[(label, tp, groups)]`` matching ``tp_groups`` on ``world`` ranks."""
    out = [(_("the whole world (tp={tp})").format(tp=world), world, 1)]
    if world == 4:
        out.append((_("groups {first} and {second} (tp={tp})").format(first="{0,1}", second="{2,3}", tp=2), 2, 2))
    return out


# ----------------------------------------------------------------------------------------------
# In the checking process: run an answer on ranks.


def counted(results) -> tuple[int, int]:
    """(cases passed, cases tried) of per-case outcomes (True for a case that passed)."""
    results = list(results)
    return sum(bool(r) for r in results), len(results)


def tallied(failures: list, tried: int, failed: str, passed: str) -> Judged:
    """A judge's result from its failing cases' lines: ``failed`` (formatted with ``passed`` and
    ``tried``) and the first failure, or ``passed`` (formatted with ``n``)."""
    cases = (tried - len(failures), tried)
    if failures:
        return False, [failure(failed.format(passed=cases[0], tried=tried)), "  " + failures[0]], cases
    return True, [passed.format(n=tried)], cases


def run_answer(harness, source: str, name: str, world_size: int, label: str, args=()) -> list | str:
    """``harness(source, name, *args)`` on ``world_size`` fresh untrusted ranks: their raw results
    (one per rank), or the FAILED line that says what went wrong. An answer that raised
    NotImplementedError is no exception: the stub never gets here (``Exercise.screen``), so it is the
    answer's own refusal of a case, which fails like any error."""
    where = ngettext("{label} on {n} rank", "{label} on {n} ranks", world_size).format(label=str(label), n=world_size)
    timeout = float(os.environ.get("PARALLEL_LAB_CHECK_TIMEOUT") or CHECK_TIMEOUT)  # the grader may set it
    try:
        return launcher.run(harness, world_size, args=(source, name, *args), timeout=timeout, untrusted=True)
    except launcher.RankError as err:
        message = (err.message.splitlines() or [""])[0]
        return failure("\n".join([_("{where}: FAILED: rank {rank} raised {error}: {message}").format(
            where=where, rank=err.rank, error=err.exc_type, message=message), *answer_lines(err.remote_traceback)]))
    except launcher.RanksHung as err:
        blocked = "; ".join(_("rank {rank}: {what}").format(rank=r, what=what)
                            for r, what in sorted(err.blocked.items()))
        return failure(_("{where}: FAILED: did not finish within {timeout:g} s (a send without a matching recv, or "
                         "a collective some rank skipped?): {blocked}").format(where=where, timeout=err.timeout,
                                                                               blocked=blocked))
    except launcher.RankDied as err:
        return failure(_("{where}: FAILED: {reason}").format(where=where, reason=str(err).splitlines()[0]))


def judge_worlds(harness, source: str, name: str, label: str, worlds, judge_world, cases) -> Judged:
    """An exercise checked on each world size of ``worlds`` in turn: ``run_answer`` on fresh ranks,
    then ``judge_world(world, per_rank) -> (passed, line, (cases passed, cases tried))``; a run that
    failed gives its FAILED line and none of its ``cases(world)`` cases."""
    lines, passed, good, tried = [], True, 0, 0
    for world in worlds:
        per_rank = run_answer(harness, source, name, world, label)
        if isinstance(per_rank, str):
            ok, line, (n_good, n_tried) = False, per_rank, (0, cases(world))
        else:
            ok, line, (n_good, n_tried) = judge_world(world, per_rank)
        passed &= ok
        good, tried = good + n_good, tried + n_tried
        lines.append(line)
    return passed, lines, (good, tried)