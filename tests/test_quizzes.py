"""Quiz banks (valid, FAQ covered in both languages, answers computed by the library), feedback,
scores, the text mode, the lesson cells, and the widget (which must never hold an answer key)."""

import contextlib
import html
import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from parallel_lab.course.quiz import answers, bank, check, load, load_all, text, validate

ROOT = Path(__file__).resolve().parent.parent
BANKS = ROOT / "quizzes"


@pytest.fixture(autouse=True)
def scratch_home(tmp_path, monkeypatch):
    """Passing a quiz writes progress.json: keep it out of the real home."""
    monkeypatch.setenv("PARALLEL_LAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PARALLEL_LAB_QUIZZES", raising=False)
    monkeypatch.delenv("PARALLEL_LAB_PASS_MARK", raising=False)


def right_answer(item):
    return item.value() if item.kind == "numeric" else sorted(item.correct_keys())


def perfect_sheet(b):
    return {item.id: right_answer(item) for item in b.items}


def secrets_of(b, lang):
    """Texts that would give answers away: every explanation, hint and option explanation."""
    found = []
    for item in b.items:
        for field in (item.explanation, item.hint):
            if field is not None:
                found.append(bank.localize(field, lang).split("{")[0].strip()[:60])
        found += [bank.localize(o.why, lang)[:60] for o in item.options]
    return [s for s in found if len(s) > 15]


# ------------------------------------------------------------------------------------------------
# The banks.


def test_every_bank_is_valid():
    assert validate.validate_all(BANKS) == []


def test_lessons_and_coming_topics_have_banks_of_five_to_eight_items():
    banks = {b.id: b for b in load_all(BANKS)}
    assert {"why-split", "collectives", "tensor-parallel", "pipeline-bubble", "pipeline-schedules",
            "faq"} <= set(banks)
    assert load("00").id == "why-split" and load("01").id == "collectives"
    for b in banks.values():
        if not b.faq:
            assert 5 <= len(b.items) <= 8, b.id


def test_faq_checks_each_of_the_six_entries_twice_in_both_languages():
    faq = load("faq")
    assert set(faq.languages) == {"en", "zh-Hant"}
    for entry in range(1, 7):
        items = [item for item in faq.items if item.faq == entry]
        assert len(items) >= 2, entry
        for item in items:
            for lang in ("en", "zh-Hant"):
                assert item.prompt[lang] and all(o.text[lang] and o.why[lang] for o in item.options)


def test_every_bank_is_bilingual_and_valid():
    """Every bank, lessons and FAQ alike, declares en and zh-Hant, carries both in every text field,
    and validates on its own."""
    banks = load_all(BANKS)
    # one bank per lesson (00-16, 18) and the FAQ's (17)
    assert len(banks) == 19 and {"zero-sharding", "mixture-of-experts", "long-context"} <= {b.id for b in banks}
    for b in banks:
        assert {"en", "zh-Hant"} <= set(b.languages), b.id
        errors, loaded = validate.validate_file(b.path, BANKS)
        assert errors == [] and loaded is not None, errors
        assert isinstance(b.title, dict) and b.title["zh-Hant"].strip(), b.id
        for item in b.items:
            for name, field in validate._texts(item):
                assert isinstance(field, dict) and field["en"].strip() and field["zh-Hant"].strip(), (item.id, name)
                # option texts may be API names or numbers, units symbols (GB, Ψ): the same in both
                if not name.endswith(" text") and name != "unit":
                    assert field["zh-Hant"] != field["en"], (item.id, name)  # translated, not copied


def test_every_numeric_item_gives_feedback_in_both_languages():
    for b in load_all(BANKS):
        for item in b.items:
            if item.kind == "numeric":
                assert check.feedback(item, item.value(), "zh-Hant").message.startswith("正確。"), item.id
                assert check.feedback(item, item.value(), "en").message.startswith("Correct."), item.id
                assert item.prompt_text("zh-Hant") != item.prompt_text("en")


# Taiwan usage: 列 is a row and 行 (or 欄) a column -- the opposite of mainland usage. Words in which
# 列 does not mean a matrix row at all:
NOT_A_ROW = ("序列", "下列", "排列", "命令列", "陣列", "佇列", "系列", "列出", "列表", "列舉")


