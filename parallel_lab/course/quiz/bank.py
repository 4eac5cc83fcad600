"""Quiz banks: the question data in ``quizzes/*.yaml``, loaded into small immutable objects.

A bank is data, not code (format: ``quizzes/schema.json``; checks: ``parallel_lab.course.quiz.validate``):

    id: collectives                 # the bank's topic; every item id starts with "collectives/"
    lesson: "01"                    # the lesson it belongs to (null until a lesson is attached)
    title: Ranks and collectives
    languages: [en, zh-Hant]        # every text field carries each of these (the course: both)
    pass_mark: 0.75                 # fraction of the points needed to pass
    items:
      - id: collectives/identity
        kind: single                # single | multiple | numeric
        prompt: ...
        options: [{key: a, text: ..., correct: true, why: ...}, ...]
      - id: collectives/ring-bytes
        kind: numeric
        prompt: "A ring all-reduce of {size:g} MB on {ranks} ranks ..."
        answer: {function: "parallel_lab.<module>:<function>", params: {size: 64, ranks: 8}}
        vary: {size: [32, 96], ranks: [4, 16]}      # the graded quiz's numbers, drawn per student
        tolerance: {rel: 0.01}
        unit: {en: MB, zh-Hant: MB}                 # a text field like the prompt: every language
        explanation: ...            # shown once answered correctly ({answer} is the computed value)
        hint: ...                   # shown after a wrong answer; must not give the answer away
        mistakes: [{answer: {value: 64}, why: ...}]   # recognised wrong answers, explained

A numeric item's answer is either a literal ``value`` or computed by a function of ``parallel_lab``
from ``params`` (so no answer is written down twice); the same ``params`` fill the prompt.
Text fields are a string (English) or a mapping ``{en: ..., zh-Hant: ...}``.

Where the banks are: ``$PARALLEL_LAB_QUIZZES`` if set, else ``quizzes/`` beside the package (the
repository checkout, as installed with ``pip install -e .``).
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from parallel_lab.i18n import _

LANGUAGES = {"en": "English", "zh-Hant": "中文（繁體）"}
KINDS = ("single", "multiple", "numeric")
DEFAULT_PASS_MARK = 0.8
FUNCTION_PREFIX = "parallel_lab."  # banks may only name functions of this package


class BankError(ValueError):
    """A bank breaks an invariant; the message names the file and the item."""


def bank_dir() -> Path:
    """The folder holding the banks: ``$PARALLEL_LAB_QUIZZES`` or the repository's ``quizzes/``."""
    override = os.environ.get("PARALLEL_LAB_QUIZZES")
    return Path(override) if override else Path(__file__).resolve().parents[3] / "quizzes"


def localize(text, lang: str = "en") -> str:
    """The ``lang`` version of a text field (a string is English), English when ``lang`` is absent."""
    if isinstance(text, str):
        return text
    return text.get(lang) or text["en"]


@dataclass(frozen=True)
class Option:
    key: str
    text: Mapping
    correct: bool
    why: Mapping | None
    origin: str = ""  # the key as the bank writes it, when a graded quiz relabels the option


@dataclass(frozen=True)
class Sealed:
    """What an item of a sealed bank (the students' release, ``course.quiz.seal``) carries instead
    of its key: the bank's salt and the item's ``sealed`` mapping of hashes and ciphertexts."""

    salt: str
    data: Mapping = field(hash=False, compare=False)


@dataclass(frozen=True)
class Mistake:
    """A wrong numeric answer students often give, and why it is wrong."""

    answer: Mapping
    why: Mapping


