"""The Traditional Chinese editions (lessons/zh-Hant/): one per translated lesson, built from the same
source (same code, the language set in the first cell), written in Chinese (the CJK share of their
markdown), and what the library shows in them is Chinese too."""

import json
import re
import sys
import unicodedata
from pathlib import Path

import nbformat
import pytest

from parallel_lab import i18n
from parallel_lab.course import editions, tags
from parallel_lab.i18n import codetext

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402

LANG = "zh-Hant"
EDITIONS = sorted(editions.EDITIONS[LANG].glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
MIN_CJK_SHARE = 0.90


def prose(markdown: str) -> str:
    """The text of a markdown cell a student reads as prose: without code (fenced and inline),
    formulas, blockquoted quotations, HTML tags and link targets."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(">"))
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def cjk_share(markdown: str) -> tuple[int, int]:
    """(CJK letters, all letters) of the prose of ``markdown``."""
    letters = [c for c in prose(markdown) if unicodedata.category(c).startswith("L")]
    return sum(1 for c in letters if CJK.match(c)), len(letters)


def markdown_of(path: Path) -> str:
    return "\n\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def test_every_translated_lesson_has_its_edition_and_no_other_has_one():
    built = {p.stem for p in EDITIONS}
    assert built == {s.stem for s in editions.translated(LANG)}, \
        "build them: tools/build_lessons.py --lang zh-Hant NN (or list the lesson in NOT_YET_TRANSLATED)"


def test_the_cjk_share_counts_prose_only():
    assert cjk_share("氣泡（bubble）") == (2, 8)
    assert cjk_share("`run_pipeline` 執行 $p-1$\n> quoted English\n[課](00_x.ipynb)") == (3, 3)


@pytest.mark.parametrize("path", EDITIONS, ids=lambda p: p.name)
def test_the_edition_is_written_in_chinese(path):
    cjk, letters = cjk_share(markdown_of(path))
    share = cjk / letters
    print(f"{path.name}: {share:.1%} of {letters} letters of prose are CJK")
    assert share >= MIN_CJK_SHARE, f"{path.name}: only {share:.1%} of the letters of its prose are CJK"


@pytest.mark.parametrize("path", EDITIONS, ids=lambda p: p.name)
def test_the_edition_has_the_english_lessons_code_and_its_own_language(path):
    """Same code cells as the English edition (the first setup() call gains the language; comments
    and docstrings translated: the same program, tests/test_codetext.py), same tags, so the same
    checks grade it; markdown from the lesson's catalog."""
    english = nbformat.read(ROOT / "lessons" / path.name, as_version=4)
    chinese = nbformat.read(path, as_version=4)
    assert chinese.metadata["parallel_lab"] == {"lang": LANG} and "parallel_lab" not in english.metadata
    code = [c for c in english.cells if c.cell_type == "code"]
    code_zh = [c for c in chinese.cells if c.cell_type == "code"]
    assert [c.metadata.get("tags", []) for c in code] == [c.metadata.get("tags", []) for c in code_zh]
    setup = [(a.source, b.source) for a, b in zip(code, code_zh) if editions._SETUP.search(a.source)][0]
    assert 'lang="zh-Hant"' in setup[1] and codetext.same_program(editions.with_language(setup[0], LANG), setup[1])
    changed = [(a.source, b.source) for a, b in zip(code, code_zh) if a.source != b.source and a.source != setup[0]]
    assert all(codetext.same_program(a, b) for a, b in changed), changed
    source = ROOT / "lessons" / "src" / f"{path.stem}.py"
    expected = build_lessons.with_load(source, build_lessons.localized_links(
        editions.translated_cells(path.stem, build_lessons.parse(source.read_text(encoding="utf-8")), LANG), LANG),
        LANG)
    assert [c.source for c in expected if c.cell_type == "markdown"] == \
        [c.source for c in chinese.cells if c.cell_type == "markdown"][:len([c for c in expected
                                                                             if c.cell_type == "markdown"])]


def test_links_to_lessons_without_an_edition_go_to_the_english_one():
    faq = nbformat.read(editions.EDITIONS[LANG] / "17_faq.ipynb", as_version=4)
    text = "".join(c.source for c in faq.cells if c.cell_type == "markdown")
    assert "](03_pipeline_bubble.ipynb)" in text and "](02_tensor_parallelism.ipynb)" in text
    wrong = [name for name in editions.NOT_YET_TRANSLATED if f"]({name}.ipynb)" in text]
    assert not wrong, wrong  # a lesson without its edition is linked to the English one, ../NN_name.ipynb
    for target in re.findall(r"\]\(([^)]+\.ipynb)\)", text):
        assert (editions.EDITIONS[LANG] / target).exists(), target


def _outputs(path: Path, kind: str) -> list:
    nb = nbformat.read(path, as_version=4)
    return [o["data"][kind] for c in nb.cells for o in c.get("outputs", []) if kind in o.get("data", {})]


def test_lesson_03s_figures_and_widgets_speak_chinese():
    path = editions.EDITIONS[LANG] / "03_pipeline_bubble.ipynb"
    figures = _outputs(path, PLOTLY)
    assert len(figures) >= 2
    for figure in figures:
        layout = figure["layout"]
        for text in (layout["title"]["text"], layout["xaxis"]["title"]["text"]):
            assert CJK.search(text), text
        assert all(CJK.search(trace["name"]) for trace in figure["data"]), [t["name"] for t in figure["data"]]
    assert "氣泡" in figures[0]["layout"]["title"]["text"] and "rank 0" in json.dumps(figures[0]["layout"]["yaxis"])
    shown = next(text for text in _outputs(path, "text/plain") if "Dropdown(" in text)
    assert "Dropdown(description='排程'" in shown, shown[:200]  # the stored repr: truncated after the first


def test_the_schedule_panels_labels_follow_the_language():
    from parallel_lab.show import pipeline as figures

    with i18n.using(LANG):
        panel = figures.schedule_panel("gpipe", ranks=4, microbatches=1)
    labels = [c.description for c in panel.controls.values()] + [panel.button.description, panel.progress.description]
    assert labels == ["排程", "rank 數 p", "微批次 m", "虛擬階段 v", "F 成本", "B 成本", "B 中的 W",
                      "在真實 rank 上執行", "閒置"]
    assert "模擬氣泡" in panel.numbers.value and "氣泡" in panel.figure.layout.title.text


def test_a_prediction_speaks_the_lessons_language(capsys):
    """What ``predict`` prints follows the lesson's language (lesson 04's graded prediction)."""
    from parallel_lab.show.predict import predict

    with i18n.using(LANG):
        guess = predict("gpipe-bubble", None)
        waiting = capsys.readouterr().out
        guess.versus(0.25, "simulated")
        compared = capsys.readouterr().out
    assert waiting.startswith("預測 gpipe-bubble：尚未完成：還沒有記錄數字。") and "氣泡（bubble）" in waiting
    assert compared.startswith("預測 gpipe-bubble：模擬 0.25；沒有記錄預測"), compared


def test_a_predictions_unit_that_is_a_word_reads_chinese(capsys):
    """A unit a lesson writes as a plain string is a word in Chinese where it is one (lesson 01's ms);
    symbols stay (GB); English is unchanged."""
    from parallel_lab.show.predict import predict

    question = {"en": "the all-reduce's time", "zh-Hant": "all-reduce 的時間"}
    with i18n.using(LANG):
        predict("unit-ms", None, question, unit="ms")
        predict("unit-gb", 2.0, question, unit="GB").versus(2.5)
    shown = capsys.readouterr().out
    assert "（單位：毫秒）" in shown and "2 GB" in shown and " ms" not in shown, shown
    predict("unit-ms", 1.5, question, unit="ms")
    assert "1.5 ms" in capsys.readouterr().out


def test_lessons_09_12_and_16_show_the_librarys_words_in_chinese():
    """The cut names of lesson 09's figures, lesson 12's four-way figure, lesson 16's rejection table,
    measured grid and command line, lesson 11's refused plans and the links of lessons 02 and 13, as the
    zh-Hant editions stored them."""
    def stream(name: str) -> str:
        nb = nbformat.read(editions.EDITIONS[LANG] / f"{name}.ipynb", as_version=4)
        return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))

    curves = next(f for f in _outputs(editions.EDITIONS[LANG] / "09_balancing_stages.ipynb", PLOTLY)
                  if len(f["data"]) == 4)
    assert [t["name"] for t in curves["data"]][::2] == ["均分區塊", "平衡切法"]
    titles = [f["layout"]["title"]["text"] for f in _outputs(editions.EDITIONS[LANG] / "12_zero_sharding.ipynb", PLOTLY)
              if f["layout"].get("title", {}).get("text")]
    assert any(t.startswith("GPT-3 6.7B 在 64 個 GPU 上") for t in titles), titles
    planner = stream("16_planner")
    assert "張量平行群組會跨越節點" in planner and "相對誤差中位數" in planner and "個計畫放得下" in planner
    assert not re.search(r"would cross nodes|lightest of every|median relative error|plans fit", planner)
    links = stream("13_mixture_of_experts") + stream("02_tensor_parallelism")  # hardware.LINKS' names
    assert "InfiniBand NDR（每個 GPU 400 Gb/s，節點之間）" in links and "between nodes" not in links
    mesh = stream("11_3d_parallelism")
    assert "無法把 gpt 切成 4 個模型階段" in mesh and not re.search(r"divisible|cannot cut|does not fit", mesh)