def _zh_texts():
    for b in load_all(BANKS):
        fields = [("title", b.title)] + [(f"faq {e['entry']}", e["question"]) for e in b.faq]
        for item in b.items:
            fields += [(f"{item.id} {name}", field) for name, field in validate._texts(item)]
        for where, field in fields:
            if isinstance(field, dict) and "zh-Hant" in field:
                yield f"{b.path.name}: {where}", field["en"], field["zh-Hant"]


def test_rows_are_lie_and_columns_are_hang_in_taiwan_usage():
    """No zh-Hant text uses 列 for a column: every 列 that means a row says so, 列（row）or
    列平行（row-parallel）, in a text whose English is about rows; every 行（column）is about columns."""
    checked = 0
    for where, en, zh in _zh_texts():
        bare = zh
        for word in NOT_A_ROW:
            bare = bare.replace(word, "")
        for n in [i for i, c in enumerate(bare) if c == "列"]:
            assert bare[n + 1:].startswith(("（row", "平行（row")), f"{where}: 列 without （row）: {zh}"
            assert "row" in en.lower(), f"{where}: 列 (row) where the English has no row: {en}"
            checked += 1
        if "行（column" in zh or "欄（column" in zh:
            assert "column" in en.lower(), f"{where}: 行 (column) where the English has no column: {en}"
            checked += 1
        if "column" in en.lower() and "row" not in en.lower() and ("matri" in en.lower() or "split" in en.lower()):
            assert "行（column" in zh or "欄（column" in zh or "行平行（column" in zh, \
                f"{where}: a column, but no 行/欄（column）: {zh}"
    assert checked >= 10  # the test does look at the matrix texts


def test_faq_column_split_says_column_in_taiwan_usage():
    faq = load("faq")
    item = faq.item("column-split")
    assert "column" in item.prompt["en"]
    zh = item.prompt["zh-Hant"]
    assert ("按行" in zh or "按欄" in zh) and "（column）" in zh and "按列分割" not in zh
    assert "行（column）" in item.option("b").why["zh-Hant"] and "行（column）" in item.option("c").why["zh-Hant"]
    assert "按列（row）分割" in item.option("a").why["zh-Hant"]  # the row-split layer that follows
    tensor_split = faq.item("tensor-split")
    assert "按行（column）分割" in tensor_split.prompt["zh-Hant"]
    assert "列（row）" in next(o for o in tensor_split.options if "row" in o.text["en"].lower()).text["zh-Hant"]
    assert all("按列分割" not in zh for _, _, zh in _zh_texts())


def test_item_ids_are_unique_across_banks():
    ids = [item.id for b in load_all(BANKS) for item in b.items]
    assert len(ids) == len(set(ids))


def test_the_right_option_is_not_the_longest_one_in_most_single_choice_items():
    """A cue test-wise students use: the right answer is the longest, most qualified option. In at most
    about a third of the single-choice items is it strictly longer than every other option (in English;
    printed with the share where it is the shortest, the cue turned round)."""
    longest, shortest, total = [], [], 0
    for b in load_all(BANKS):
        for item in b.items:
            if item.kind != "single":
                continue
            total += 1
            lengths = {o.key: len(bank.localize(o.text, "en")) for o in item.options}
            right = sorted(item.correct_keys())[0]
            others = [n for key, n in lengths.items() if key != right]
            longest += [item.id] if lengths[right] > max(others) else []
            shortest += [item.id] if lengths[right] < min(others) else []
    print(f"single-choice items whose right option is the longest: {len(longest)} of {total} "
          f"({len(longest) / total:.0%}); the shortest: {len(shortest)} ({len(shortest) / total:.0%})")
    assert len(longest) <= total / 3 and len(shortest) <= total / 3, longest


def test_correct_options_are_spread_over_positions():
    """Authoring check: the right answer is not always (a)."""
    firsts = [sorted(item.correct_keys())[0] for b in load_all(BANKS) for item in b.items if item.options]
    assert max(firsts.count(k) for k in set(firsts)) < 0.5 * len(firsts)


# ------------------------------------------------------------------------------------------------
# Malformed banks: the error names the file and the item.


@pytest.fixture
def bank_copy(tmp_path):
    shutil.copytree(BANKS, tmp_path / "quizzes")
    directory = tmp_path / "quizzes"

    def edit(name, change):
        path = directory / name
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        change(data)
        path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
        return path
    return edit


def _item(data, item_id):
    return next(item for item in data["items"] if item["id"] == item_id)


def _option(data, item_id, correct=True):
    return next(o for o in _item(data, item_id)["options"] if bool(o.get("correct")) == correct)


