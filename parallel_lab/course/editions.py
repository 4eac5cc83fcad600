"""A lesson in two languages from one source: the English source's markdown cells, translated
through one gettext catalog per lesson.

    lessons/src/03_pipeline_bubble.py                      the one source (English, jupytext percent)
    lessons/locale/zh_Hant/03_pipeline_bubble.po           its text in Traditional Chinese
    lessons/zh-Hant/03_pipeline_bubble.ipynb               the built zh-Hant edition

Each markdown cell is one message: the msgid is the English cell as the notebook shows it, the
msgctxt a key of the cell (``cell_keys``: the slug of its heading, or of the section it follows,
and its place there), so that a translator edits a ``.po`` file in any gettext tool and the catalog
records what each translation was made from. When an English cell changes, its msgid no longer
matches: ``pybabel update`` (``tools/catalogs.py update``) marks the old translation fuzzy and keeps
the English it was made from (``#| msgid``); the build refuses an untranslated or fuzzy cell and the
tests name the lesson and the cell. Code cells are the same program in both editions: their comments
and docstrings (``i18n.codetext``: an exercise's spec, ``# one row per rank``) are messages of the
same catalog, one per comment block or docstring, keyed by the code cell (``code_keys``), and the
edition writes them translated (``codetext.translate``); the first ``setup()`` gains the language
(``with_language``), and everything the library shows follows it (``parallel_lab.i18n``).

``extract_lesson`` is a Babel extraction method (``lessons/babel.cfg``), so ``pybabel extract`` reads
a lesson source like any other.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from parallel_lab.i18n import codetext

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "lessons" / "src"
CATALOGS = ROOT / "lessons" / "locale"
EDITIONS = {"zh-Hant": ROOT / "lessons" / "zh-Hant"}  # language -> the folder of its edition
GETTEXT_LOCALE = {"zh-Hant": "zh_Hant"}

# THE ONE LIST of lessons whose zh-Hant edition is not built yet, because their text is not
# translated yet (their catalog would fail the completeness test). The translation of the lessons
# empties it; a new lesson is never added here: it is born bilingual (ARCHITECTURE.md).
NOT_YET_TRANSLATED: tuple[str, ...] = ()

_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_CELL = re.compile(r"^# %%(?: \[markdown\])?(?:\s|$)")
_SETUP = re.compile(r"\bsetup\((?P<args>[^()]*)\)")


class TranslationError(ValueError):
    """A lesson's text is not (or no longer) translated; the message names the lesson and cells."""


def slug(text: str) -> str:
    """``03 · The assembly line and the bubble`` -> ``03-the-assembly-line-and-the-bubble``."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "cell"


def cell_keys(cells) -> list:
    """The key of every markdown cell (None for code cells): the slug of its first heading, else the
    slug of the last heading before it and the cell's place after it (``2-a-schedule-is-data+1``);
    made unique within the lesson with ``~2``, ``~3``. A key survives edits to other sections."""
    keys, seen, section, after = [], set(), "top", 0
    for cell in cells:
        if cell.cell_type != "markdown":
            keys.append(None)
            continue
        headings = _HEADING.findall(cell.source)
        if headings and cell.source.lstrip().startswith("#"):
            key, after = slug(headings[0]), 0
        else:
            after += 1
            key = f"{section}+{after}"
        if headings:
            section, after = slug(headings[-1]), 0
        keys.append(_unique(key, seen))
    return keys


def _unique(key: str, seen: set) -> str:
    """``key``, or ``key~2``, ``key~3``, ... when it is already in ``seen`` (which it joins)."""
    unique, n = key, 1
    while unique in seen:
        n += 1
        unique = f"{key}~{n}"
    seen.add(unique)
    return unique


def code_keys(cells) -> list:
    """The key of every code cell (None for markdown cells): ``<section>/code<n>``, the slug of the
    last heading before it and its place among the code cells after that heading
    (``2-a-schedule-is-data/code3``), unique within the lesson like ``cell_keys``'."""
    keys, seen, section, count = [], set(), "top", 0
    for cell in cells:
        if cell.cell_type != "code":
            headings = _HEADING.findall(cell.source) if cell.cell_type == "markdown" else []
            if headings:
                section, count = slug(headings[-1]), 0
            keys.append(None)
            continue
        count += 1
        keys.append(_unique(f"{section}/code{count}", seen))
    return keys