def _course():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_py", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_course_py_reads_the_librarys_catalog_as_babel_does():
    """course.py runs before the environment exists, so it reads the .po with the standard library:
    its reading of every plain message equals Babel's (the catalog the library compiles)."""
    from babel.messages.pofile import read_po

    course = _course()
    with open(i18n.translate.catalog_path(LANG), "rb") as handle:
        po = read_po(handle, locale="zh_Hant")
    plain = {m.id: m.string for m in po if m.id and isinstance(m.id, str) and not m.context and not m.fuzzy}
    assert course._catalog() == plain
    course.LANG = LANG
    assert course._("creating {venv}").format(venv=".venv") == "正在建立 .venv"


def test_course_py_start_in_chinese_opens_the_edition_with_jupyterlabs_chinese_locale(tmp_path):
    course = _course()
    assert course.language(["--lang", "zh-Hant", "--no-browser"]) == ("zh-Hant", ["--no-browser"])
    assert course.language(["--port=1"]) == ("en", ["--port=1"])
    lesson = course.first_lesson("zh-Hant")
    assert lesson.startswith("lessons/zh-Hant/") and (ROOT / lesson).exists()
    target = course.install_lab_settings(tmp_path, "zh-Hant")
    settings = json.loads(target.read_text(encoding="utf-8"))
    assert settings["@jupyterlab/translation-extension:plugin"] == {"locale": "zh_TW"}
    assert target.parent.name == "settings-zh-Hant"  # the English start's settings stay as they are
    assert "@jupyterlab/translation-extension:plugin" not in json.loads(
        course.install_lab_settings(tmp_path).read_text())


