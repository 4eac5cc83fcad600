"""The course's two languages: every string the library shows, in English or Traditional Chinese.

    from parallel_lab.i18n import _, _l, ngettext
    TITLE = _l("Activation memory per stage")        # a module-level constant: translated when shown
    print(_("stage {stage} (rank {rank})").format(stage=1, rank=1))
    print(ngettext("{n} point", "{n} points", n).format(n=n))

The language is chosen once per process (``set_language``; a lesson's first cell does it through
``course.notebook.setup(lang=...)``, the command line through ``$PARALLEL_LAB_LANG``); English is
the default, and the msgid itself is the English text. The catalogs are gettext ``.po`` files under
``locale/`` (``locale/zh_Hant/LC_MESSAGES/messages.po``), extracted from the sources and the Jinja
templates with Babel (``tools/catalogs.py``); they are compiled in memory at first use, so no binary
``.mo`` is committed that could go stale. ``translations(lang)`` is a ``gettext.NullTranslations``
for Jinja2's i18n extension (``env.install_gettext_translations(translations("zh-Hant"))``).
``source(fn)`` is a function's source with its docstring translated, for a lesson that prints it
(``SHOWN_DOCSTRINGS``, ``extract``).
"""

from parallel_lab.i18n.translate import (
    DEFAULT,
    LANGUAGES,
    N_,
    LazyString,
    _,
    _l,
    check_language,
    gettext,
    language,
    lazy_gettext,
    ngettext,
    pad,
    pgettext,
    set_language,
    source,
    translations,
    using,
    width,
)

__all__ = ["N_", "DEFAULT", "LANGUAGES", "LazyString", "_", "_l", "check_language", "gettext", "language",
           "lazy_gettext", "ngettext", "pad", "pgettext", "set_language", "source", "translations", "using", "width"]