def parse(source: str) -> list:
    """The cells of a percent-format lesson source (jupytext)."""
    import jupytext  # a build-time dependency (the course and test extras)

    return jupytext.reads(source, fmt="py:percent").cells


def messages(source: str) -> list[tuple[str, str, int]]:
    """``(key, English text, line)`` of every markdown cell of a lesson source."""
    cells = parse(source)
    lines = [n for n, line in enumerate(source.splitlines(), 1) if _CELL.match(line)]
    out = []
    for index, (cell, key) in enumerate(zip(cells, cell_keys(cells))):
        if key is not None:
            out.append((key, cell.source, lines[index] if index < len(lines) else 1))
    return out


def code_messages(source: str) -> list[tuple[str, str, int, str]]:
    """``(key, English text, line, kind)`` of every comment block and docstring a student reads in the
    code cells of a lesson source (``codetext.pieces``; kind "comment" or "docstring")."""
    cells = parse(source)
    lines = [n for n, line in enumerate(source.splitlines(), 1) if _CELL.match(line)]
    out = []
    for index, (cell, key) in enumerate(zip(cells, code_keys(cells))):
        if key is not None:
            first = lines[index] if index < len(lines) else 0
            out += [(key, piece.text, first + piece.row, piece.kind) for piece in codetext.pieces(cell.source)]
    return out


NOTES = {
    "markdown": "Markdown cell: keep code spans, formulas, links and blockquoted quotations of the article as "
                "they are.",
    "comment": "Code comment: translate the words; keep code names, numbers and formulas as they are (a comment "
               "after code stays one line).",
    "docstring": "Docstring (for an exercise, its spec): translate the words; keep code names, numbers and "
                 "formulas as they are.",
}


def extract_lesson(fileobj, keywords, comment_tags, options):
    """Babel extraction method (``lessons/babel.cfg``): one message per markdown cell, then one per
    comment block or docstring of the code cells, each with its cell's key as msgctxt (``pgettext``)."""
    source = fileobj.read().decode(options.get("encoding", "utf-8"))
    found = [(line, key, text, "markdown") for key, text, line in messages(source)]
    found += [(line, key, text, kind) for key, text, line, kind in code_messages(source)]
    for line, key, text, kind in sorted(found, key=lambda m: m[0]):
        yield line, "pgettext", (key, text), [NOTES[kind]]


def catalog_path(lesson: str, lang: str) -> Path:
    """``lessons/locale/zh_Hant/03_pipeline_bubble.po`` for lesson ``03_pipeline_bubble``."""
    return CATALOGS / GETTEXT_LOCALE[lang] / f"{lesson}.po"


def edition_path(lesson: str, lang: str) -> Path:
    return EDITIONS[lang] / f"{lesson}.ipynb"


def read_catalog(path: Path, lang: str):
    from babel.messages.pofile import read_po

    with path.open("rb") as handle:
        return read_po(handle, locale=GETTEXT_LOCALE[lang], abort_invalid=True)


