#!/usr/bin/env python3
"""The gettext catalogs of the course, with Babel's own commands (pybabel extract / update).

    .venv/bin/python tools/catalogs.py update           # re-extract; merge into every .po (library + lessons)
    .venv/bin/python tools/catalogs.py update 03        # the library and lesson 03 only
    .venv/bin/python tools/catalogs.py check            # name every untranslated, fuzzy or stale message

**The library** (``babel.cfg``: the package's Python sources, ``course.py`` and the Jinja templates)
has one catalog per language, ``parallel_lab/i18n/locale/zh_Hant/LC_MESSAGES/messages.po``:

    pybabel extract -F babel.cfg -k _l -k lazy_gettext -c Translators: --add-location=file -o messages.pot .
    pybabel update -i messages.pot -d parallel_lab/i18n/locale -l zh_Hant --previous --ignore-obsolete

**A lesson** has one catalog per language, ``lessons/locale/zh_Hant/<lesson>.po``, whose messages are
its markdown cells and the comments and docstrings of its code cells (``parallel_lab.i18n.codetext``)
(``lessons/babel.cfg``, the extraction method ``parallel_lab.course.editions:extract_lesson``).

``update`` runs exactly these commands (the templates go to a temporary folder: a ``.pot`` is
regenerated, never committed); then a translator edits the ``.po`` files (msgstr; remove the fuzzy
flag once a changed text is re-translated). No ``.mo`` is compiled into the repository: the library
compiles its catalog in memory at first use (``parallel_lab.i18n``), the build reads the lessons'.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

from babel.messages.frontend import CommandLineInterface
from babel.messages.pofile import read_po

from parallel_lab.course import editions
from parallel_lab.i18n import translate

ROOT = Path(__file__).resolve().parent.parent
LANGS = [lang for lang in translate.LANGUAGES if lang != translate.DEFAULT]
KEYWORDS = ["-k", "_l", "-k", "lazy_gettext"]
# str.format fields ({stage}, {bubble:.1%}) and %-style ones (%(limit)s: Jinja2's newstyle gettext)
PLACEHOLDER = re.compile(r"(?<!\{)\{([^{}]*)\}(?!\})|%\((\w+)\)[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]")


def pybabel(*argv: str) -> None:
    """One pybabel command, run in the repository's root, quietly."""
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            CommandLineInterface().run(["pybabel", "-q", *argv])
        except SystemExit as exc:
            if exc.code:
                raise SystemExit(f"pybabel {' '.join(argv)}: {err.getvalue().strip()}") from None


def _read(path: Path, locale: str | None = None):
    with path.open("rb") as handle:
        return read_po(handle, locale=locale)


@contextlib.contextmanager
def _inside_root():
    import os

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def library_template(folder: Path) -> Path:
    """Extract the library's messages (pybabel extract, ``babel.cfg``) into ``folder/messages.pot``."""
    target = folder / "messages.pot"
    with _inside_root():
        pybabel("extract", "-F", "babel.cfg", *KEYWORDS, "-c", "Translators:", "--add-location=file",
                "--sort-by-file", "--no-wrap", "--project=parallel-lab", "-o", str(target), ".")
    return target


def lesson_template(source: Path, folder: Path) -> Path:
    """Extract a lesson's markdown cells (``lessons/babel.cfg``) into ``folder/<lesson>.pot``."""
    target = folder / f"{source.stem}.pot"
    with _inside_root():
        pybabel("extract", "-F", "lessons/babel.cfg", "--add-location=file", "--no-wrap", "--project=parallel-lab",
                "-o", str(target), str(source.relative_to(ROOT)))
    return target


