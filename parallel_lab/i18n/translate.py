"""The language of this process and the translation of one message (gettext, catalogs compiled by
Babel in memory at first use). See the package's docstring for how to mark a string."""

from __future__ import annotations

import gettext as _gettext
import inspect
import io
import os
import textwrap
import unicodedata
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

LANGUAGES = {"en": "English", "zh-Hant": "繁體中文"}
DEFAULT = "en"
ENVIRONMENT = "PARALLEL_LAB_LANG"  # the language of a process that chose none (course.py sets it)
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
DOMAIN = "messages"
# BCP 47 tag (what the course says: lessons/zh-Hant/) -> gettext's locale folder name
GETTEXT_LOCALE = {"en": "en", "zh-Hant": "zh_Hant"}

_chosen: str | None = None
# ``using``'s language: per thread (and task), so that two threads grading in two languages at once
# do not change each other's words; the process's choice (``set_language``) is what it falls back to.
_block: ContextVar[str | None] = ContextVar("parallel_lab_language", default=None)
_catalogs: dict[str, _gettext.NullTranslations] = {}


def check_language(lang: str) -> str:
    """``lang`` when the course has it, else ValueError naming the ones it has."""
    if lang not in LANGUAGES:
        raise ValueError(f"language {lang!r} is not one of the course's: {', '.join(LANGUAGES)}")
    return lang


def set_language(lang: str) -> str:
    """Choose the language of everything the library shows in this process (a lesson's first cell
    does it through ``course.notebook.setup(lang=...)``). Returns it."""
    global _chosen
    _chosen = check_language(lang)
    return _chosen


def language() -> str:
    """The language of the enclosing ``using`` block, else the one chosen in this process, else
    ``$PARALLEL_LAB_LANG``, else English."""
    block = _block.get()
    if block is not None:
        return block
    if _chosen is not None:
        return _chosen
    return check_language(os.environ.get(ENVIRONMENT) or DEFAULT)


@contextmanager
def using(lang: str):
    """Within the block (in this thread), the library speaks ``lang``: the grader writes one
    submission's feedback in that submission's language while another thread grades another; tests
    compare the two languages."""
    token = _block.set(check_language(lang))
    try:
        yield lang
    finally:
        _block.reset(token)


def catalog_path(lang: str, domain: str = DOMAIN, locale_dir: Path = LOCALE_DIR) -> Path:
    return locale_dir / GETTEXT_LOCALE[check_language(lang)] / "LC_MESSAGES" / f"{domain}.po"


def compile_po(path: Path, lang: str) -> _gettext.GNUTranslations:
    """A ``.po`` file compiled in memory (Babel's reader and ``.mo`` writer; fuzzy entries left out,
    as ``msgfmt`` leaves them out) into a ``gettext.GNUTranslations``."""
    from babel.messages.mofile import write_mo  # imported here: only a non-English process needs Babel
    from babel.messages.pofile import read_po

    with path.open("rb") as handle:
        catalog = read_po(handle, locale=GETTEXT_LOCALE[lang], abort_invalid=True)
    buffer = io.BytesIO()
    write_mo(buffer, catalog, use_fuzzy=False)
    buffer.seek(0)
    return _gettext.GNUTranslations(buffer)


def translations(lang: str | None = None) -> _gettext.NullTranslations:
    """The library's translations into ``lang`` (default: this process's language), a
    ``gettext.NullTranslations`` (English: the msgids themselves) that Jinja2's i18n extension
    takes: ``env.install_gettext_translations(translations("zh-Hant"), newstyle=True)``."""
    lang = check_language(lang or language())
    if lang not in _catalogs:
        _catalogs[lang] = _gettext.NullTranslations() if lang == DEFAULT else compile_po(catalog_path(lang), lang)
    return _catalogs[lang]


def gettext(message: str) -> str:
    """``message`` (its English text is the msgid) in this process's language."""
    return translations().gettext(message)


_ = gettext


def ngettext(singular: str, plural: str, n: int) -> str:
    """The singular or plural form for ``n``, in this process's language (format it after)."""
    return translations().ngettext(singular, plural, n)


def pgettext(context: str, message: str) -> str:
    """``message`` in ``context`` (for a short word that two places translate differently)."""
    return translations().pgettext(context, message)


class LazyString:
    """A message translated each time it is used, in the language of that moment: for module-level
    constants (``AXIS = {"sim": _l("time (simulator cost units)")}``), which are built at import,
    before a lesson has chosen its language. ``str(x)`` gives the text; formatting, ``+``, ``==``
    and the ``str`` methods work on the translated text."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __str__(self) -> str:
        return gettext(self.message)

    def __repr__(self) -> str:
        return f"_l({self.message!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __add__(self, other) -> str:
        return str(self) + str(other)

    def __radd__(self, other) -> str:
        return str(other) + str(self)

    def __mod__(self, other) -> str:
        return str(self) % other

    def __eq__(self, other) -> bool:
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(self.message)

    def __len__(self) -> int:
        return len(str(self))

    def __contains__(self, item) -> bool:
        return item in str(self)

    def __getattr__(self, name):  # format, upper, splitlines, ...: those of the translated text
        return getattr(str(self), name)


def N_(message: str) -> str:
    """Marks ``message`` for the catalog and returns it as it is: for a key that code compares in
    English and translates only where it is shown (``_(key)``)."""
    return message


def lazy_gettext(message: str) -> LazyString:
    return LazyString(message)


_l = lazy_gettext


def width(text: str) -> int:
    """Columns ``text`` takes in a monospace font: a CJK (wide) character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in str(text))


def pad(text, columns: int, align: str = "<") -> str:
    """``text`` padded with spaces to ``columns`` display columns (``<`` left, ``>`` right): what
    ``f"{text:<10}"`` does for ASCII, for text tables whose headers may be Chinese."""
    text = str(text)
    fill = " " * max(0, columns - width(text))
    return text + fill if align == "<" else fill + text


def source(obj) -> str:
    """``inspect.getsource(obj)`` with its docstring and comments in this process's language, for a
    lesson that prints a library function: the code as it is, each docstring and comment (the pieces
    ``codetext`` finds in a lesson's code cell) translated where the catalog has it (its module lists
    the function in ``SHOWN_DOCSTRINGS``, see ``i18n.extract``), else unchanged."""
    from parallel_lab.i18n import codetext

    text = inspect.getsource(obj)
    first = next((line for line in text.splitlines() if line.strip()), "")
    margin = first[: len(first) - len(first.lstrip())]
    translated = codetext.translate(textwrap.dedent(text), lambda words: None if (t := gettext(words)) == words else t)
    return textwrap.indent(translated, margin) if margin else translated
