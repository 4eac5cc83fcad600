"""A student's own code on real ranks: a function written in a notebook cell, or a whole cell.

    from parallel_lab.runtime import cells
    cells.run(my_all_reduce, 4, args=(8,))   # my_all_reduce, defined in a cell, on 4 ranks

    %%ranks 4                                  # the whole cell on 4 ranks (``course.notebook.setup``
    x = torch.full((2,), float(rank))          # registers the magic); rank, world_size, torch and
    dist.all_reduce(x)                         # dist are defined, and the cell's last expression is
    x                                          # each rank's value

Functions sent to ranks with ``launcher.run`` must be importable (ranks import them by name). These
two ship the *source* instead: ``run`` sends the top-level imports, functions, classes and constants
of the cell that defines the function (its other statements -- a call of ``run`` itself, a print
-- are left out, so nothing runs twice), ``%%ranks`` the whole cell. Each rank compiles it under the
cell's own name and line numbers, so a traceback points at the line in the cell.

The reporting is the launcher's (``runtime.errors``): an exception names the rank, with the
traceback into the cell (the library's own frames left out); ranks still running after ``timeout``
seconds are reported with what each one is blocked in (``commlog``: ``recv(src=1, shape=(4,), ...)``); a rank
that dies is named with its exit status; Ctrl-C stops them. What the ranks print comes back in rank
order, ``[rank 1] ...``. The code runs on **ranks of its own** (``launcher.run(..., untrusted=True)``):
started for the call and stopped after it, so whatever it changes on a rank (a patched torch, a
process group left half-used) never reaches a later run, and nothing is left behind. Results come
back as plain data, tensors included (rebuilt here with their dtype and shape); anything else
arrives as its ``repr``.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
import sys

from parallel_lab.i18n import _
from parallel_lab.runtime import launcher
from parallel_lab.runtime.errors import RankDied, RankError, RanksHung
from parallel_lab.runtime.prelaunch import check_timeout, check_world_size

DEFAULT_TIMEOUT = launcher.DEFAULT_TIMEOUT
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


# ----------------------------------------------------------------------------------------------
# In the notebook: which source to send.


def display_name(filename: str) -> str:
    """How a traceback names a cell: ``Cell In[12]`` for IPython's file of cell 12 (the name IPython's
    own tracebacks use, and the same in every run of a notebook), else the file name."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    return f"Cell In[{number}]" if number is not None else filename


def cell_source(fn) -> tuple[str, str]:
    """``(source, name)`` of the cell (or file) that defines ``fn``: IPython keeps a cell's text in
    ``linecache`` under its file's name; ``name`` is how tracebacks on the ranks call it."""
    if inspect.isclass(fn):  # a class: where its methods were written
        methods = [inspect.unwrap(m.__func__ if isinstance(m, (staticmethod, classmethod)) else m)
                   for m in vars(fn).values()]
        code = next((m.__code__ for m in methods if hasattr(m, "__code__")), None)
    else:
        code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        raise TypeError(_("expected a function or class you wrote, got {type}: {value}").format(
            type=type(fn).__name__, value=repr(fn)))
    filename = code.co_filename
    lines = linecache.getlines(filename)
    if not lines:
        raise ValueError(_("cannot read the source of {name} ({file}): define it in a notebook cell or a .py "
                           "file").format(name=fn.__name__, file=filename))
    return "".join(lines), display_name(filename)


def _is_constant(node) -> bool:
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    try:
        ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def definitions(source: str, filename: str = "<cell>") -> str:
    """The part of a cell ranks run for ``run``: its top-level imports, functions, classes and
    constant assignments, each on its own lines (the other lines blanked, so that line numbers stay
    the cell's). SyntaxError, naming the line, when the cell does not parse."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    keep = [False] * len(lines)
    for node in tree.body:
        if isinstance(node, _KEPT) or _is_constant(node):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            for i in range(first - 1, node.end_lineno):
                keep[i] = True
    return "\n".join(line if kept else "" for line, kept in zip(lines, keep)) + "\n"


# ----------------------------------------------------------------------------------------------
# On a rank (trusted code of this package, beside the student's).


def _plain(value, depth: int = 0):
    """A result as plain data the parent can read (``rank_process.plain_loads``): tensors as their
    dtype, shape and values, containers element by element, anything else as its repr."""
    import torch

    if depth > 20:
        return {"__repr__": "..."}
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        values = t.flatten().tolist()
        return {"__tensor__": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "values": values}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        return {"__dict__": [[_plain(k, depth + 1), _plain(v, depth + 1)] for k, v in value.items()]}
    return {"__repr__": repr(value)}


def on_rank(units: list, name: str | None, args: tuple, kwargs: dict):
    """On each rank: compile each ``(source, filename)`` of ``units`` in turn into one namespace (their
    lines in ``linecache``, so tracebacks show them) with ``torch``, ``dist``, ``rank`` and
    ``world_size`` defined; then call ``name(*args, **kwargs)``, or, without a name, evaluate the last
    unit's last expression. The result as plain data."""
    import torch
    import torch.distributed as dist

    namespace = {"torch": torch, "dist": dist, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                 "__name__": "__ranks__"}
    last = None
    for index, (source, filename) in enumerate(units):
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tree = ast.parse(source, filename)
        if name is None and index == len(units) - 1 and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
        exec(compile(tree, filename, "exec"), namespace)
    if name is not None:
        if name not in namespace:
            raise NameError(_("the cell defines no {name} at its top level").format(name=repr(name)))
        return _plain(namespace[name](*args, **kwargs))
    if last is not None:
        return _plain(eval(compile(ast.Expression(last.value), filename, "eval"), namespace))
    return None