MALFORMED = {
    "option without explanation": (
        "ranks_and_collectives.yaml", lambda d: _option(d, "collectives/identity", False).pop("why"),
        "ranks_and_collectives.yaml: item 'collectives/identity': options[0]: 'why' is a required property"),
    "two correct options in a single-choice item": (
        "ranks_and_collectives.yaml", lambda d: _option(d, "collectives/identity", False).update(correct=True),
        "ranks_and_collectives.yaml: item 'collectives/identity': a single-choice item needs exactly 1 correct "
        "option, got 2"),
    "unknown kind": (
        "ranks_and_collectives.yaml", lambda d: _item(d, "collectives/skipped").update(kind="essay"),
        "ranks_and_collectives.yaml: item 'collectives/skipped': kind: 'essay' is not one of"),
    "numeric item without a hint": (
        "ranks_and_collectives.yaml", lambda d: _item(d, "collectives/ring-bytes").pop("hint"),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': 'hint' is a required property"),
    "answer function outside parallel_lab": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes")["answer"].update(function="os:system"),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': answer:"),
    "answer function that does not exist": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes")["answer"].update(function="parallel_lab.course.quiz.answers:nope"),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': answer function "
        "'parallel_lab.course.quiz.answers:nope' cannot be imported"),
    "mistake that is the answer": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes")["mistakes"][0].update(answer={"value": 112}),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': mistake 1 (112) is within the tolerance"),
    "hint that gives the answer away": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes").update(hint="It is 112 MB."),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': the hint gives the answer away (112)"),
    "placeholder the params do not fill": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes").update(prompt="A ring of {nodes} nodes?"),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': prompt uses nodes"),
    "id without the bank prefix": (
        "ranks_and_collectives.yaml", lambda d: _item(d, "collectives/skipped").update(id="faq/skipped"),
        "ranks_and_collectives.yaml: item 'faq/skipped': id must start with the bank id 'collectives/'"),
    "lesson item without its zh-Hant prompt": (
        "ranks_and_collectives.yaml", lambda d: _item(d, "collectives/identity")["prompt"].pop("zh-Hant"),
        "ranks_and_collectives.yaml: item 'collectives/identity': prompt lacks language(s) zh-Hant "
        "(the bank declares en, zh-Hant)"),
    "lesson item with an English-only prompt": (
        "tensor_parallelism.yaml",
        lambda d: _item(d, "tensor-parallel/both-columns").update(prompt="What must happen between the two products?"),
        "tensor_parallelism.yaml: item 'tensor-parallel/both-columns': prompt lacks language(s) zh-Hant"),
    "option without its zh-Hant text": (
        "ranks_and_collectives.yaml", lambda d: _option(d, "collectives/identity", False)["text"].pop("zh-Hant"),
        "ranks_and_collectives.yaml: item 'collectives/identity': option a text lacks language(s) zh-Hant"),
    "option with a blank zh-Hant explanation": (
        "pipeline_bubble.yaml",
        lambda d: _option(d, "pipeline-bubble/why-microbatches")["why"].update({"zh-Hant": "  "}),
        "pipeline_bubble.yaml: item 'pipeline-bubble/why-microbatches': option a why lacks language(s) zh-Hant"),
    "mistake without its zh-Hant explanation": (
        "ranks_and_collectives.yaml", lambda d: _item(d, "collectives/ring-bytes")["mistakes"][2]["why"].pop("zh-Hant"),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': mistake 3 why lacks language(s) zh-Hant"),
    "hint without its zh-Hant text": (
        "planner.yaml", lambda d: _item(d, "planner/gpu-hours")["hint"].pop("zh-Hant"),
        "planner.yaml: item 'planner/gpu-hours': hint lacks language(s) zh-Hant"),
    "title without its zh-Hant text": (
        "balancing.yaml", lambda d: d["title"].pop("zh-Hant"),
        "balancing.yaml: title lacks language(s) zh-Hant"),
    "translation that changes a placeholder": (
        "ranks_and_collectives.yaml",
        lambda d: _item(d, "collectives/ring-bytes")["prompt"].update(
            {"zh-Hant": "環狀 all-reduce 在 {ranks} 個 rank 上加總 {size} MB，每個 rank 送出多少 MB？"}),
        "ranks_and_collectives.yaml: item 'collectives/ring-bytes': prompt in zh-Hant has placeholders "
        "{ranks}, {size}, but in en {ranks}, {size:g}"),
    "lesson bank declaring only English": (
        "capstone.yaml", lambda d: d.update(languages=["en"]),
        "capstone.yaml: quiz banks are bilingual: en + zh-Hant; languages is [en], missing zh-Hant"),
    "FAQ bank declaring only English": (
        "faq.yaml", lambda d: d.update(languages=["en"]),
        "faq.yaml: quiz banks are bilingual: en + zh-Hant"),
    "FAQ item without Traditional Chinese": (
        "faq.yaml", lambda d: _item(d, "faq/why-in-node")["prompt"].pop("zh-Hant"),
        "faq.yaml: item 'faq/why-in-node': prompt lacks language(s) zh-Hant"),
    "FAQ entry checked once": (
        "faq.yaml", lambda d: d["items"].remove(_item(d, "faq/placement")),
        "faq.yaml: FAQ entry 6 is checked by 1 item(s), needs at least 2"),
    "FAQ item without its entry": (
        "faq.yaml", lambda d: _item(d, "faq/placement").pop("faq"),
        "faq.yaml: item 'faq/placement': every FAQ item names the entry it checks"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_bank_error_names_file_and_item(bank_copy, case):
    name, change, expected = MALFORMED[case]
    path = bank_copy(name, change)
    errors, _ = validate.validate_file(path, path.parent)
    assert any(e.startswith(expected) for e in errors), errors


def test_missing_translation_fails_the_whole_validation(bank_copy, capsys):
    """validate_all and the command fail on one missing zh-Hant text, naming bank, item, field and language."""
    path = bank_copy("pipeline_schedules.yaml",
                     lambda d: _option(d, "pipeline-schedules/zb-v-placement")["text"].pop("zh-Hant"))
    errors = validate.validate_all(path.parent)
    assert errors == ["pipeline_schedules.yaml: item 'pipeline-schedules/zb-v-placement': option c text lacks "
                      "language(s) zh-Hant (the bank declares en, zh-Hant)"]
    assert validate.main([str(path.parent)]) == 1
    assert "option c text lacks language(s) zh-Hant" in capsys.readouterr().err


def test_english_only_bank_fails_even_when_every_text_is_english(bank_copy):
    def english_only(data):
        data["languages"] = ["en"]
        data["title"] = data["title"]["en"]
        for item in data["items"]:
            for holder in [item] + item.get("options", []) + item.get("mistakes", []):
                for key in ("prompt", "text", "why", "explanation", "hint"):
                    if isinstance(holder.get(key), dict):
                        holder[key] = holder[key]["en"]
    path = bank_copy("why_split_a_model.yaml", english_only)
    errors, _ = validate.validate_file(path, path.parent)
    assert errors == ["why_split_a_model.yaml: quiz banks are bilingual: en + zh-Hant; languages is [en], "
                      "missing zh-Hant"]


def test_duplicate_ids_and_lessons_across_banks_are_named(bank_copy):
    path = bank_copy("faq.yaml", lambda d: _item(d, "faq/placement").update(id="collectives/identity"))
    bank_copy("tensor_parallelism.yaml", lambda d: d.update(lesson="01"))
    errors = validate.validate_all(path.parent)
    assert "ranks_and_collectives.yaml: item 'collectives/identity': id also used in faq.yaml" in errors
    assert "tensor_parallelism.yaml: lesson '01' is also used by ranks_and_collectives.yaml" in errors


def test_invalid_yaml_names_the_file(tmp_path):
    shutil.copytree(BANKS, tmp_path / "q")
    (tmp_path / "q" / "broken.yaml").write_text("id: [unclosed\n")
    errors = validate.validate_all(tmp_path / "q")
    assert len(errors) == 1 and errors[0].startswith("broken.yaml: not valid YAML")


def test_validate_command_exit_status(capsys):
    assert validate.main([str(BANKS)]) == 0
    assert "quiz banks valid" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# Parametrised answers come from the library.


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 32)])
def test_bubble_fractions_match_the_papers(p, m):
    assert answers.bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / (m + p - 1))
    assert answers.bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / (m + p - 1))
    assert answers.bubble_ratio("gpipe", p, m) == pytest.approx((p - 1) / m)