@pytest.mark.timeout(300)
def test_an_exercises_not_yet_verdict_is_chinese_in_a_chinese_lesson():
    """Lesson 01's exercise as its zh-Hant edition will run it: the first cell's setup() in
    zh-Hant, the student's stub, the check cell, in a kernel: the verdict is Chinese."""
    from notebook_client import notebook_client

    source = ROOT / "lessons" / "src" / "01_ranks_and_collectives.py"
    cells = build_lessons.parse(source.read_text(encoding="utf-8"))
    first = next(c for c in cells if c.cell_type == "code" and "setup(" in c.source)
    answer = tags.answer_cells(cells)["ring-all-reduce"]
    check = next(c for c in cells if "check:ring-all-reduce" in c.metadata.get("tags", []))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(editions.with_language(first.source, LANG).replace("setup(", "setup(ranks=False, ")),
        nbformat.v4.new_code_cell(build_lessons.student_source(answer.source)),
        nbformat.v4.new_code_cell(check.source)], metadata=dict(build_lessons.METADATA))
    notebook_client(nb, timeout=240, resources={"metadata": {"path": str(ROOT / "lessons")}}).execute()
    shown = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert shown.startswith("環狀 all-reduce：尚未完成：my_ring_all_reduce 仍然引發 NotImplementedError"), shown
    assert "NOT YET" not in shown


