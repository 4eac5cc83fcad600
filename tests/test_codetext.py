"""What a student reads inside a code cell (comments, docstrings: an exercise's spec) is translated
like the lesson's markdown, and the translated cell is the same program: the grader, the build's
stubs, ``%%ranks`` and the linters' pragmas read it as they read the English one."""

import ast
import re
import sys
from pathlib import Path

import nbformat
import pytest

from parallel_lab.course import editions, tags
from parallel_lab.exercises import REGISTRY, check
from parallel_lab.i18n import codetext

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402

LANG = "zh-Hant"
CJK = re.compile(r"[\u4e00-\u9fff]")
CELL = '''%%ranks 2 --with my_f
import torch  # the library  # noqa: F401

# one block
# of two lines
def my_f(x, n=2):
    """Return x times n.

    The spec of the exercise.
    """
    y = x * n  # twice, by default
    ### BEGIN SOLUTION
    # the answer's own comment
    return y
    ### END SOLUTION


class Step:
    \'\'\'One step.\'\'\'
    # ----
    def run(self):
        return 1  # type: ignore
'''
ZH = {"the library": "函式庫", "one block\nof two lines": "一個區塊，\n兩行", "twice, by default": "預設兩倍",
      "Return x times n.\n\nThe spec of the exercise.": "回傳 x 乘以 n。\n\n練習的規格。", "One step.": "一步。"}


def test_pieces_are_the_comments_and_docstrings_a_student_reads():
    found = {(p.kind, p.text, p.row) for p in codetext.pieces(CELL)}
    assert found == {("comment", "the library", 2), ("comment", "one block\nof two lines", 4),
                     ("docstring", "Return x times n.\n\nThe spec of the exercise.", 7),
                     ("comment", "twice, by default", 11), ("docstring", "One step.", 19)}
    # kept as written: the magic, the solution region and its markers, pragmas, a rule without words


def test_a_translated_cell_is_the_same_program_with_its_words_translated():
    zh = codetext.translate(CELL, ZH)
    assert codetext.same_program(CELL, zh) and zh != CELL
    assert zh.startswith("%%ranks 2 --with my_f\nimport torch  # 函式庫  # noqa: F401\n\n# 一個區塊，\n# 兩行\n")
    assert "    y = x * n  # 預設兩倍\n    ### BEGIN SOLUTION\n    # the answer's own comment\n" in zh
    assert "        return 1  # type: ignore" in zh and "    # ----\n" in zh
    tree = ast.parse(codetext.masked(zh))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert ast.get_docstring(function) == ZH["Return x times n.\n\nThe spec of the exercise."]
    assert '    """回傳 x 乘以 n。\n\n    練習的規格。\n    """\n' in zh  # its indentation and closing line kept
    assert "    '''一步。'''" in zh
    assert codetext.translate(CELL, {}) == CELL == codetext.translate(CELL, {p.text: p.text for p in
                                                                             codetext.pieces(CELL)})
    # the build's stub and the grader's reading of it do not change with the language
    assert build_lessons.student_source(zh).count("# YOUR CODE HERE\n    raise NotImplementedError") == 1
    assert check.is_stub(codetext.masked(build_lessons.student_source(zh)), "my_f")


def test_a_docstring_with_quotes_and_backslashes_reads_back_as_its_translation():
    cell = 'def f():\n    "One line."\n    return 1\n'
    for text in ('含 """ 與 \\ 的說明', '結尾是引號"', "兩行\n第二行"):
        zh = codetext.translate(cell, {"One line.": text})
        assert ast.get_docstring(ast.parse(zh).body[0]) == text and codetext.same_program(cell, zh), zh


def test_same_program_tells_a_code_change_from_a_word_change():
    assert not codetext.same_program(CELL, CELL.replace("x * n", "x * n + 1"))
    assert not codetext.same_program(CELL, CELL.replace("%%ranks 2", "%%ranks 4"))
    assert codetext.same_program(CELL, CELL.replace("# twice, by default", "# anything"))
    assert not codetext.moved_lines(CELL, codetext.translate(CELL, {"twice, by default": "預設兩倍"}))
    assert codetext.moved_lines(CELL, codetext.translate(CELL, {"one block\nof two lines": "一行"}))