def test_other_computed_answers():
    assert answers.bubble_ratio("interleaved-1f1b", 4, 8, virtual=2) == pytest.approx(3 / 16)
    assert [answers.peak_activations("1f1b", 4, 8, r) for r in range(4)] == [4, 3, 2, 1]
    assert answers.microbatches_for_bubble("gpipe", 8, 0.05) == 133
    assert answers.ring_all_reduce_sent(64, 8) == pytest.approx(112)
    assert answers.all_reduce_time(1, 4, 10, 10) == pytest.approx(210)
    assert answers.model_state_gb(7) == pytest.approx(112)
    assert answers.min_gpus(175) == 35


def test_every_numeric_item_computes_and_accepts_its_own_answer():
    for b in load_all(BANKS):
        for item in b.items:
            if item.kind == "numeric":
                value = item.value()
                assert math.isfinite(value)
                assert check.feedback(item, value).correct, item.id
                assert check.feedback(item, str(value)).correct, item.id


# ------------------------------------------------------------------------------------------------
# Feedback and scores.


def test_feedback_explains_the_chosen_option_and_allows_retry():
    item = load("01").item("identity")
    wrong = next(o for o in item.options if not o.correct)
    right = next(o for o in item.options if o.correct)
    first = check.feedback(item, wrong.key)
    why = {o.key: bank.localize(o.why).strip() for o in item.options}  # the English of each explanation
    assert first.status == "wrong" and why[wrong.key] in first.message and "Try again." in first.message
    assert why[right.key] not in first.message  # a wrong answer does not reveal the right one
    second = check.feedback(item, right.key.upper())
    assert second.correct and why[right.key] in second.message
    in_chinese = check.feedback(item, wrong.key, "zh-Hant")
    assert in_chinese.status == "wrong" and bank.localize(wrong.why, "zh-Hant").strip() in in_chinese.message