def test_doctor_and_the_validator_speak_the_chosen_language():
    from parallel_lab import doctor
    from parallel_lab.pipeline.actions import ScheduleError, as_schedule
    from parallel_lab.pipeline.validate import validate

    with i18n.using(LANG):
        assert doctor.check_gloo() == (True, "gloo 後端可用")
        with pytest.raises(ScheduleError) as err:
            validate(as_schedule([["0F0", "0B0"], ["1B0", "1F0"]], p=2, m=1, name="swapped"))
    assert str(err.value).startswith("swapped: rank 1，第 0 步：1B0 在它的輸入 1F0（階段 1，微批次 0）之前執行，"
                                     "而該輸入排在同一個 rank 的更後面（第 1 步）"), str(err.value)
    assert "\n步驟 " in str(err.value)  # the grid's header


# ----------------------------------------------------------------------------------------------
# Issue 28's "done when", read from the built zh-Hant editions: a figure's title and axes, a widget's
# labels, the quiz verdict, a prediction's message and an exercise's "not yet" verdict are Chinese.

VERDICT_WORDS = re.compile(r"\b(PASSED|FAILED|NOT YET|NOT PASSED|Correct\.|Not quite\.|quiz \S+ \(lesson)")


def _checks(path: Path) -> dict:
    """check id -> the text its check cell printed in the built edition."""
    nb = nbformat.read(path, as_version=4)
    return {check: "".join(o.get("text", "") for o in c.get("outputs", []))
            for c in nb.cells for check in [tags.check(c)[0]] if check}


@pytest.mark.parametrize("path", EDITIONS, ids=lambda p: p.name)
def test_the_built_editions_verdicts_are_chinese(path):
    """Every check cell of a zh-Hant edition prints Chinese: the graded quiz's check, a prediction's
    message before it is made, an exercise's "not yet" verdict; none of the English verdict words."""
    printed = _checks(path)
    assert any(tags.quiz(check) for check in printed), path.name
    for check, text in printed.items():
        assert text.strip() and CJK.search(text), (path.name, check, text[:200])
        assert not VERDICT_WORDS.search(text), (path.name, check, text[:200])
        if tags.quiz(check):
            assert text.startswith("測驗 ") and "（第 " in text, (check, text[:120])
        elif tags.prediction(check):
            assert text.startswith(f"預測 {tags.prediction(check)}：尚未完成"), (check, text[:120])
        else:
            assert "：尚未完成：" in text, (check, text[:120])


@pytest.mark.parametrize("name", ["00_why_split_a_model", "03_pipeline_bubble", "10_schedule_search", "17_faq"])
def test_the_built_editions_quiz_widget_speaks_chinese(name):
    """The practice quiz's stored text form (what shows where widgets do not render) has Chinese
    chrome: its head line, each question's kind and points, how to practise."""
    shown = next(text for text in _outputs(editions.EDITIONS[LANG] / f"{name}.ipynb", "text/plain")
                 if text.startswith("測驗："))
    head = shown.splitlines()[0]
    assert re.fullmatch(r"測驗：.+，共 \d+ 題、\d+ 分，及格 \d+ 分", head), head
    assert "（單選，1 分）" in shown and "練習一題：answer(" in shown
    assert not re.search(r"\b(questions|points|pass mark|one answer|Practise)\b", shown), shown[:300]


