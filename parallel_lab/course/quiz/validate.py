"""Validate quiz banks: the JSON Schema (``quizzes/schema.json``) plus what a schema cannot state.

    .venv/bin/python -m parallel_lab.course.quiz.validate          # every bank; exit 1 with the errors
    from parallel_lab.course.quiz.validate import validate_all
    validate_all()                                          # -> [] or ["faq.yaml: item 'faq/x': ..."]

Invariants (each error names the file and the item):
- the bank matches the schema; item ids start with the bank id and are unique across all banks;
  bank ids and lesson numbers are unique; a lesson bank has 5 to 8 items;
- every bank is bilingual: its ``languages`` include en and zh-Hant (``REQUIRED_LANGUAGES``);
- every text (title, FAQ questions, prompt, options and their ``why``, unit, explanation, hint, mistakes)
  carries every language the bank declares, each non-blank, with the same placeholders as the English;
- choices: unique keys, an explanation (``why``) for every option, exactly one correct option for
  ``single``, at least one for ``multiple``; no text names an option by its letter ("(b)", "option
  c"): each student's graded quiz puts the options in another order (``course.quiz.variant``);
- numeric: the answer computes (a ``parallel_lab`` function, called with its params), every
  placeholder in prompt, explanation and hint is filled, the hint does not contain the answer,
  and no listed mistake is within the tolerance of the answer; ``vary`` names parameters of the
  function, and at least two of its combinations compute an answer other than the practice one
  (the graded quizzes' numbers), none of which the hint gives away;
- the FAQ bank lists entries 1..6 and checks each with at least two items (``faq: n``).
"""

from __future__ import annotations

import json
import re
import string
import sys
from functools import lru_cache
from pathlib import Path

from .bank import BankError, _read, bank_dir, bank_files, bank_from_data, resolve

FAQ_ENTRIES = 6            # the source article's FAQ (quizzes/faq_source.md)
MIN_ITEMS_PER_FAQ_ENTRY = 2
LESSON_ITEMS = (5, 8)      # a lesson's quiz: enough to teach, short enough to finish
REQUIRED_LANGUAGES = ("en", "zh-Hant")  # every bank: English and Traditional Chinese (Taiwan)


def schema(directory: Path | None = None) -> dict:
    return json.loads(((directory or bank_dir()) / "schema.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=8)
def _validator(text: str):
    # Imported only when a bank is validated: jsonschema takes 2.7 s to import here (it builds an
    # IRI parser), and every quiz a student opens would otherwise pay it.
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(text))


def _where(path: Path, data: dict, error_path) -> str:
    """``file: item 'id'`` (or ``item #n``) and the field path of a schema error."""
    parts = list(error_path)
    where = path.name
    if len(parts) >= 2 and parts[0] == "items" and isinstance(parts[1], int):
        items = data.get("items") or []
        raw = items[parts[1]] if parts[1] < len(items) else {}
        item_id = raw.get("id") if isinstance(raw, dict) else None
        where += f": item {item_id!r}" if item_id else f": item #{parts[1] + 1}"
        parts = parts[2:]
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return f"{where}: {field}" if field else where


def schema_errors(path: Path, data, directory: Path | None = None) -> list[str]:
    validator = _validator(json.dumps(schema(directory), sort_keys=True))
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(path, data if isinstance(data, dict) else {}, e.absolute_path)}: {_message(e)}"
            for e in errors]


def _message(error) -> str:
    if error.validator == "oneOf" and error.context:  # say what the closest alternative missed
        best = min(error.context, key=lambda e: len(list(e.absolute_path)))
        return best.message
    return error.message


def _texts(item) -> list[tuple[str, object]]:
    fields = [("prompt", item.prompt), ("unit", item.unit or None), ("explanation", item.explanation),
              ("hint", item.hint)]
    for o in item.options:
        fields += [(f"option {o.key} text", o.text), (f"option {o.key} why", o.why)]
    fields += [(f"mistake {n} why", m.why) for n, m in enumerate(item.mistakes, 1)]
    return [(name, text) for name, text in fields if text is not None]


def _placeholders(text: str) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text) if name}


def _fields(text: str) -> list[tuple]:
    """The replacement fields of a format string, as (name, format spec, conversion), sorted."""
    return sorted((name, spec or "", conv or "") for _, name, spec, conv in string.Formatter().parse(text)
                  if name is not None)


def _show(fields) -> str:
    return ", ".join("{" + n + (":" + s if s else "") + ("!" + c if c else "") + "}" for n, s, c in fields) or "none"


