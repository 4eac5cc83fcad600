"""The words inside Python code: its comments and docstrings, translatable like a lesson's markdown.

A lesson's code cells are read with it (``course.editions``), and so are the library functions a
lesson prints (``i18n.source``, ``i18n.extract``).

A code cell is the same program in both editions of a lesson, but what a student reads in it (an
exercise's spec in its docstring, ``# one row per rank`` beside a line) is text. ``pieces`` finds
that text with the standard library's readers: ``tokenize`` for comments (a block of full-line
comments at one column is one piece; a comment after code is one piece of one line) and ``ast`` for
docstrings (of functions and classes, and of the cell when more follows it). ``translate`` writes the
cell with some of them replaced, keeping the indentation, the quotes and every line of code as it
was; ``same_program`` says whether two cells differ only there (their ASTs, docstrings set aside,
are equal), which is what the editions' tests and ``tools/build_lessons.py --markdown-only`` hold.

What the build, the grader and the tools read stays as written, and is no piece: the solution
regions (``### BEGIN SOLUTION`` ... ``### END SOLUTION`` and everything between: students never see
it), ``# YOUR CODE HERE``, a pragma (``# noqa``, ``# type:``, ``# fmt:``, ``# pragma``; kept after a
translated comment), IPython's magics (``%%ranks 4 --with f``, a line that starts with ``%`` or
``!``; masked while the cell is read), and a comment with no letter (``# ----``).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from dataclasses import dataclass

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
KEPT = ("YOUR CODE HERE", BEGIN, END)
MAGIC = re.compile(r"^[ \t]*(?:%|!)")
PRAGMA = re.compile(r"\s*#\s*(?:noqa\b|type:|pragma\b|fmt:|pylint:|isort:)")
LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class Piece:
    """A comment block or a docstring of a cell: its English ``text`` (the catalog's msgid: a comment's
    lines without their ``#``, a docstring as ``inspect.cleandoc`` gives it), where it is (rows from
    1, columns from 0; ``end`` exclusive) and how to write it back."""

    kind: str  # "comment" or "docstring"
    text: str
    start: tuple[int, int]
    end: tuple[int, int]
    indent: str = ""  # what begins each further line (a block's column, a docstring's indentation)
    marker: str = "# "  # a comment's hashes (and space): "# ", "## "
    suffix: str = ""  # a pragma kept after the comment's words (noqa, type:)
    inline: bool = False  # a comment after code on its line
    quote: str = '"""'
    closing_line: bool = False  # a docstring whose closing quotes stand on a line of their own

    @property
    def row(self) -> int:
        return self.start[0]


def masked(source: str) -> str:
    """``source`` with IPython's magic lines (``%%ranks 4``, ``%time f()``, ``!ls``) as ``pass`` at their
    indentation: the same rows, Python that ``ast`` and ``tokenize`` read."""
    return "\n".join(re.match(r"[ \t]*", line)[0] + "pass" if MAGIC.match(line) else line
                     for line in source.split("\n"))


def _solution_rows(lines: list[str]) -> set[int]:
    rows, inside = set(), False
    for row, line in enumerate(lines, 1):
        if line.strip() == BEGIN:
            inside = True
        if inside:
            rows.add(row)
        if line.strip() == END:
            inside = False
    return rows


def _comment(token_text: str) -> tuple[str, str, str] | None:
    """``(marker, text, pragma suffix)`` of a comment token, or None when it is no text to translate."""
    if any(kept in token_text for kept in KEPT):
        return None
    if PRAGMA.match(token_text):
        return None
    hashes = re.match(r"#+", token_text)[0]
    pragma = PRAGMA.search(token_text, len(hashes))
    text = token_text[len(hashes):pragma.start() if pragma else None]
    text = (text[1:] if text.startswith(" ") else text).rstrip()
    if not LETTER.search(text):
        return None
    return hashes + " ", text, token_text[pragma.start():] if pragma else ""


def _docstrings(tree) -> list:
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not body:
            continue
        first = body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        if isinstance(node, ast.Module) and len(body) == 1:
            continue  # a cell that is one string shows it as its output: that is no docstring
        found.append(first.value)
    return found