@dataclass(frozen=True)
class Item:
    """One question. ``answer`` (numeric only) is ``{"value": x}`` or ``{"function": "mod:fn",
    "params": {...}}``; ``tolerance`` is ``{"rel": r}`` or ``{"abs": a}``."""

    id: str
    kind: str
    prompt: Mapping
    points: float = 1
    options: tuple = ()
    answer: Mapping | None = None
    tolerance: Mapping | None = None
    unit: Mapping | str = ""  # numeric: the answer's unit, a text field like the prompt ({en: ..., zh-Hant: ...})
    explanation: Mapping | None = None
    hint: Mapping | None = None
    mistakes: tuple = ()
    faq: int | None = None
    vary: Mapping | None = None  # numeric: {param: [values]} the graded quiz draws from, per student
    sealed: Sealed | None = None  # a sealed bank's item (the students' release): no key, hashes instead
    source: str = field(default="", compare=False)  # "file: item 'id'", for error messages

    @property
    def params(self) -> dict:
        return dict((self.answer or {}).get("params") or {})

    @property
    def short_id(self) -> str:
        return self.id.split("/", 1)[-1]

    def prompt_text(self, lang: str = "en") -> str:
        """The prompt with this item's parameters filled in."""
        return localize(self.prompt, lang).format(**self.params)

    def unit_text(self, lang: str = "en") -> str:
        """The ``lang`` version of the unit ("" when the item has none)."""
        return localize(self.unit, lang) if self.unit else ""

    def correct_keys(self) -> frozenset:
        return frozenset(o.key for o in self.options if o.correct)

    def option(self, key: str) -> Option:
        return next(o for o in self.options if o.key == key)

    def value(self) -> float:
        """The numeric answer, computed by the named function when the item is parametrised."""
        if self.kind != "numeric":
            raise BankError(f"{self.source}: a {self.kind} item has no numeric value")
        if self.sealed is not None:
            raise BankError(f"{self.source}: this bank is sealed (a students' release): its answers are not in it")
        return resolve(self.answer, self.source)

    def within_tolerance(self, x: float, target: float | None = None) -> bool:
        target = self.value() if target is None else target
        tol = self.tolerance or {"rel": 1e-9}
        allowed = tol["abs"] if "abs" in tol else abs(target) * tol["rel"]
        return abs(x - target) <= allowed + 1e-12


@dataclass(frozen=True)
class Bank:
    id: str
    title: Mapping
    languages: tuple
    items: tuple
    lesson: str | None = None
    pass_mark: float = DEFAULT_PASS_MARK
    faq: tuple = ()  # FAQ bank only: ({"entry": n, "question": text}, ...)
    path: Path | None = None

    @property
    def total_points(self) -> float:
        return sum(item.points for item in self.items)

    def points_needed(self, pass_mark: float | None = None) -> float:
        """Points needed to pass: ``pass_mark`` (default: the bank's, or ``$PARALLEL_LAB_PASS_MARK``)
        times the total, rounded up to a whole point when points are whole."""
        mark = pass_mark if pass_mark is not None else float(os.environ.get("PARALLEL_LAB_PASS_MARK",
                                                                            self.pass_mark))
        if not 0 < mark <= 1:
            raise ValueError(f"pass mark must be in (0, 1], got {mark}")
        need = mark * self.total_points
        return math.ceil(need - 1e-9) if float(self.total_points).is_integer() else need

    def label(self) -> str:
        """How verdicts name the bank, in the process's language: ``collectives (lesson 01)``."""
        return _("{bank} (lesson {lesson})").format(bank=self.id, lesson=self.lesson) if self.lesson else self.id

    def item(self, item_id: str) -> Item:
        """Look an item up by full id (``collectives/identity``) or by its part after the slash."""
        for item in self.items:
            if item_id in (item.id, item.short_id):
                return item
        raise KeyError(f"quiz {self.id} has no question {item_id!r}; its questions: "
                       f"{', '.join(i.id for i in self.items)}")


def resolve(answer: Mapping, where: str = "") -> float:
    """The number an ``answer`` spec stands for: a literal ``value``, or ``function(**params)``."""
    if "value" in answer:
        return float(answer["value"])
    if "function" not in answer:
        raise BankError(f"{where}: no answer here: a students' release keeps only an item's numbers")
    params = answer.get("params") or {}
    return _call(answer["function"], tuple(sorted(params.items())), where)


