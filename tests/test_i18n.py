"""The course's two languages: the library's gettext catalog is complete and current, a lesson's
catalog covers every markdown cell of its source, and each check names what it finds (a changed
English message or cell is caught)."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from babel.messages.pofile import read_po, write_po

from parallel_lab import i18n
from parallel_lab.course import editions
from parallel_lab.i18n import translate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import catalogs  # noqa: E402

LIBRARY = translate.catalog_path("zh-Hant")


@pytest.fixture(scope="module")
def template():
    """The library's messages as extracted now from the sources (pybabel extract, babel.cfg)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = catalogs.library_template(Path(tmp))
        yield path.read_bytes()


def _write(tmp_path, data: bytes, name="messages.pot") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_library_catalog_is_complete_and_current(template, tmp_path):
    """Every message the library shows has a translation that is not fuzzy, keeps its placeholders,
    and was made from the English the sources have now (re-extracted and compared)."""
    found = catalogs.library_problems(_write(tmp_path, template), LIBRARY, "zh_Hant")
    assert not found, "\n".join(found)


def test_the_library_check_names_a_changed_message(template, tmp_path):
    """Change one English message (as an edit of the source would) and the check names it: not in
    the catalog, and the old one stale. The real template has messages to change."""
    with open(_write(tmp_path, template), "rb") as handle:
        pot = read_po(handle)
    message = next(m for m in pot if m.id and isinstance(m.id, str) and "{" not in m.id)
    pot.delete(message.id, context=message.context)
    pot.add(message.id + " (changed)", locations=message.locations, context=message.context)
    with open(tmp_path / "changed.pot", "wb") as handle:
        write_po(handle, pot)
    found = catalogs.library_problems(tmp_path / "changed.pot", LIBRARY, "zh_Hant")
    assert any(p.startswith("not in the catalog") and repr(message.id + " (changed)") in p for p in found), found
    assert any(p.startswith("stale") and repr(message.id) in p for p in found), found


def test_the_library_check_names_fuzzy_untranslated_and_broken_placeholders(template, tmp_path):
    with open(LIBRARY, "rb") as handle:
        po = read_po(handle, locale="zh_Hant")
    plain = [m for m in po if m.id and isinstance(m.id, str) and "{" not in m.id]
    formatted = next(m for m in po if m.id and isinstance(m.id, str) and "{" in m.id)
    plain[0].flags.add("fuzzy")
    plain[1].string = ""
    formatted.string = formatted.string.replace("{", "(").replace("}", ")")
    with open(tmp_path / "broken.po", "wb") as handle:
        write_po(handle, po)
    found = catalogs.library_problems(_write(tmp_path, template), tmp_path / "broken.po", "zh_Hant")
    assert any(p.startswith("fuzzy") and repr(plain[0].id) in p for p in found), found
    assert any(p.startswith("untranslated") and repr(plain[1].id) in p for p in found), found
    assert any(p.startswith("placeholders") and repr(formatted.id) in p for p in found), found


def test_the_language_is_chosen_once_and_followed():
    assert i18n.language() == "en"
    with i18n.using("zh-Hant"):
        assert i18n.language() == "zh-Hant"
    assert i18n.language() == "en"
    with pytest.raises(ValueError, match="'fr' is not one of the course's: en, zh-Hant"):
        i18n.set_language("fr")


def test_a_translated_message_and_a_lazy_constant_follow_the_language():
    with open(LIBRARY, "rb") as handle:
        po = read_po(handle, locale="zh_Hant")
    message = next(m for m in po if m.id and isinstance(m.id, str) and m.string and not m.context)
    lazy = i18n._l(message.id)
    assert str(lazy) == i18n._(message.id) == message.id
    with i18n.using("zh-Hant"):
        assert i18n._(message.id) == message.string
        assert str(lazy) == f"{lazy}" == message.string
        assert lazy + "!" == message.string + "!"


def test_the_catalog_serves_jinja2_templates():
    """``translations(lang)`` is what Jinja2's i18n extension installs (the course service's pages)."""
    jinja2 = pytest.importorskip("jinja2")
    with open(LIBRARY, "rb") as handle:
        po = read_po(handle, locale="zh_Hant")
    message = next(m for m in po if m.id and isinstance(m.id, str) and m.string and "{" not in m.id
                   and "%" not in m.id and not m.context)
    env = jinja2.Environment(extensions=["jinja2.ext.i18n"], autoescape=False)
    env.install_gettext_translations(i18n.translations("zh-Hant"), newstyle=True)
    assert env.from_string("{{ _(text) }}").render(text=message.id) == message.string
    env.install_gettext_translations(i18n.translations("en"), newstyle=True)
    assert env.from_string("{{ _(text) }}").render(text=message.id) == message.id