@pytest.mark.parametrize("name", ["03_pipeline_bubble", "10_schedule_search"])
def test_the_built_editions_figures_have_chinese_titles_and_axes(name):
    figures = _outputs(editions.EDITIONS[LANG] / f"{name}.ipynb", PLOTLY)
    titled = [f["layout"] for f in figures if f["layout"].get("title", {}).get("text")]
    assert titled, name
    for layout in titled:
        assert CJK.search(layout["title"]["text"]), layout["title"]["text"]
        axis = layout.get("xaxis", {}).get("title", {}).get("text", "")
        assert not axis or CJK.search(axis) or re.fullmatch(r"[\w ,=()/·×−+*^.-]*", axis) and \
            not re.search(r"[a-z]{4,}", axis), axis


def test_the_quiz_verdicts_and_invalid_answers_follow_the_language():
    """check_quiz's verdict, the practice feedback and its invalid-answer messages, the widget's
    buttons and score line: Chinese under zh-Hant, the same English as before under en."""
    from parallel_lab.course.quiz import check, load
    from parallel_lab.show.quizbox import quiz

    bank = load("03")
    single = next(item for item in bank.items if item.kind == "single")
    numeric = next(item for item in bank.items if item.kind == "numeric")
    with i18n.using(LANG):
        assert check.verdict(check.score(bank, {})).startswith("測驗 pipeline-line（第 03 課）：未通過：")
        assert check.passing_verdict(bank).startswith("測驗 pipeline-line（第 03 課）：通過")
        assert check.feedback(single, "z").message.startswith("無法讀取這個答案：'z' 不是選項；請從 a, b, c, d")
        assert check.feedback(numeric, "many").message == "無法讀取這個答案：'many' 不是數字。"
        wrong = next(o.key for o in single.options if o.key not in single.correct_keys())
        assert check.feedback(single, wrong).message.startswith("不太對。\n(")
        box = quiz("03")
    assert [box.views[0].check_button.description, box.views[0].retry_button.description] == ["檢查", "再試一次"]
    assert box.score_line.value.startswith("<b>得分：0 / ") and box.header_html.value.startswith("<h3>測驗：")
    assert check.feedback(single, "z", "en").message.startswith("Cannot read this answer: 'z' is not an option")
    assert check.verdict(check.score(bank, {})).startswith("quiz pipeline-line (lesson 03): NOT PASSED: 0 of ")


def test_an_exercises_verdict_and_refusal_follow_the_language():
    """An exercise's FAILED line and its reason, and the review's refusal of an answer, in Chinese under
    zh-Hant (the same judge and cases as in English)."""
    from parallel_lab.exercises import bubble_share, policy, ring_all_reduce

    with i18n.using(LANG):
        assert bubble_share.judge_case({"share": 0.5}, 4, 8, 1).startswith("回傳了 0.5000，模擬器算出的閒置比例是 ")
        refused = policy.review("import parallel_lab\ndef my_ring_all_reduce(t):\n    pass\n", ring_all_reduce.POLICY)
        verdict = ring_all_reduce.EXERCISE.screen("import os\ndef my_ring_all_reduce(t):\n    pass\n")
    assert refused == "匯入了 parallel_lab：函式庫自己的實作不算答案；請自己寫 my_ring_all_reduce"
    assert verdict.lines[0].startswith("環狀 all-reduce：未通過：你的答案匯入了 os：這個練習只能匯入 ")
    assert bubble_share.judge_case({"share": 0.5}, 4, 8, 1).startswith("returned 0.5000, the simulator's idle share")