# ----------------------------------------------------------------------------------------------
# The built editions.

ZH_EDITIONS = sorted(editions.EDITIONS[LANG].glob("[0-9][0-9]_*.ipynb"))


def _code(path: Path) -> list:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", ZH_EDITIONS, ids=lambda p: p.name)
def test_every_zh_hant_code_cell_is_the_english_program_with_chinese_words(path):
    """Cell by cell: the same program as the English edition's (ASTs equal, docstrings aside; the same
    magics, tags), and every comment and docstring of the source translated (none left English)."""
    english = _code(ROOT / "lessons" / path.name)
    chinese = _code(path)
    assert [tags.of(c) for c in english] == [tags.of(c) for c in chinese]
    for en, zh in zip(english, chinese):
        assert codetext.same_program(en.source, zh.source) or codetext.same_program(
            editions.with_language(en.source, LANG), zh.source), (path.name, zh.get("id"))
        english_words = {p.text for p in codetext.pieces(en.source)}
        left = [p.text for p in codetext.pieces(zh.source) if p.text in english_words and not CJK.search(p.text)
                and re.search(r"[a-z]{3,} [a-z]{3,}", p.text)]
        assert not left, (path.name, zh.get("id"), left)


def test_the_zh_hant_stub_of_an_exercise_gives_its_spec_in_chinese():
    """Lesson 17's exercise (my_bubble_share): the student edition's stub, docstring in Chinese, and
    the stub still what the grader calls a stub."""
    cell = next(c for c in _code(editions.EDITIONS[LANG] / "17_faq.ipynb") if "answer:bubble-share" in tags.of(c))
    english = next(c for c in _code(ROOT / "lessons" / "17_faq.ipynb") if "answer:bubble-share" in tags.of(c))
    function = next(n for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef))
    spec = ast.get_docstring(function)
    assert function.name == "my_bubble_share" and CJK.search(spec) and "idle share" not in spec, spec
    assert "# YOUR CODE HERE\n    raise NotImplementedError" in cell.source
    assert check.is_stub(cell.source, "my_bubble_share") and codetext.same_program(english.source, cell.source)
    assert REGISTRY["bubble-share"].screen(cell.source).lines[0].startswith("bubble share: NOT YET")


@pytest.mark.parametrize("path", ZH_EDITIONS, ids=lambda p: p.name)
def test_the_grader_reads_a_zh_hant_answer_cell_as_the_english_one(path):
    """Every exercise's answer cell of the zh-Hant edition: the same program as the English stub, so
    the same policy, stub test and copy test apply (the grader reads the cell's AST, never its words)."""
    english = {tags.answer(c): c.source for c in _code(ROOT / "lessons" / path.name) if tags.answer(c)}
    for cell in _code(path):
        check_id = tags.answer(cell)
        if check_id in REGISTRY:
            assert codetext.same_program(english[check_id], cell.source), (path.name, check_id)
            exercise = REGISTRY[check_id]
            assert exercise.screen(cell.source).lines == exercise.screen(english[check_id]).lines


# ----------------------------------------------------------------------------------------------
# The no-execution rebuild takes a change of words, not of code.


def _committed(tmp_path, name="17_faq"):
    folder = tmp_path / "zh"
    folder.mkdir()
    target = folder / f"{name}.ipynb"
    target.write_bytes((editions.EDITIONS[LANG] / f"{name}.ipynb").read_bytes())
    return folder, target


