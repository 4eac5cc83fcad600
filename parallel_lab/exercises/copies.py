"""Copies of the library, and answers alike: Python source compared after normalisation.

    tokens(source)                             # the normalised token stream of some source
    copy_of(answer_source, ("parallel_lab.runtime.collectives:ring_all_reduce",))
    # -> Copy("parallel_lab.runtime.collectives:ring_all_reduce", "my_ring_all_reduce", 1.0) or None
    similarity(tokens_a, tokens_b)             # 0..1, difflib's ratio on the two streams

**Normalisation** keeps what a program does and drops what a copier changes for free: comments
and formatting (the source goes through ``ast``), docstrings, type annotations, and every name the
code binds or reads (arguments, locals, helper functions, classes, the module names an answer has in
scope), which are renamed in the order they first appear (``v0``, ``v1``, ...). Attribute names
(``.isend``, ``.tensor_split``), keyword names, operators and constants stay: they are the calls
and the arithmetic, which a renaming does not reach. Two functions that differ only by names,
layout, comments and docstrings give the same stream; ``similarity`` measures the rest (a moved
line, an extra print) as difflib's ``SequenceMatcher`` ratio.

An exercise names the library functions that do its work (``Exercise.copies``); an answer with a
function whose stream is the same as one of them, or nearly (``COPY_RATIO``) when the library's
function is long enough for nearness to mean something (``MIN_TOKENS``), fails with the name of the
copied function (``exercises.check``). The grader uses the same streams to list pairs of students
whose answers are near-identical (``course.grading.similarity``).
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from functools import lru_cache

COPY_RATIO = 0.85  # at least this similar to a library function (of MIN_TOKENS or more) is a copy
MIN_TOKENS = 60    # below this a short function's look-alikes are what any right answer writes


@dataclass(frozen=True)
class Copy:
    """An answer's function ``defined`` that is the library's ``spec`` with ``ratio`` similarity."""

    spec: str
    defined: str
    ratio: float

    @property
    def library_name(self) -> str:
        """``collectives.ring_all_reduce`` for ``parallel_lab.runtime.collectives:ring_all_reduce``."""
        module, _, name = self.spec.partition(":")
        return f"{module.rsplit('.', 1)[-1]}.{name}"


class _Renamer(ast.NodeVisitor):
    """Walks a tree in source order and writes its token stream, renaming identifiers."""

    def __init__(self):
        self.names: dict[str, str] = {}
        self.out: list[str] = []

    def name(self, identifier: str) -> str:
        return self.names.setdefault(identifier, f"v{len(self.names)}")

    def generic_visit(self, node):
        out = self.out
        kind = type(node).__name__
        if isinstance(node, ast.Name):
            out.append(f"Name:{self.name(node.id)}")
            return
        if isinstance(node, ast.arg):
            out.append(f"arg:{self.name(node.arg)}")
            return  # no annotation
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(f"{kind}:{self.name(node.name)}")
            for base in getattr(node, "bases", ()):
                self.visit(base)
            if not isinstance(node, ast.ClassDef):
                self.visit(node.args)
            for statement in _without_docstring(node.body):
                self.visit(statement)
            out.append(f"end{kind}")
            return
        if isinstance(node, ast.AnnAssign):  # x: T = v is x = v
            if node.value is not None:
                out.append("Assign")
                self.visit(node.target)
                self.visit(node.value)
            return
        if isinstance(node, ast.Attribute):
            self.visit(node.value)
            out.append(f".{node.attr}")
            return
        if isinstance(node, ast.Constant):
            out.append(f"Constant:{node.value!r}"[:60])
            return
        if isinstance(node, ast.keyword):
            out.append(f"keyword:{node.arg}")
            self.visit(node.value)
            return
        if isinstance(node, ast.alias):
            out.append(f"alias:{node.name}")
            self.name(node.asname or node.name.split(".")[0])
            return
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            out += [kind] + [f"Name:{self.name(n)}" for n in node.names]
            return
        if isinstance(node, ast.ExceptHandler):
            out.append(f"except:{self.name(node.name) if node.name else ''}")
            if node.type is not None:
                self.visit(node.type)
            for statement in node.body:
                self.visit(statement)
            return
        if isinstance(node, (ast.expr_context, ast.Pass)):
            return
        out.append(kind)
        for field, value in ast.iter_fields(node):
            if field in ("returns", "type_comment", "annotation"):
                continue
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def node_tokens(node: ast.AST) -> tuple[str, ...]:
    """The normalised token stream of one node (a function, a class, a module)."""
    renamer = _Renamer()
    if isinstance(node, ast.Module):
        for statement in _without_docstring(node.body):
            renamer.visit(statement)
    else:
        renamer.visit(node)
    return tuple(renamer.out)


def tokens(source: str) -> tuple[str, ...]:
    """The normalised token stream of ``source`` (a SyntaxError propagates)."""
    return node_tokens(ast.parse(textwrap.dedent(source)))


def similarity(a, b) -> float:
    """difflib's ratio of two token streams: 1.0 for equal streams, 0.0 for nothing in common."""
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def definitions(source: str) -> dict[str, ast.AST]:
    """Every function and class the source defines at top level (and the methods of its classes),
    by name; {} when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            found.update({f"{node.name}.{m.name}": m for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
    return found


@lru_cache(maxsize=None)
def library_tokens(spec: str) -> tuple[str, ...]:
    """The token stream of a library function or class, ``"parallel_lab.<module>:<qualname>"``."""
    module_name, _, qualname = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    return node_tokens(tree.body[0])


def copy_of(source: str, specs) -> Copy | None:
    """The first function of ``source`` that is a copy of one of the library's ``specs``, or None:
    the same normalised stream, or at least ``COPY_RATIO`` similar to a library function of at least
    ``MIN_TOKENS`` tokens."""
    if not specs:
        return None
    answers = {name: node_tokens(node) for name, node in definitions(source).items()}
    best = None
    for spec in specs:
        library = library_tokens(spec)
        for name, mine in answers.items():
            ratio = similarity(mine, library)
            copied = mine == library or (len(library) >= MIN_TOKENS and ratio >= COPY_RATIO)
            if copied and (best is None or ratio > best.ratio):
                best = Copy(spec, name, ratio)
    return best