def test_multiple_choice_needs_exactly_the_right_set():
    item = load("01").item("everyone-has-all")
    keys = sorted(item.correct_keys())
    assert check.feedback(item, keys).correct
    assert check.feedback(item, ", ".join(reversed(keys))).correct
    partial = check.feedback(item, keys[:-1])
    assert partial.status == "wrong" and "You left out 1 correct option." in partial.message


def test_numeric_feedback_recognises_mistakes_and_hints_otherwise():
    item = load("01").item("ring-bytes")
    assert check.feedback(item, 112.5).correct  # within 1 %
    assert "only the reduce-scatter phase" in check.feedback(item, 56).message
    hint = check.feedback(item, 3)
    assert hint.status == "wrong" and bank.localize(item.hint) in hint.message and "112" not in hint.message


def test_invalid_and_missing_responses():
    item = load("01").item("identity")
    assert check.feedback(item, "z").status == "invalid"
    assert "'z' is not an option" in check.feedback(item, "z").message
    assert check.feedback(item, "a, b").status == "invalid"
    assert check.feedback(item, None).status == "unanswered"
    assert check.feedback(load("01").item("ring-bytes"), "lots").status == "invalid"


def test_feedback_in_traditional_chinese():
    item = load("faq").item("naive-bubble")
    assert check.feedback(item, 0.75, "zh-Hant").message.startswith("正確。0.75")
    assert check.feedback(item, 0.25, "zh-Hant").message.startswith("不太對。這是忙碌的比例")


def right_sheet_for(b, student):
    """A correct answer sheet for ``student``'s graded quiz."""
    from parallel_lab.course.quiz.variant import variant

    return perfect_sheet(variant(b, student))


def test_the_graded_check_reports_the_choice_points_never_which_answers_are_wrong(capsys):
    b = load("01")
    sheet = right_sheet_for(b, "s1001")
    first_choice = next(item for item in b.items if item.kind == "single")
    sheet[first_choice.id] = next(o.key for o in b.item(first_choice.id).options if o.key != sheet[first_choice.id])
    result = text.check_quiz("01", {**sheet, "typo": "b", "collectives/ring-bytes": "lots"}, "s1001")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("quiz collectives (lesson 01), student s1001: 5 of 6 points on the choice questions; 2 points "
                      "of numeric answers are scored by your instructor's grader; pass mark 6 of 8 points")
    assert out[1:] == ["  typo: no such question in this quiz"]  # an unreadable numeric answer is the grader's
    assert result.points == 5 and first_choice.id not in capsys.readouterr().out
    text.check_quiz("01", {}, None)
    assert "no student id yet" in capsys.readouterr().out


def test_the_grader_lists_what_is_not_right(capsys):
    result = check.score(load("01"), {"identity": "a", "ring-bytes": 112, "typo": "b"})
    out = check.verdict(result).splitlines()
    assert out[0] == "quiz collectives (lesson 01): NOT PASSED: 1 of 8 points, pass mark 6"
    assert "  collectives/identity: wrong" in out and "  collectives/skipped: not answered" in out
    assert out[-1] == "  typo: no such question in this quiz"
    assert check.passing_verdict(load("01")) == "quiz collectives (lesson 01): PASSED (pass mark: 6 of 8 points)"


