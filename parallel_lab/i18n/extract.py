"""Babel extraction method for the package's Python sources (``babel.cfg``), read with ``ast``.

Babel's own ``python`` method reads tokens, and before Python 3.12 an f-string is one token: a
message marked inside one (``f"{pad(_('stage'), 5)} ..."``, the text tables' headers) would never
reach the catalog, and nothing would say so. Walking the syntax tree finds every call, wherever it
is. Keywords: the names Babel gives the method (its defaults, plus ``-k _l -k lazy_gettext``); only
string literals are messages. Comments starting with a tag (``# Translators: ...``) on the lines
just above a call go to the translator.

A module whose functions a lesson prints with their source (``i18n.source``) names them in a
module-level ``SHOWN_DOCSTRINGS = ("hello", "Stage._update", ...)`` (a class, or a method as
``Class.method``): their docstrings and comments, the pieces ``codetext`` finds in a lesson's code
cell, are messages too, so that the printed source shows them in the lesson's
language.
"""

from __future__ import annotations

import ast
import textwrap

from parallel_lab.i18n import codetext

DEFAULT_SPECS = {"ngettext": (1, 2), "pgettext": ((1, "c"), 2), "npgettext": ((1, "c"), 2, 3)}


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _comments(lines: list[str], lineno: int, tags) -> list[str]:
    """The tagged comment block right above line ``lineno`` (1-based), tag kept."""
    found, index = [], lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        found.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    start = next((i for i, text in enumerate(found) if any(text.startswith(tag) for tag in tags)), None)
    return found[start:] if tags and start is not None else []


def listing_comments(text: str) -> list[tuple[int, int, int, str]]:
    """The comments of a printed listing ``text`` as ``(first line, last line, column, words)``, lines
    0-based, the column where its ``#`` stands in ``text``: the comment pieces ``codetext`` finds in a
    lesson's code cell (a run of whole-line comments at one column is one, a comment after code is
    one), found in the listing dedented."""
    shift = _margin(text)
    return [(p.start[0] - 1, p.end[0] - 1, p.start[1] + shift, p.text)
            for p in codetext.pieces(textwrap.dedent(text)) if p.kind == "comment"]


def _margin(text: str) -> int:
    """How far ``textwrap.dedent`` moves ``text`` left (a method's source is indented)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return len(first) - len(first.lstrip())


def _listed(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """``(name, node)`` for each function, class or ``Class.method`` the module lists in
    ``SHOWN_DOCSTRINGS``; a name that is none of them fails."""
    listed = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHOWN_DOCSTRINGS" for t in node.targets)
                and isinstance(node.value, (ast.Tuple, ast.List))):
            listed = [_literal(item) for item in node.value.elts]
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    found = []
    for name in listed:
        scope, node = tree.body, None
        for part in (name or "").split("."):
            node = next((n for n in scope if isinstance(n, kinds) and n.name == part), None)
            if node is None:
                break
            scope = node.body
        if node is None:
            raise ValueError(f"SHOWN_DOCSTRINGS names {name!r}, which is no documented function of the module")
        found.append((name, node))
    return found


def shown_texts(tree: ast.Module, lines: list[str]) -> list[tuple[int, str, str, str]]:
    """``(line, function, kind, text)`` for each docstring and comment of a function the module lists
    in ``SHOWN_DOCSTRINGS``: the pieces ``codetext`` finds in its source, decorators and all, as
    ``inspect.getsource`` has it and ``i18n.source`` translates it."""
    found = []
    for name, node in _listed(tree):
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        text = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno]) + "\n")
        found += [(start + p.row - 1, name, p.kind, p.text) for p in codetext.pieces(text)]
    return found


def extract_python(fileobj, keywords, comment_tags, options):
    """Yield ``(lineno, funcname, messages, comments)`` for every call of a keyword in the file, and
    for every docstring and comment of a function the module lists in ``SHOWN_DOCSTRINGS``."""
    source = fileobj.read().decode(options.get("encoding", "utf-8"))
    lines = source.splitlines()
    names = set(keywords)
    tree = ast.parse(source)
    shown = shown_texts(tree, lines)
    for lineno, name, _kind, doc in (entry for entry in shown if entry[2] == "docstring"):
        yield lineno, "_", doc, [f"Translators: the docstring of {name}, printed with its source: keep the "
                                 "``code`` as it is and the line breaks where they are"]
    for lineno, name, _kind, words in (entry for entry in shown if entry[2] == "comment"):
        yield lineno, "_", words, [f"Translators: a comment in {name}, printed with its source: keep the code "
                                   "names as they are; each line of the translation becomes one # line"]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id in names]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        messages = tuple(_literal(arg) for arg in node.args)
        spec = DEFAULT_SPECS.get(node.func.id, (1,))  # Babel passes the names; it applies the specs itself
        needed = [i[0] if isinstance(i, tuple) else i for i in spec]
        if not messages or len(messages) < max(needed) or any(messages[i - 1] is None for i in needed):
            continue  # not a literal (a variable, an f-string): nothing to extract here
        yield node.lineno, node.func.id, messages if len(messages) > 1 else messages[0], \
            _comments(lines, node.lineno, comment_tags)