def update(template: Path, catalog: Path, locale: str) -> None:
    """Merge ``template`` into ``catalog`` (created when missing): pybabel update, keeping the English
    a changed message's translation was made from (``--previous``)."""
    catalog.parent.mkdir(parents=True, exist_ok=True)
    if not catalog.exists():
        pybabel("init", "-i", str(template), "-o", str(catalog), "-l", locale, "--no-wrap")
    pybabel("update", "-i", str(template), "-o", str(catalog), "-l", locale, "--previous", "--no-wrap",
            "--ignore-obsolete", "--ignore-pot-creation-date")


def library_problems(template: Path, catalog: Path, locale: str) -> list[str]:
    """One line per message of the library that is untranslated, fuzzy, stale (the catalog holds a
    msgid the sources no longer have, or lacks one they have), or whose translation drops or adds a
    ``{placeholder}``."""
    wanted, have = _read(template), _read(catalog, locale)
    keys = {(m.id if isinstance(m.id, str) else m.id[0], m.context) for m in wanted if m.id}
    found = []
    for message in wanted:
        if not message.id:
            continue
        name = _name(message)
        got = have.get(message.id, context=message.context)
        if got is None:
            found.append(f"not in the catalog (run tools/catalogs.py update): {name}")
        elif got.fuzzy:
            was = f" (translated from {got.previous_id[0]!r})" if got.previous_id else ""
            found.append(f"fuzzy: its English changed after it was translated{was}: {name}")
        elif not (got.string if isinstance(got.string, str) else all(got.string)):
            found.append(f"untranslated: {name}")
        else:
            english = {p for text in _forms(message.id) for p in _fields(text)}
            for text in _forms(got.string):
                if _fields(text) != english:
                    found.append(f"placeholders {sorted(_fields(text))} != the English {sorted(english)}: {name}")
    for message in have:
        key = (message.id if isinstance(message.id, str) else message.id[0], message.context)
        if message.id and key not in keys:
            found.append(f"stale: the sources no longer have it (run tools/catalogs.py update): {_name(message)}")
    return found


def _fields(text: str) -> set[str]:
    return {match.group(0) for match in PLACEHOLDER.finditer(text)}


def _forms(text) -> list[str]:
    return [text] if isinstance(text, str) else list(text)


def _name(message) -> str:
    text = message.id if isinstance(message.id, str) else message.id[0]
    where = ", ".join(sorted({path for path, _ in message.locations})) if message.locations else ""
    return f"{text!r}" + (f" [{message.context}]" if message.context else "") + (f" ({where})" if where else "")


def check(prefixes=()) -> list[str]:
    """Every problem of the library's catalogs and of the translated lessons' catalogs."""
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        template = library_template(Path(tmp))
        for lang in LANGS:
            catalog = translate.catalog_path(lang)
            found += [f"{catalog.relative_to(ROOT)}: {p}" for p in
                      library_problems(template, catalog, translate.GETTEXT_LOCALE[lang])]
    for lang in LANGS:
        for source in editions.translated(lang):
            if not prefixes or source.stem.startswith(tuple(prefixes)):
                found += editions.problems(source.stem, source.read_text(encoding="utf-8"), lang)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("update", "check"))
    parser.add_argument("prefixes", nargs="*", metavar="NN", help="lessons whose name starts with NN (default: all)")
    args = parser.parse_args(argv)
    if args.command == "check":
        found = check(args.prefixes)
        print("\n".join(found) or "every catalog is complete and up to date")
        return 1 if found else 0
    with tempfile.TemporaryDirectory() as tmp:
        template = library_template(Path(tmp))
        for lang in LANGS:
            update(template, translate.catalog_path(lang), translate.GETTEXT_LOCALE[lang])
        for lang in LANGS:
            for source in editions.sources():
                if args.prefixes and not source.stem.startswith(tuple(args.prefixes)):
                    continue
                if source.stem in editions.NOT_YET_TRANSLATED and not args.prefixes:
                    continue
                update(lesson_template(source, Path(tmp)), editions.catalog_path(source.stem, lang),
                       editions.GETTEXT_LOCALE[lang])
    print("updated; now translate what tools/catalogs.py check names", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
