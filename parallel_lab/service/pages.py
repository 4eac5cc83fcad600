"""The pages' two languages: English and Traditional Chinese (Taiwan usage).

Templates (``templates/``) mark their text with Jinja2's i18n extension (``{% trans %}``, ``_()``);
Python code marks messages shown to people with ``_()`` from ``translator(locale)``. The catalog is
gettext's: ``locale/zh_Hant/LC_MESSAGES/service.po``, read with Babel when the service starts (no
compiled file to keep in step). ``tests/test_service.py`` fails when a marked message has no
translation or the catalog keeps one nobody uses.

The language of a request: the ``lang`` cookie (the switch in every page's header), else the
browser's ``Accept-Language`` (any ``zh`` -> Traditional Chinese), else English.
"""

from __future__ import annotations

import gettext
import io
from functools import lru_cache
from pathlib import Path

import jinja2
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import Translations

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
CATALOG = HERE / "locale" / "zh_Hant" / "LC_MESSAGES" / "service.po"
LOCALES = ("en", "zh-Hant")
NAMES = {"en": "English", "zh-Hant": "繁體中文"}


def negotiate(cookie: str | None, accept_language: str | None) -> str:
    """``en`` or ``zh-Hant`` for a request."""
    if cookie in LOCALES:
        return cookie
    ranked = []
    for i, part in enumerate((accept_language or "").split(",")):
        tag, _, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            weight = 0.0
        ranked.append((-weight, i, tag.strip().lower()))
    for _, _, tag in sorted(ranked):
        if tag.startswith("zh"):
            return "zh-Hant"
        if tag.startswith("en"):
            return "en"
    return "en"


KEYWORDS = {"_": None, "gettext": None, "Refused": (2,)}  # Refused(status, message, **values)


def messages() -> dict[str, list[str]]:
    """Every message marked in the templates and the service's Python code -> where (file:line)."""
    from babel.messages.extract import extract_from_file

    found: dict[str, list[str]] = {}
    sources = [(p, "jinja2.ext:babel_extract") for p in sorted(TEMPLATES.glob("*.html"))]
    sources += [(p, "python") for p in sorted(HERE.glob("*.py"))]
    for path, method in sources:
        options = {"extensions": "jinja2.ext.i18n"} if method != "python" else {}
        for line, message, _, _ in extract_from_file(method, str(path), keywords=KEYWORDS, options=options):
            text = message if isinstance(message, str) else message[0]
            found.setdefault(text, []).append(f"{path.name}:{line}")
    return found


def update_catalog() -> tuple[int, int]:
    """Rewrite the catalog with every marked message, keeping the translations it has (new ones
    empty, unused ones dropped): ``(messages, untranslated)``. Run ``python -m parallel_lab.service.pages``."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    old = {}
    if CATALOG.exists():
        with open(CATALOG, "rb") as f:
            old = {m.id: m.string for m in read_po(f) if m.id}
    catalog = Catalog(locale="zh_Hant_TW", project="parallel-lab service", charset="utf-8")
    for text, where in sorted(messages().items()):
        catalog.add(text, old.get(text, ""), locations=[(w.rsplit(":", 1)[0], int(w.rsplit(":", 1)[1])) for w in where])
    CATALOG.parent.mkdir(parents=True, exist_ok=True)
    with open(CATALOG, "wb") as f:
        write_po(f, catalog, width=120, omit_header=False, sort_output=True)
    return len(catalog), sum(1 for m in catalog if m.id and not m.string)


@lru_cache(maxsize=None)
def translations(locale: str) -> gettext.NullTranslations:
    if locale == "en":
        return gettext.NullTranslations()
    with open(CATALOG, "rb") as f:
        catalog = read_po(f, locale="zh_Hant_TW")
    buffer = io.BytesIO()
    write_mo(buffer, catalog)
    buffer.seek(0)
    return Translations(buffer)


def translator(locale: str):
    return translations(locale).gettext


@lru_cache(maxsize=None)
def environment(locale: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             extensions=["jinja2.ext.i18n"], undefined=jinja2.StrictUndefined)
    env.install_gettext_translations(translations(locale), newstyle=True)
    return env


if __name__ == "__main__":
    total, missing = update_catalog()
    print(f"{CATALOG}: {total} messages, {missing} to translate")