def test_pass_mark_is_configurable(monkeypatch):
    b = load("01")
    assert b.points_needed() == 6 and b.points_needed(1.0) == 8
    monkeypatch.setenv("PARALLEL_LAB_PASS_MARK", "0.5")
    assert b.points_needed() == 4


# ------------------------------------------------------------------------------------------------
# Text mode and the lesson cells.


@pytest.mark.parametrize("name,lang", [("00", "en"), ("01", "en"), ("tensor-parallel", "en"),
                                       ("pipeline-bubble", "en"), ("pipeline-schedules", "en"),
                                       ("faq", "en"), ("faq", "zh-Hant"), ("00", "zh-Hant"),
                                       ("01", "zh-Hant"), ("tensor-parallel", "zh-Hant"),
                                       ("pipeline-bubble", "zh-Hant"), ("pipeline-schedules", "zh-Hant"),
                                       ("recompute-pipedream", "zh-Hant"), ("balancing", "zh-Hant"),
                                       ("3d-parallelism", "zh-Hant"), ("planner", "zh-Hant"),
                                       ("capstone", "zh-Hant"), ("pipeline-line", "zh-Hant"),
                                       ("pipeline-1f1b", "zh-Hant"), ("interleaved", "zh-Hant"),
                                       ("cost-model", "en")])
def test_text_form_shows_questions_but_no_answers(name, lang):
    b = load(name)
    shown = text.quiz_text(name, lang)
    assert shown == text.quiz_text(name, lang)  # deterministic
    for item in b.items:
        assert item.prompt_text(lang).split()[0] in shown
    for secret in secrets_of(b, lang):
        assert secret not in shown
    assert "correct" not in shown.lower()


def test_answer_prints_feedback(capsys):
    result = text.answer("01", "collectives/ring-bytes", 112)
    assert result.correct
    assert capsys.readouterr().out.startswith("collectives/ring-bytes: Correct. 112 MB = 2(p−1)/p")
    assert text.answer("01", "ring-bytes", 112, lang="zh-Hant").correct  # lesson banks are bilingual now
    assert capsys.readouterr().out.startswith("collectives/ring-bytes: 正確。112 MB = 2(p−1)/p")
    with pytest.raises(ValueError, match="available in en, zh-Hant, not 'fr'"):
        text.answer("01", "ring-bytes", 1, lang="fr")
    with pytest.raises(KeyError, match="quiz collectives has no question 'nope'"):
        text.answer("01", "nope", 1)


def _build_lessons():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_lessons
    finally:
        sys.path.pop(0)
    return build_lessons


@pytest.mark.parametrize("lesson", ["00", "01"])
def test_lesson_cells_parse_and_run_deterministically(lesson):
    cells = _build_lessons().parse(text.lesson_cells(lesson))
    kinds = [(c.cell_type, c.metadata.get("tags", [])) for c in cells]
    assert kinds == [("markdown", []), ("code", ["nbval-ignore-output"]), ("code", ["student-id"]),
                     ("code", [f"answer:quiz:{lesson}"]), ("code", [f"check:quiz:{lesson}", "points:3"])]
    for student in (None, "s1001"):
        namespace, outputs = {}, []
        for cell in cells[1:]:
            source = cell.source if student is None else cell.source.replace(
                "my_student_id = None", f"my_student_id = {student!r}")
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(source, namespace)
            outputs.append(buffer.getvalue())
        assert outputs[0] == ""  # the widget is built, not printed
        if student is None:
            assert "write it in my_student_id" in outputs[1] and "no student id yet" in outputs[3]
        else:
            assert "drawn for student id s1001" in outputs[1] and text.quiz_text(lesson) not in outputs[1]
            assert outputs[3].startswith(f"quiz {load(lesson).label()}, student s1001: 0 of")
        for secret in secrets_of(load(lesson), "en"):
            assert all(secret not in out for out in outputs) and secret not in text.lesson_cells(lesson)


# ------------------------------------------------------------------------------------------------
# The widget.


def widget_state(box) -> str:
    from ipywidgets.embed import dependency_state

    return json.dumps(dependency_state([box], drop_defaults=False), ensure_ascii=False)