def test_markdown_only_takes_a_cell_whose_comments_changed_and_refuses_one_whose_code_did(tmp_path):
    source = ROOT / "lessons" / "src" / "17_faq.py"
    folder, target = _committed(tmp_path)
    nb = nbformat.read(target, as_version=4)
    cell = next(c for c in nb.cells if "answer:bubble-share" in tags.of(c))
    before = cell.source
    function = next(n for n in ast.parse(before).body if isinstance(n, ast.FunctionDef))
    doc = ast.get_docstring(function)
    cell.source = before.replace(doc, "An old English spec.")
    nbformat.write(nb, target)
    build_lessons.refresh_markdown(source, folder, LANG)
    assert next(c for c in nbformat.read(target, as_version=4).cells if "answer:bubble-share" in tags.of(c)).source \
        == before
    cell.source = before.replace("raise NotImplementedError", "return 0.5")
    nbformat.write(nb, target)
    with pytest.raises(SystemExit, match="differs from the source's: build it"):
        build_lessons.refresh_markdown(source, folder, LANG)


def test_markdown_only_refuses_when_an_output_shows_the_changed_words(tmp_path):
    cell = nbformat.v4.new_code_cell('x = 1  # the old words here\nprint(x)')
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x = 1  # the old words here\n")]
    with pytest.raises(SystemExit, match="its output shows 'the old words here'"):
        build_lessons.only_words_changed('x = 1  # 新的說明\nprint(x)', cell, tmp_path / "x.ipynb")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    assert build_lessons.only_words_changed('x = 1  # 新的說明\nprint(x)', cell, tmp_path / "x.ipynb")


def test_a_changed_code_comment_is_named_with_its_lesson_and_cell():
    source = ROOT / "lessons" / "src" / "17_faq.py"
    text = source.read_text(encoding="utf-8")
    key, english, _, kind = next(m for m in editions.code_messages(text) if m[3] == "docstring")
    found = editions.problems(source.stem, text.replace(english, english + " Changed.", 1), LANG)
    assert len(found) == 1 and found[0].startswith(f"17_faq: code cell {key} (line "), found
    assert "the docstring" in found[0] and "not translated" in found[0]


def test_a_changed_comment_goes_fuzzy_with_the_english_it_was_made_from(tmp_path, monkeypatch):
    """The catalog updated after a docstring changed (tools/catalogs.py update, on a copy): the old
    translation is kept as fuzzy with the English it was made from (``#| msgid``), the check names the
    lesson, the code cell and the text, and the build refuses it."""
    import catalogs  # tools/

    stem = "17_faq"
    source = tmp_path / "lessons" / "src" / f"{stem}.py"
    source.parent.mkdir(parents=True)
    (tmp_path / "lessons" / "babel.cfg").write_bytes((ROOT / "lessons" / "babel.cfg").read_bytes())
    text = (ROOT / "lessons" / "src" / f"{stem}.py").read_text(encoding="utf-8")
    key, english, _, _ = next(m for m in editions.code_messages(text) if m[3] == "docstring")
    source.write_text(text.replace(english, english.replace("idle share", "idle fraction"), 1), encoding="utf-8")
    monkeypatch.setattr(editions, "CATALOGS", tmp_path / "locale")
    catalog = editions.catalog_path(stem, LANG)
    catalog.parent.mkdir(parents=True)
    catalog.write_bytes((ROOT / "lessons" / "locale" / "zh_Hant" / f"{stem}.po").read_bytes())
    monkeypatch.setattr(catalogs, "ROOT", tmp_path)
    catalogs.update(catalogs.lesson_template(source, tmp_path), catalog, "zh_Hant")
    found = editions.problems(stem, source.read_text(encoding="utf-8"), LANG)
    assert len(found) == 1 and found[0].startswith(f"{stem}: code cell {key} (line "), found
    assert "the docstring 'The idle fraction" in found[0] and "fuzzy: its English changed after it was translated" \
        in found[0]
    assert '#, fuzzy\n#| msgid "The idle share of a training step' in catalog.read_text(encoding="utf-8")
    with pytest.raises(editions.TranslationError, match=rf"{key} \('The idle fraction"):
        editions.translated_cells(stem, build_lessons.parse(source.read_text(encoding="utf-8")), LANG)
