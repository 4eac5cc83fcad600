"""The pages' two languages: English and Traditional Chinese (Taiwan usage).

Templates (``templates/``) mark their text with Jinja2's i18n extension (``{% trans %}``, ``_()``);
a refusal's message is marked ``N_(...)`` where it is raised (``auth.Refused``) and translated when
shown. Both go to the course's catalog (``parallel_lab.i18n``: ``tools/catalogs.py update``, then
translate ``parallel_lab/i18n/locale/zh_Hant/LC_MESSAGES/messages.po``), whose completeness test
holds the service's messages too.

The language of a request: the ``lang`` cookie (the switch in every page's header), else the
browser's ``Accept-Language`` (any ``zh`` -> Traditional Chinese), else English.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from parallel_lab.i18n import LANGUAGES, translations

TEMPLATES = Path(__file__).resolve().parent / "templates"
LOCALES = tuple(LANGUAGES)
NAMES = dict(LANGUAGES)


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


def translator(locale: str):
    return translations(locale).gettext


@lru_cache(maxsize=None)
def environment(locale: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             extensions=["jinja2.ext.i18n"], undefined=jinja2.StrictUndefined)
    env.install_gettext_translations(translations(locale), newstyle=True)
    return env