def pieces(source: str) -> list[Piece]:
    """The comments and docstrings of a code cell a student reads, in the order of the cell; none
    when the cell is not Python (it is left as it is)."""
    code = masked(source)
    try:
        tree = ast.parse(code)
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (SyntaxError, tokenize.TokenError, IndentationError):
        return []
    lines = code.split("\n")
    solution = _solution_rows(lines)
    found: list[Piece] = []
    block: list = []  # (token, marker, text) of full-line comments at one column, one after another

    def close():
        if block:
            (first, marker, _), last = block[0], block[-1][0]
            found.append(Piece("comment", "\n".join(text for _, _, text in block), first.start, last.end,
                               indent=lines[first.start[0] - 1][:first.start[1]], marker=marker))
            block.clear()

    for token in tokens:
        if token.type != tokenize.COMMENT:
            if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) or (
                    token.type == tokenize.NL and not lines[token.start[0] - 1].strip()):
                close()  # code, or a blank line, ends a block
            continue
        row, col = token.start
        parsed = _comment(token.string) if row not in solution else None
        inline = bool(lines[row - 1][:col].strip())
        if parsed is None or inline or parsed[2]:
            close()
            if parsed is not None:
                marker, text, suffix = parsed
                found.append(Piece("comment", text, token.start, token.end, marker=marker, suffix=suffix,
                                   inline=inline, indent="" if inline else lines[row - 1][:col]))
            continue
        marker, text, _ = parsed
        if block and (block[-1][0].start[0] != row - 1 or block[-1][0].start[1] != col or block[-1][1] != marker):
            close()
        block.append((token, marker, text))
    close()
    for node in _docstrings(tree):
        if node.lineno in solution:
            continue
        segment = ast.get_source_segment(code, node) or ""
        quote = '"""' if segment.lstrip("rRuU").startswith('"""') else "'''" if segment.lstrip("rRuU").startswith(
            "'''") else segment.lstrip("rRuU")[:1]
        closing_line = "\n" in node.value and not node.value.rstrip(" \t").split("\n")[-1].strip() \
            and node.value.rstrip(" \t").endswith("\n")
        found.append(Piece("docstring", inspect.cleandoc(node.value), (node.lineno, node.col_offset),
                           (node.end_lineno, node.end_col_offset), indent=" " * node.col_offset, quote=quote,
                           closing_line=bool(closing_line)))
    return sorted(found, key=lambda p: p.start)



def render(piece: Piece, text: str) -> str:
    """What replaces ``piece`` (from its start to its end) when its text is ``text``."""
    if piece.kind == "comment":
        if piece.inline:
            return piece.marker + " ".join(line.strip() for line in text.split("\n")) + piece.suffix
        return f"\n{piece.indent}".join((piece.marker + line).rstrip() for line in text.split("\n")) + piece.suffix
    body = text.replace("\\", "\\\\")
    quote = piece.quote if len(piece.quote) == 3 or "\n" not in text else '"""'
    body = body.replace(quote, "\\" + quote)
    if "\n" in body:
        body = body.split("\n")[0] + "".join("\n" + (piece.indent + line if line.strip() else "")
                                              for line in body.split("\n")[1:])
    if piece.closing_line:
        body += "\n" + piece.indent
    elif len(quote) == 3 and body.endswith(quote[0]):
        body = body[:-1] + "\\" + quote[0]
    return quote + body + quote


def translate(source: str, translations: dict) -> str:
    """``source`` with every piece whose English text is a key of ``translations`` written in its
    translation (a function of the piece's text, or a dict); the rest, code and magics included, as
    it was. Rows and columns are those of ``pieces``."""
    lookup = translations.get if isinstance(translations, dict) else translations
    offsets, at = [], 0
    for line in source.split("\n"):
        offsets.append(at)
        at += len(line) + 1
    out = source
    for piece in sorted(pieces(source), key=lambda p: p.start, reverse=True):
        text = lookup(piece.text)
        if text is None:
            continue
        begin = offsets[piece.start[0] - 1] + piece.start[1]
        end = offsets[piece.end[0] - 1] + piece.end[1]
        out = out[:begin] + render(piece, text) + out[end:]
    return out


def _program(source: str) -> str:
    tree = ast.parse(masked(source))
    for node in _docstrings(tree):
        node.value = ""
    return ast.dump(tree, include_attributes=False)


def magics(source: str) -> list[str]:
    return [line for line in source.split("\n") if MAGIC.match(line)]


def same_program(one: str, other: str) -> bool:
    """True when two code cells are one program: the same magic lines and equal ASTs once their
    docstrings are set aside (they differ at most in comments, docstrings, layout)."""
    try:
        return magics(one) == magics(other) and _program(one) == _program(other)
    except SyntaxError:
        return one == other


def moved_lines(one: str, other: str) -> bool:
    """True when some statement of ``other`` stands on another line than in ``one`` (a translated
    docstring or comment block of another length): a traceback's line numbers would differ."""
    def rows(source):
        tree = ast.parse(masked(source))
        return [getattr(n, "lineno", None) for n in ast.walk(tree) if isinstance(n, ast.stmt)]

    try:
        return rows(one) != rows(other)
    except SyntaxError:
        return one != other