def text_errors(where: str, name: str, text, languages) -> list[str]:
    """A text field lacks none of the bank's ``languages`` (a plain string is English only), and
    every translation has the same placeholders as the English (``{ranks}``, ``{answer:g}``)."""
    texts = {"en": text} if isinstance(text, str) else dict(text)
    have = {lang for lang, s in texts.items() if isinstance(s, str) and s.strip()}
    missing = [lang for lang in languages if lang not in have]
    errors = []
    if missing:
        errors.append(f"{where}: {name} lacks language(s) {', '.join(missing)} (the bank declares "
                      f"{', '.join(languages)})")
    try:
        english = _fields(texts["en"])
    except (KeyError, TypeError, ValueError):
        return errors  # no English, or malformed braces: reported by the schema and the numeric checks
    for lang in sorted(have - {"en"}):
        try:
            fields = _fields(texts[lang])
        except ValueError as exc:
            errors.append(f"{where}: {name} in {lang}: malformed placeholder: {exc}")
            continue
        if fields != english:
            errors.append(f"{where}: {name} in {lang} has placeholders {_show(fields)}, but in en "
                          f"{_show(english)}; keep them unchanged in every language")
    return errors


def bank_errors(bank) -> list[str]:
    """Bank-level invariants: the bank is bilingual, and its title and FAQ questions carry every
    declared language."""
    name = bank.path.name if bank.path else bank.id
    errors = []
    absent = [lang for lang in REQUIRED_LANGUAGES if lang not in bank.languages]
    if absent:
        errors.append(f"{name}: quiz banks are bilingual: {' + '.join(REQUIRED_LANGUAGES)}; languages is "
                      f"[{', '.join(bank.languages)}], missing {', '.join(absent)}")
    errors += text_errors(name, "title", bank.title, bank.languages)
    for entry in bank.faq:
        errors += text_errors(name, f"faq entry {entry['entry']} question", entry["question"], bank.languages)
    return errors


def item_errors(bank, item) -> list[str]:
    """Invariants of one loaded item that the schema cannot state."""
    errors, where = [], item.source
    if not item.id.startswith(bank.id + "/"):
        errors.append(f"{where}: id must start with the bank id {bank.id + '/'!r}")
    for name, text in _texts(item):
        errors += text_errors(where, name, text, bank.languages)
    if item.kind in ("single", "multiple"):
        keys = [o.key for o in item.options]
        if len(set(keys)) != len(keys):
            errors.append(f"{where}: option keys must be unique, got {keys}")
        letter = _letter_reference(item)
        if letter:
            errors.append(f"{where}: {letter[0]} names option ({letter[1]}) by its letter; each student's graded "
                          f"quiz orders the options differently: name the option by what it says")
        n_correct = len(item.correct_keys())
        if item.kind == "single" and n_correct != 1:
            errors.append(f"{where}: a single-choice item needs exactly 1 correct option, got {n_correct}")
        if item.kind == "multiple" and n_correct < 1:
            errors.append(f"{where}: a multiple-choice item needs at least 1 correct option, got 0")
        return errors
    return errors + _numeric_errors(item)


LETTER = re.compile(r"\(([a-h])\)|\boptions? \(?([a-h])\b")


def _letter_reference(item) -> tuple[str, str] | None:
    """(field, letter) of the first text that names one of the item's options by its key."""
    keys = {o.key for o in item.options}
    for name, text in _texts(item):
        for lang_text in ([text] if isinstance(text, str) else text.values()):
            for match in LETTER.finditer(lang_text):
                letter = match.group(1) or match.group(2)
                if letter in keys:
                    return name, letter
    return None


def _vary_errors(item, answer: float) -> list[str]:
    """A numeric item's graded variants (``vary``): parameters the function takes, at least two
    that compute an answer other than the practice one, no hint that gives one away."""
    from .variant import graded_params

    where = item.source
    if "function" not in (item.answer or {}):
        return [f"{where}: vary needs an answer computed by a function (a literal value cannot vary)"]
    unknown = sorted(set(item.vary) - set(item.params))
    if unknown:
        return [f"{where}: vary names {', '.join(unknown)}, which answer.params does not give (it gives "
                f"{', '.join(sorted(item.params)) or 'none'})"]
    choices = graded_params(item)
    if len(choices) < 2:
        return [f"{where}: vary gives {len(choices)} graded variant(s) whose answer computes and differs from the "
                f"practice answer ({answer:g}); a graded quiz needs at least 2"]
    errors = []
    for params in choices:
        value = resolve({"function": item.answer["function"], "params": params}, where)
        for lang_text in [item.hint] if isinstance(item.hint, str) else (item.hint or {}).values():
            if re.search(rf"(?<![\d.]){re.escape(f'{value:g}')}(?![\d.])", lang_text.format(**params)):
                errors.append(f"{where}: the hint gives the graded variant {params}'s answer away ({value:g})")
    return errors