# ----------------------------------------------------------------------------------------------
# Back in the notebook.


class Shown:
    """A rank's result that was not plain data, shown as the rank's ``repr`` of it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def _rebuild(value):
    import torch

    if isinstance(value, list):
        return [_rebuild(v) for v in value]
    if isinstance(value, dict):
        if "__tensor__" in value:
            dtype = getattr(torch, value["__tensor__"], None)
            if isinstance(dtype, torch.dtype):
                return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"])
            return Shown(f"tensor of {value['__tensor__']} {value['shape']}")
        if "__tuple__" in value:
            return tuple(_rebuild(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {_key(_rebuild(k)): _rebuild(v) for k, v in value["__dict__"]}
        if "__repr__" in value:
            return Shown(value["__repr__"])
    return value


def _key(value):
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


_LIBRARY_FRAME = re.compile(r'^  File "[^"]*[/\\]parallel_lab[/\\][^"]*", line \d+, in .*$')


def student_traceback(text: str) -> str:
    """A rank's traceback without the library's own frames (the harness that ran the cell): what is
    left starts in the student's code."""
    lines, out, skip = text.splitlines(), [], False
    for line in lines:
        if _LIBRARY_FRAME.match(line):
            skip = True
            continue
        if skip and line.startswith("    "):  # the frame's code line (and its ^^^ markers)
            continue
        skip = False
        out.append(line)
    return "\n".join(out)


def _launch(units: list, name: str | None, world_size: int, args, kwargs, timeout: float) -> list:
    try:
        values = launcher.run(on_rank, world_size, args=(units, name, tuple(args), dict(kwargs or {})),
                              timeout=timeout, untrusted=True)
    except RankError as err:
        raise RankError(err.rank, err.exc_type, err.message, student_traceback(err.remote_traceback),
                        others=err.others) from None
    return [_rebuild(v) for v in values]


def run(fn, world_size: int = 4, args: tuple = (), kwargs: dict | None = None, *,
        timeout: float = DEFAULT_TIMEOUT) -> list:
    """Run ``fn(*args, **kwargs)``, a function defined in a notebook cell, on ``world_size`` fresh
    ranks (gloo, torch.distributed initialised); the list of the ranks' return values, by rank. The
    cell's imports, functions, classes and constants travel with it; raises ``RankError`` (the
    rank, the traceback into the cell), ``RanksHung`` (what each rank is blocked in) or
    ``RankDied``, after every rank has been stopped."""
    check_world_size(world_size)
    check_timeout(timeout)
    source, filename = cell_source(fn)
    name = getattr(fn, "__name__", None)
    sent = definitions(source, filename)
    if name is None or not re.search(rf"^(async\s+)?(def|class)\s+{re.escape(name)}\b", sent, re.M):
        raise ValueError(_("{name} is not defined at the top level of its cell: ranks run the cell's top-level "
                           "definitions (def {name}(...): at the start of a line)").format(name=name))
    return _launch([(sent, filename)], name, world_size, args, kwargs, timeout)


def run_source(source: str, world_size: int = 4, *, filename: str = "<cell>", timeout: float = DEFAULT_TIMEOUT,
               using=()) -> list:
    """Run a whole cell's ``source`` on ``world_size`` fresh ranks (what ``%%ranks`` does), after the
    definitions of the cells that define the functions in ``using`` (``%%ranks 4 --with
    my_ring_all_reduce``); each rank's value of the cell's last expression (None without one)."""
    check_world_size(world_size)
    check_timeout(timeout)
    units = []
    for fn in using:
        cell, name = cell_source(fn)
        if (definitions(cell, name), name) not in units:
            units.append((definitions(cell, name), name))
    ast.parse(source, filename)  # a SyntaxError here, before any process starts
    return _launch(units + [(source, filename)], None, world_size, (), {}, timeout)


__all__ = ["run", "run_source", "definitions", "cell_source", "display_name", "student_traceback", "on_rank", "Shown",
           "RankError", "RanksHung", "RankDied"]