@pytest.mark.parametrize("name,lang", [("00", "en"), ("01", "en"), ("tensor-parallel", "en"),
                                       ("pipeline-bubble", "en"), ("pipeline-schedules", "en"),
                                       ("faq", "zh-Hant"), ("01", "zh-Hant"), ("tensor-parallel", "zh-Hant"),
                                       ("planner", "zh-Hant"), ("interleaved", "en"), ("cost-model", "zh-Hant")])
def test_widget_state_holds_no_answer_key(name, lang):
    """What nbclient or JupyterLab save into a notebook's metadata: prompts and option labels, but
    no explanation, hint or answer -- until the student answers, and then only their own."""
    from parallel_lab.show.quizbox import quiz

    b = load(name)
    box = quiz(name, lang)
    state = widget_state(box)
    assert b.items[0].prompt_text(lang)[:30] in state  # the state is what we think it is
    for secret in secrets_of(b, lang):
        assert secret not in state
    for item in b.items:
        if item.kind == "numeric":
            assert check.format_value(item, item.value()) not in state
        assert '"correct"' not in state
    numeric = next(v for v in box.views if v.item.kind == "numeric")
    numeric.number_box.value = str(b.item(numeric.item.id).value())
    numeric.check_button.click()
    shown = check.feedback(b.item(numeric.item.id), numeric.number_box.value, lang).message
    assert html.escape(shown)[:16] in widget_state(box)  # control: the check does find feedback


def test_widget_feedback_score_retry_and_language():
    from parallel_lab.show.quizbox import quiz

    b = load("faq")
    box = quiz("faq")
    view = box.views[0]
    item = b.item(view.item.id)
    wrong = next(o for o in item.options if not o.correct).key
    view.choice.value = wrong
    view.check_button.click()
    assert "Not quite." in view.feedback.value and "Score: 0 of 12 points" in box.score_line.value
    view.retry_button.click()
    assert view.feedback.value == "" and view.choice.value is None
    view.choice.value = sorted(item.correct_keys())[0]
    view.check_button.click()
    assert "Correct." in view.feedback.value and "Score: 1 of 12 points (pass mark 9)" in box.score_line.value
    box.language.value = "zh-Hant"
    assert "正確。" in view.feedback.value and item.prompt["zh-Hant"][:10] in view.prompt.value
    assert view.choice.value == sorted(item.correct_keys())[0]  # kept across the switch
    assert "得分：1 / 12 分" in box.score_line.value


def test_a_numeric_unit_is_in_the_quiz_language():
    """A unit is a text like the prompt: the widget, the text form and a formatted value give it in the
    quiz's language, and switching the language switches it."""
    from parallel_lab.show.quizbox import quiz

    item = load("interleaved").item("interleaved/gpu0-stash")
    assert item.unit_text("en").startswith("stashes") and item.unit_text("zh-Hant").startswith("份暫存")
    assert check.format_value(item, 23, "zh-Hant") == "23 份暫存（一個微批次在一個區塊上）"
    assert ", in stashes" in text.quiz_text("interleaved", "en")
    assert "份暫存（一個微批次在一個區塊上）" in text.quiz_text("interleaved", "zh-Hant")
    box = quiz("interleaved", "zh-Hant")
    view = next(v for v in box.views if v.item.id == item.id)
    assert view.unit.value == item.unit["zh-Hant"] and "stashes" not in widget_state(box)
    box.language.value = "en"
    assert view.unit.value == item.unit["en"]


def test_widget_shows_the_text_quiz_where_widgets_do_not_render():
    from parallel_lab.show.quizbox import quiz

    bundle = quiz("01")._repr_mimebundle_()
    assert bundle["text/plain"] == text.quiz_text("01")
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_widget_passing_records_progress():
    from parallel_lab.course.quiz import progress
    from parallel_lab.show.quizbox import quiz

    b = load("01")
    box = quiz("01")
    for view in box.views:
        value = right_answer(b.item(view.item.id))
        if view.item.kind == "single":
            view.choice.value = value[0]
        elif view.item.kind == "multiple":
            for (key, _), tick in zip(view.item.options, view.boxes):
                tick.value = key in value
        else:
            view.number_box.value = str(value)
        view.check_button.click()
    assert "Passed!" in box.score_line.value and progress.lessons_passed() == ["01"]


# ----------------------------------------------------------------------------------------------
# Numbers a quiz quotes from a lesson are the library's numbers (the quiz and the lesson cannot
# drift apart: both print what these functions return).