def test_no_compiled_catalog_is_committed():
    """The .po files are the source; the library compiles them in memory (a committed .mo would go
    stale the day someone edits a .po and forgets to compile)."""
    tracked = subprocess.run(["git", "ls-files", "*.mo"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not tracked.strip(), tracked


# ----------------------------------------------------------------------------------------------
# Lessons


TRANSLATED = [(lang, source) for lang in editions.EDITIONS for source in editions.translated(lang)]


@pytest.mark.parametrize("lang,source", TRANSLATED, ids=[f"{lang}-{s.stem}" for lang, s in TRANSLATED])
def test_every_cell_of_a_translated_lesson_is_translated_from_its_current_source(lang, source):
    found = editions.problems(source.stem, source.read_text(encoding="utf-8"), lang)
    assert not found, "\n".join(found)


def test_the_list_of_lessons_not_yet_translated_names_lessons_that_exist():
    """The one place that exempts lessons (``editions.NOT_YET_TRANSLATED``): every entry is a lesson
    source, none has a catalog that would make it translated already."""
    stems = {s.stem for s in editions.sources()}
    assert set(editions.NOT_YET_TRANSLATED) <= stems, set(editions.NOT_YET_TRANSLATED) - stems
    assert editions.translated("zh-Hant"), "the pilot lessons are translated"


def test_a_changed_markdown_cell_is_named(tmp_path):
    """Edit one English cell of a translated lesson: the check names the lesson, the cell and why."""
    source = editions.translated("zh-Hant")[0]
    text = source.read_text(encoding="utf-8")
    key, cell, _ = editions.messages(text)[1]
    first_line = cell.splitlines()[-1]
    changed = text.replace("# " + first_line, "# " + first_line + " (changed)", 1)
    assert changed != text
    found = editions.problems(source.stem, changed, "zh-Hant")
    assert found == [p for p in found if f"cell {key} " in p] and len(found) == 1, found
    assert "changed after it was translated" in found[0] and found[0].startswith(source.stem)


def test_cell_keys_are_stable_and_unique():
    nb = [type("C", (), {"cell_type": t, "source": s}) for t, s in [
        ("markdown", "# 03 · Title\ntext"), ("code", "x"), ("markdown", "more"), ("markdown", "## 1. Part\nx"),
        ("markdown", "after"), ("markdown", "## 1. Part"), ("markdown", "text\n### Sub")]]
    assert editions.cell_keys(nb) == ["03-title", None, "03-title+1", "1-part", "1-part+1", "1-part~2",
                                      "1-part+1~2"]


def test_the_edition_sets_its_language_in_the_setup_call():
    assert editions.with_language("setup()", "zh-Hant") == 'setup(lang="zh-Hant")'
    assert editions.with_language("setup(ranks=False)  # no ranks", "zh-Hant") == \
        'setup(ranks=False, lang="zh-Hant")  # no ranks'


def _binds_underscore(function) -> list[int]:
    """Lines where ``function`` binds ``_`` in its own scope (not in a comprehension or a nested def)."""
    import ast

    lines, todo = [], list(function.body) + list(function.args.args)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
                             ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and node.id == "_" and isinstance(node.ctx, ast.Store):
            lines.append(node.lineno)
        if isinstance(node, ast.arg) and node.arg == "_":
            lines.append(node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return lines


def test_no_function_that_translates_binds_underscore():
    """``for a, _ in ...`` in a function makes ``_`` local to all of it, and its ``_("...")`` then
    raises UnboundLocalError: a function that calls ``_`` never binds it."""
    import ast

    wrong = []
    for path in [*sorted((ROOT / "parallel_lab").rglob("*.py")), ROOT / "course.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.alias) and (n.asname or n.name) == "_" or
                   isinstance(n, ast.FunctionDef) and n.name == "_" for n in ast.walk(tree)):
            continue
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_"
                        for n in ast.walk(function))
            bound = _binds_underscore(function)
            if calls and bound:
                wrong.append(f"{path.relative_to(ROOT)}:{bound[0]}: {function.name} binds _ and calls _()")
    assert not wrong, "\n".join(wrong)


def test_the_extractor_finds_messages_inside_f_strings():
    """Babel's token reader sees an f-string as one token before Python 3.12, so a message marked
    inside one would never reach the catalog (and the completeness test would be blind to it): the
    package is read with ``parallel_lab.i18n.extract`` instead, which walks the syntax tree."""
    import io

    from babel.messages.extract import extract

    from parallel_lab.i18n.extract import extract_python

    source = (b'# Translators: a table header\nhead = f"{pad(_(\'stage\'), 5)} {n}"\n'
              b'x = _("plain"), _l("lazy"), ngettext("one {n}", "{n} many", n), pgettext("menu", "Run"), _(name)\n')
    found = [(m[1], m[2], m[3]) for m in extract(extract_python, io.BytesIO(source),
                                                 keywords={**dict.fromkeys(("_", "_l", "N_")), "ngettext": (1, 2),
                                                           "pgettext": ((1, "c"), 2)},
                                                 comment_tags=("Translators:",))]
    assert found == [("stage", ["Translators: a table header"], None), ("plain", [], None), ("lazy", [], None),
                     (("one {n}", "{n} many"), [], None), ("Run", [], "menu")], found


def test_a_printed_function_shows_its_docstring_in_the_lessons_language():
    """Lesson 01 prints library functions with ``i18n.source``: the code as ``inspect.getsource`` has
    it, the docstring translated when the module lists the function in ``SHOWN_DOCSTRINGS`` (the
    extractor then puts that docstring in the catalog)."""
    import inspect
    import io

    from babel.messages.extract import extract

    from parallel_lab.i18n.extract import extract_python
    from parallel_lab.runtime import demos

    source = (b'SHOWN_DOCSTRINGS = ("shown",)\n\n\ndef shown():\n    """First line\n\n    and more."""\n\n\n'
              b'def other():\n    """Not listed."""\n')
    found = [(m[0], m[1]) for m in extract(extract_python, io.BytesIO(source), keywords={"_": None})]
    assert found == [(5, "First line\n\nand more.")], found
    with pytest.raises(ValueError, match="'gone', which is no documented function"):
        list(extract(extract_python, io.BytesIO(b'SHOWN_DOCSTRINGS = ("gone",)\n'), keywords={"_": None}))

    for fn in (demos.hello, demos.unmatched_send):
        english = inspect.getsource(fn)
        assert i18n.source(fn) == english
        with i18n.using("zh-Hant"):
            chinese = i18n.source(fn)
        doc = inspect.cleandoc(fn.__doc__)
        words = i18n.translations("zh-Hant").gettext(doc)
        assert words != doc and words.splitlines()[0] in chinese and doc.splitlines()[0] not in chinese
        code = [line for line in english.splitlines() if '"""' not in line and line.strip() not in doc]
        assert all(line in chinese.splitlines() for line in code)  # the code itself is unchanged
        assert len(chinese.splitlines()) == len(english.splitlines())
    with i18n.using("zh-Hant"):
        assert i18n.source(demos.rank_id) == inspect.getsource(demos.rank_id)  # not listed: as it is


def test_a_printed_function_shows_its_comments_in_the_lessons_language():
    """``i18n.source`` translates a listed function's comments as it does its docstring: the
    extractor puts each comment in the catalog (a run of whole-line comments is one message, a
    comment after code another), and the printed source has the translation where the comment was,
    the code on every line unchanged."""
    import inspect
    import io

    from babel.messages.extract import extract

    from parallel_lab.i18n.extract import extract_python, listing_comments
    from parallel_lab.pipeline import pipedream
    from parallel_lab.tensor import mappings

    source = (b'SHOWN_DOCSTRINGS = ("Box.shown",)\n\n\nclass Box:\n    def shown(self):\n        """Doc."""\n'
              b'        # First line\n        # and second.\n        x = 1  # after code\n        return x\n\n'
              b'    def other(self):\n        return 2  # not listed\n')
    found = [(m[0], m[1]) for m in extract(extract_python, io.BytesIO(source), keywords={"_": None})]
    assert found == [(6, "Doc."), (7, "First line\nand second."), (9, "after code")], found
    bare = b'SHOWN_DOCSTRINGS = ("bare",)\n\n\ndef bare():\n    return 1  # listed for its comment\n'
    assert [(m[0], m[1]) for m in extract(extract_python, io.BytesIO(bare), keywords={"_": None})] == [
        (5, "listed for its comment")]
    assert listing_comments("    x = 1  # a\n    # b\n    # c\n\n    # d\n") == [
        (0, 0, 11, "a"), (1, 2, 4, "b\nc"), (4, 4, 4, "d")]

    for fn in (mappings._CopyToTensorParallelRegion, pipedream.AsyncStage._update):
        english = inspect.getsource(fn)
        assert i18n.source(fn) == english
        with i18n.using("zh-Hant"):
            chinese = i18n.source(fn)
        catalog = i18n.translations("zh-Hant")
        for _first, _last, _column, words in listing_comments(english):
            assert catalog.gettext(words) != words and words.splitlines()[0] not in chinese
            assert catalog.gettext(words).splitlines()[0] in chinese
        code = [line.split("#")[0].rstrip() for line in english.splitlines()
                if line.strip() and not line.strip().startswith("#") and '"""' not in line]
        kept = [line.split("#")[0].rstrip() for line in chinese.splitlines()]
        assert all(line in kept for line in code)  # the code itself is unchanged