def _numeric_errors(item) -> list[str]:
    where, params = item.source, item.params
    allowed = {"prompt": set(params), "unit": set(), "hint": set(params), "explanation": set(params) | {"answer"}}
    errors = []
    for name, text in _texts(item):
        known = allowed.get(name, set(params) | {"answer"})
        for lang_text in ([text] if isinstance(text, str) else text.values()):
            try:
                unknown = _placeholders(lang_text) - known
            except ValueError as exc:
                errors.append(f"{where}: {name}: malformed placeholder: {exc}")
                continue
            if unknown:
                errors.append(f"{where}: {name} uses {', '.join(sorted(unknown))}, which the item's params "
                              f"({', '.join(sorted(params)) or 'none'}) do not give")
    try:
        answer = item.value()
    except BankError as exc:
        return errors + [str(exc)]
    except Exception as exc:  # the named function failed: report it with the item
        return errors + [f"{where}: answer function raised {type(exc).__name__}: {exc}"]
    for lang_text in [item.hint] if isinstance(item.hint, str) else (item.hint or {}).values():
        hint = lang_text.format(**params)
        if re.search(rf"(?<![\d.]){re.escape(f'{answer:g}')}(?![\d.])", hint):
            errors.append(f"{where}: the hint gives the answer away ({answer:g})")
    for n, mistake in enumerate(item.mistakes, 1):
        try:
            wrong = resolve(mistake.answer, where)
        except Exception as exc:
            errors.append(f"{where}: mistake {n} does not compute: {exc}")
            continue
        if item.within_tolerance(wrong, answer):
            errors.append(f"{where}: mistake {n} ({wrong:g}) is within the tolerance of the answer "
                          f"({answer:g}), so it would be marked correct")
    if item.vary:
        errors += _vary_errors(item, answer)
    return errors


def faq_errors(bank) -> list[str]:
    """The FAQ bank covers entries 1..FAQ_ENTRIES, each with enough items, in both languages."""
    name = bank.path.name if bank.path else bank.id
    errors = []  # both languages: bank_errors, as for every bank
    listed = sorted(e["entry"] for e in bank.faq)
    if listed != list(range(1, FAQ_ENTRIES + 1)):
        errors.append(f"{name}: faq must list entries 1..{FAQ_ENTRIES} once each, got {listed}")
    for item in bank.items:
        if item.faq is None:
            errors.append(f"{item.source}: every FAQ item names the entry it checks (faq: 1..{FAQ_ENTRIES})")
        elif item.faq not in listed:
            errors.append(f"{item.source}: faq {item.faq} is not one of the listed entries {listed}")
    for entry in listed:
        n = sum(item.faq == entry for item in bank.items)
        if n < MIN_ITEMS_PER_FAQ_ENTRY:
            errors.append(f"{name}: FAQ entry {entry} is checked by {n} item(s), needs at least "
                          f"{MIN_ITEMS_PER_FAQ_ENTRY}")
    return errors


def validate_file(path: Path, directory: Path | None = None) -> tuple[list[str], object]:
    """Errors of one bank file, and the loaded Bank (None when it does not load)."""
    path = Path(path)
    try:
        data = _read(path)
    except BankError as exc:
        return [str(exc)], None
    errors = schema_errors(path, data, directory)
    if errors:
        return errors, None
    bank = bank_from_data(data, path)
    errors += bank_errors(bank)
    for item in bank.items:
        errors += item_errors(bank, item)
    if bank.faq:
        errors += faq_errors(bank)
    else:
        errors += [f"{item.source}: faq {item.faq} given in a bank without a faq list"
                   for item in bank.items if item.faq is not None]
        lo, hi = LESSON_ITEMS
        if not lo <= len(bank.items) <= hi:
            errors.append(f"{path.name}: a lesson quiz has {lo} to {hi} items, got {len(bank.items)}")
    return errors, bank


def validate_all(directory: Path | None = None, require_faq: bool = True) -> list[str]:
    """Every error in every bank of ``directory``, plus cross-bank invariants."""
    directory = Path(directory or bank_dir())
    files = bank_files(directory)
    errors, banks = [], []
    if not files:
        return [f"{directory}: no *.yaml quiz banks"]
    for path in files:
        file_errors, bank = validate_file(path, directory)
        errors += file_errors
        if bank is not None:
            banks.append(bank)
    seen_items, seen_banks, seen_lessons = {}, {}, {}
    for bank in banks:
        for key, table, what in ((bank.id, seen_banks, "bank id"), (bank.lesson, seen_lessons, "lesson")):
            if key is not None and key in table:
                errors.append(f"{bank.path.name}: {what} {key!r} is also used by {table[key]}")
            table.setdefault(key, bank.path.name)
        for item in bank.items:
            if item.id in seen_items:
                errors.append(f"{item.source}: id also used in {seen_items[item.id]}")
            seen_items.setdefault(item.id, bank.path.name)
    if require_faq and not any(bank.faq for bank in banks) and not errors:
        errors.append(f"{directory}: no FAQ bank (a bank with a faq list covering entries 1..{FAQ_ENTRIES})")
    return errors


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else None
    errors = validate_all(directory)
    for error in errors:
        print(error, file=sys.stderr)
    if not errors:
        print(f"{len(bank_files(directory))} quiz banks valid in {directory or bank_dir()}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