def _item_text(bank_name: str, item_id: str) -> str:
    raw = yaml.safe_load((BANKS / f"{bank_name}.yaml").read_text(encoding="utf-8"))
    return json.dumps(next(i for i in raw["items"] if i["id"] == item_id), ensure_ascii=False)


def test_quoted_tp_layer_numbers_are_lesson_11s():
    from parallel_lab.hardware import SYSTEMS
    from parallel_lab.planning.cost import tp_layer_step

    dgx = SYSTEMS["DGX H100"]
    compute, fast = tp_layer_step(2048, 12288, 8, dgx.nvlink, dgx.tflops * 1e12)
    slow = tp_layer_step(2048, 12288, 8, dgx.network, dgx.tflops * 1e12)[1]
    quoted = _item_text("3d_parallelism", "3d-parallelism/tp-ib-ratio")
    for value in (compute, fast, slow):
        assert f"{value * 1e3:.2f} ms" in quoted
    assert load("3d-parallelism").item("3d-parallelism/tp-ib-ratio").answer["value"] == pytest.approx(
        (compute + slow) / (compute + fast), rel=0.005)


def test_quoted_planner_numbers_are_lesson_16s():
    from parallel_lab.planning import memory_model, planner
    from parallel_lab.show import planner as pw

    # the item is about the search without ZeRO (with it, ZeRO-1 puts TP 2 x PP 32 first: lesson 16)
    plans = planner.plan(pw.GPT3, pw.CLUSTER, pw.BATCH, zero=(0,))["plans"]
    why = _item_text("planner", "planner/why-tp4")
    for tp in (4, 8):
        for schedule in ("zb-h1", "1f1b"):
            # the item: dp 8, m 192
            parts = pw.best_plan(plans, tp=tp, dp=8, microbatches=192, schedule=schedule)["breakdown"]
            assert f"{parts['bubble_s']:.2f} s" in why, (tp, schedule)
        parts = pw.best_plan(plans, tp=tp, dp=8, microbatches=192, schedule="zb-h1")["breakdown"]
        assert f"{parts['tp_comm_s']:.2f} s" in why
    fit = _item_text("planner", "planner/make-it-fit")
    for dp, pp, tp, m in ((8, 16, 4, 192), (16, 16, 4, 96), (4, 16, 8, 384)):
        gb = memory_model.max_device_memory(pw.GPT3, micro_batch=1, dp=dp, pp=pp, tp=tp, sequence_parallel=True,
                                            schedule="gpipe", microbatches=m, recompute="full")["total"] / 1e9
        assert f"{gb:.1f} GB" in fit, (dp, pp, tp)


def test_the_measure_gap_item_says_what_the_capstone_prediction_counts():
    """capstone/measure-gap: the capstone's prediction already shares the cores among the ranks
    (validate_plans.predict: all ranks' compute over the cores calibration found, plus the
    communication, when there are more ranks than cores), so the item may not blame a gap on a model
    that leaves the sharing out; it says what the model does count, and what it assumes instead."""
    from parallel_lab.exercises import capstone

    cfg = capstone.plan_config({"dp": 2, "pp": 2, "tp": 1, "schedule": "1f1b", "microbatches": 2})
    constants = {"tflops": 0.001, "latency_us": 500.0, "intra_gbps": 0.5}
    laptop = capstone.model_prediction(cfg, constants, 0.002, 2.0)["time"]  # 4 ranks on 2 cores
    own = capstone.model_prediction(cfg, constants, 0.002, 4.0)["time"]  # a core per rank
    comm = laptop["tp_comm_s"] + laptop["pp_comm_s"] + laptop["dp_comm_s"]
    assert laptop["shared_s"] == pytest.approx(laptop["compute_s"] * 4 / 2 + comm)
    assert laptop["step_s"] == max(laptop["planner_s"], laptop["shared_s"]) > own["step_s"] == own["planner_s"]
    item = load("capstone").item("capstone/measure-gap")
    right = next(o for o in item.options if o.correct)
    assert "already counts the 4 ranks sharing" in item.prompt["en"]
    assert "已經算進 4 個 rank 共用" in item.prompt["zh-Hant"]
    assert "divided by those cores, plus the communication" in right.why["en"]
    assert "除以這些核心數，再加上通訊" in right.why["zh-Hant"]
    said = json.dumps(_item_text("capstone", "capstone/measure-gap"), ensure_ascii=False)
    assert "the model does not" not in said and "模型卻沒有" not in said