@lru_cache(maxsize=None)
def _call(spec: str, params: tuple, where: str) -> float:
    module_name, _, name = spec.partition(":")
    if not module_name.startswith(FUNCTION_PREFIX) or not name:
        raise BankError(f"{where}: answer function {spec!r} must be 'parallel_lab.<module>:<function>'")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise BankError(f"{where}: answer function {spec!r} cannot be imported: {exc}") from None
    value = float(fn(**dict(params)))
    if not math.isfinite(value):
        raise BankError(f"{where}: answer function {spec!r} returned {value} for {dict(params)}")
    return value


# ----------------------------------------------------------------------------------------------
# Loading.


def _read(path: Path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as exc:
        raise BankError(f"{path.name}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BankError(f"{path.name}: a bank is a mapping with id, title, languages, items; "
                        f"got {type(data).__name__}")
    return data


def _item(raw: dict, where: str, salt: str | None = None) -> Item:
    options = tuple(Option(str(o["key"]), o["text"], bool(o.get("correct", False)), o.get("why"))
                    for o in raw.get("options") or ())
    mistakes = tuple(Mistake(m["answer"], m["why"]) for m in raw.get("mistakes") or ())
    sealed = Sealed(salt, raw["sealed"]) if salt and isinstance(raw.get("sealed"), dict) else None
    return Item(id=raw["id"], kind=raw["kind"], prompt=raw["prompt"], points=raw.get("points", 1),
                options=options, answer=raw.get("answer"), tolerance=raw.get("tolerance"),
                unit=raw.get("unit", ""), explanation=raw.get("explanation"), hint=raw.get("hint"),
                mistakes=mistakes, faq=raw.get("faq"), vary=raw.get("vary"), sealed=sealed, source=where)


def bank_from_data(data: dict, path: Path) -> Bank:
    """A Bank from parsed YAML. Raises BankError naming the file and item for a missing field
    (the full checks, against the schema, are ``parallel_lab.course.quiz.validate``)."""
    items = []
    salt = data["sealed"].get("salt") if isinstance(data.get("sealed"), dict) else None
    for index, raw in enumerate(data.get("items") or ()):
        where = f"{path.name}: item {raw.get('id', f'#{index + 1}')!r}" if isinstance(raw, dict) \
            else f"{path.name}: item #{index + 1}"
        try:
            items.append(_item(raw, where, salt))
        except (KeyError, TypeError) as exc:
            raise BankError(f"{where}: missing or malformed field {exc}") from None
    try:
        return Bank(id=data["id"], title=data["title"], languages=tuple(data["languages"]),
                    items=tuple(items), lesson=data.get("lesson"),
                    pass_mark=data.get("pass_mark", DEFAULT_PASS_MARK),
                    faq=tuple(data.get("faq") or ()), path=path)
    except KeyError as exc:
        raise BankError(f"{path.name}: missing field {exc}") from None


def bank_files(directory: Path | None = None) -> list[Path]:
    return sorted((directory or bank_dir()).glob("*.yaml"))


def load_file(path: Path) -> Bank:
    """One bank file (cached until the file changes)."""
    path = Path(path).resolve()
    stat = path.stat()
    return _load_cached(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _load_cached(path: Path, mtime_ns: int, size: int) -> Bank:
    return bank_from_data(_read(path), path)


def load_all(directory: Path | None = None) -> list[Bank]:
    return [load_file(path) for path in bank_files(directory)]


def load(name: str, directory: Path | None = None) -> Bank:
    """The bank for a lesson number (``"01"``) or a bank id (``"collectives"``, ``"faq"``)."""
    banks = load_all(directory)
    for bank in banks:
        if name in (bank.id, bank.lesson):
            return bank
    known = ", ".join(f"{b.id}" + (f" (lesson {b.lesson})" if b.lesson else "") for b in banks)
    raise KeyError(f"no quiz {name!r} in {directory or bank_dir()}; known: {known or 'none'}")