def problems(lesson: str, source: str, lang: str) -> list[str]:
    """What keeps lesson ``lesson`` from its ``lang`` edition, one line per cell: no catalog, a cell
    without translation, a translation marked fuzzy, or one made from another English text than the
    source's (the source changed after it was translated). Empty when every cell is translated."""
    path = catalog_path(lesson, lang)
    if not path.exists():
        return [f"{lesson}: no catalog {path.relative_to(ROOT)} (tools/catalogs.py update {lesson[:2]})"]
    catalog = read_catalog(path, lang)
    found = []
    for key, text, line in messages(source):
        message = catalog.get(text, context=key)
        if message is None or not message.string:
            by_key = next((m for m in catalog if m.context == key and m.id and m.string), None)
            if by_key is not None:
                found.append(f"{lesson}: cell {key} (line {line}): the English source changed after it was "
                             f"translated (update the catalog and the translation)")
            else:
                found.append(f"{lesson}: cell {key} (line {line}): not translated")
        elif message.fuzzy:
            was = f"; translated from: {message.previous_id[0][:60]!r}" if message.previous_id else ""
            found.append(f"{lesson}: cell {key} (line {line}): fuzzy: its English source changed after it "
                         f"was translated{was}")
    for key, text, line, kind in code_messages(source):
        message = catalog.get(text, context=key)
        what = f"{lesson}: code cell {key} (line {line}): the {kind} {_short(text)}"
        if message is None or not message.string:
            found.append(f"{what}: not translated (if its English changed, tools/catalogs.py update {lesson[:2]} "
                         f"marks the old translation fuzzy)")
        elif message.fuzzy:
            was = f"; translated from: {_short(message.previous_id[0])}" if message.previous_id else ""
            found.append(f"{what}: fuzzy: its English changed after it was translated{was}")
    return found


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def translated_cells(lesson: str, cells, lang: str) -> list:
    """The cells with every markdown cell in ``lang`` (from the lesson's catalog) and the first
    code cell's ``setup(...)`` in ``lang``; TranslationError naming every problem."""
    source_cells = list(cells)
    catalog = read_catalog(catalog_path(lesson, lang), lang)
    missing, out, language_set = [], [], False
    for cell, key, code_key in zip(source_cells, cell_keys(source_cells), code_keys(source_cells)):
        cell = cell.copy()
        if key is not None:
            message = catalog.get(cell.source, context=key)
            if message is None or not message.string or message.fuzzy:
                missing.append(key)
            else:
                cell.source = message.string
        elif code_key is not None:
            cell.source = translated_code(cell.source, code_key, catalog, missing)
            if not language_set and _SETUP.search(cell.source):
                cell.source, language_set = with_language(cell.source, lang), True
        out.append(cell)
    if missing:
        raise TranslationError(f"{lesson}: {len(missing)} cell(s) not translated into {lang}: {', '.join(missing)} "
                               f"(tools/catalogs.py check names why)")
    if not language_set:
        raise TranslationError(f"{lesson}: no code cell calls setup(): the {lang} edition cannot set its language")
    return out


def translated_code(source: str, key: str, catalog, missing: list) -> str:
    """A code cell's source with its comments and docstrings from ``catalog`` (the cell's key as their
    msgctxt); appends to ``missing`` what has no translation, and leaves it in English."""
    def lookup(text):
        message = catalog.get(text, context=key)
        if message is None or not message.string or message.fuzzy:
            missing.append(f"{key} ({_short(text, 30)})")
            return None
        return message.string

    return codetext.translate(source, lookup)


def with_language(code: str, lang: str) -> str:
    """``setup()`` -> ``setup(lang="zh-Hant")``; ``setup(ranks=False)`` -> ``setup(ranks=False,
    lang="zh-Hant")`` (the first call in the cell)."""
    def add(match):
        args = match["args"].strip()
        return f'setup({args + ", " if args else ""}lang="{lang}")'

    return _SETUP.sub(add, code, count=1)


def sources() -> list[Path]:
    return sorted(SOURCES.glob("*.py"))


def translated(lang: str = "zh-Hant") -> list[Path]:
    """The lesson sources whose ``lang`` edition is built: all but ``NOT_YET_TRANSLATED``."""
    return [s for s in sources() if s.stem not in NOT_YET_TRANSLATED]
