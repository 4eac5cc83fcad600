"""Sealed banks: the quiz banks of the students' release, whose keys cannot be read.

    sealed = seal_bank(load("01"))          # a mapping, written as quizzes/ranks_and_collectives.yaml
    sealed_feedback(item, "b", "en")        # the practice widget's feedback, from the sealed item

A sealed bank keeps what a student sees (title, prompts, option texts, units, the practice
numbers, hints, which never give the answer away: ``validate``) and the parameters of the graded
variants (``variant``: each student's own numbers), and replaces everything that holds an answer:

- a choice item's key by a salted hash, ``H(salt, item, "key", the right option keys)``, and each
  option's explanation by a ciphertext keyed by ``H(salt, item, "why", that option's key)``: the
  widget says right or wrong and explains the option chosen, and nothing in the file says which
  option is right;
- a numeric item's answer by the salted hash of its bin (log-spaced bins of the item's relative
  tolerance, or linear bins of its absolute one) -- a response is right when its bin or a
  neighbour's hashes to it, so the release accepts what lies within the tolerance (and at most two
  tolerances off, where the bins' edges fall) -- and its explanation and recognised mistakes by
  ciphertexts keyed by their bins: only a response in the right bin decrypts what it earns;
- the answer functions and their names by nothing (the item keeps only its numbers).

What this does not hide, said plainly (docs/instructors.md): the widget is an oracle by design, so
anyone who tries every option, or writes a loop over a numeric item's bins, learns the practice
answer, as retries in the widget would teach it. The graded quiz is what counts, and it asks each
student other numbers and another option order (``variant``); its numeric answers are in no file
of the release, and only the instructor's grader scores them. The cipher (a SHAKE-256 keystream)
only keeps text out of plain sight; its keys come from the file itself or from the answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math

from .bank import Bank, Item, localize, resolve

SCHEME = "sha256-shake256-v1"


def salt_of(bank: Bank) -> str:
    """The bank's salt: derived from its file, so a release is reproducible; public, by design."""
    data = bank.path.read_bytes() if bank.path else bank.id.encode()
    return hashlib.sha256(b"parallel-lab release salt\0" + data).hexdigest()[:32]


def digest(salt: str, item_id: str, *parts) -> str:
    return hashlib.sha256("\x1f".join([salt, item_id, *map(str, parts)]).encode()).hexdigest()


def _stream(key: str, n: int) -> bytes:
    return hashlib.shake_256(key.encode()).digest(n)


def encrypt(key: str, data) -> str:
    raw = json.dumps(data, ensure_ascii=False, sort_keys=True).encode()
    return base64.b64encode(bytes(a ^ b for a, b in zip(raw, _stream(key, len(raw))))).decode()


def decrypt(key: str, text: str):
    raw = base64.b64decode(text)
    return json.loads(bytes(a ^ b for a, b in zip(raw, _stream(key, len(raw)))).decode())


def number_bin(value: float, tolerance) -> str:
    """The bin of a number: ``floor(log|x| / log(1 + rel))`` with its sign, or ``floor(x / abs)``."""
    tolerance = tolerance or {"rel": 1e-9}
    if "abs" in tolerance:
        return f"a{math.floor(value / tolerance['abs'])}"
    if value == 0:
        return "z"
    sign = "p" if value > 0 else "n"
    return f"{sign}{math.floor(math.log(abs(value)) / math.log1p(tolerance['rel']))}"


def neighbours(bin_name: str) -> list[str]:
    """A bin and the bins beside it (a zero bin has none)."""
    if bin_name == "z":
        return ["z"]
    prefix, n = bin_name[0], int(bin_name[1:])
    return [f"{prefix}{n + d}" for d in (0, -1, 1)]


def _texts(text, languages, **fields) -> dict:
    return {lang: localize(text, lang).format(**fields) for lang in languages}


def seal_item(item: Item, salt: str, languages) -> dict:
    """A sealed item as plain data (what the release's YAML holds)."""
    out = {"id": item.id, "kind": item.kind, "points": item.points, "prompt": item.prompt}
    if item.faq is not None:
        out["faq"] = item.faq
    if item.kind in ("single", "multiple"):
        out["options"] = [{"key": o.key, "text": o.text} for o in item.options]
        out["sealed"] = {
            "key": digest(salt, item.id, "key", ",".join(sorted(item.correct_keys()))),
            "why": {o.key: encrypt(digest(salt, item.id, "why", o.key), _texts(o.why, languages))
                    for o in item.options}}
        return out
    from .variant import graded_params  # here: variant scores with check, which checks sealed items with this

    answer = item.value()
    fields = {**item.params, "answer": answer}
    right = number_bin(answer, item.tolerance)
    out.update({"answer": {"params": dict(item.params)}, "tolerance": dict(item.tolerance or {"rel": 1e-9}),
                "unit": item.unit, "hint": item.hint})
    mistakes = []
    for mistake in item.mistakes:
        wrong = number_bin(resolve(mistake.answer, item.source), item.tolerance)
        mistakes.append({"bin": digest(salt, item.id, "mistake", wrong),
                         "why": encrypt(digest(salt, item.id, "mistake-why", wrong),
                                        _texts(mistake.why, languages, **fields))})
    out["sealed"] = {"answer": digest(salt, item.id, "answer", right),
                     "explanation": encrypt(digest(salt, item.id, "explanation", right),
                                            _texts(item.explanation, languages, **fields)),
                     "mistakes": mistakes, "variants": graded_params(item)}
    return out


def seal_bank(bank: Bank) -> dict:
    """The sealed form of ``bank``: plain data, ready for ``yaml.safe_dump``."""
    salt = salt_of(bank)
    data = {"id": bank.id, "lesson": bank.lesson, "title": bank.title, "languages": list(bank.languages),
            "pass_mark": bank.pass_mark, "sealed": {"scheme": SCHEME, "salt": salt}}
    if bank.faq:
        data["faq"] = [dict(entry) for entry in bank.faq]
    data["items"] = [seal_item(item, salt, bank.languages) for item in bank.items]
    return data


# ----------------------------------------------------------------------------------------------
# Checking against a sealed item (the release's widget and graded check).


def choice_right(item: Item, keys: frozenset) -> bool:
    """Whether ``keys`` (as the item labels its options) are exactly the right ones."""
    origins = {o.key: (o.origin or o.key) for o in item.options}
    chosen = ",".join(sorted(origins[k] for k in keys))
    return digest(item.sealed.salt, item.id, "key", chosen) == item.sealed.data["key"]


def option_why(item: Item, key: str, lang: str) -> str:
    origin = next((o.origin or o.key) for o in item.options if o.key == key)
    texts = decrypt(digest(item.sealed.salt, item.id, "why", origin), item.sealed.data["why"][origin])
    return texts.get(lang) or texts["en"]


def numeric_feedback(item: Item, value: float) -> tuple[bool, dict | None]:
    """(right, {lang: text} to show or None for the hint): the explanation when ``value``'s bin
    (or a neighbour) is the answer's, a recognised mistake's explanation, or nothing."""
    sealed, salt = item.sealed.data, item.sealed.salt
    for candidate in neighbours(number_bin(value, item.tolerance)):
        if digest(salt, item.id, "answer", candidate) == sealed["answer"]:
            return True, decrypt(digest(salt, item.id, "explanation", candidate), sealed["explanation"])
    for candidate in neighbours(number_bin(value, item.tolerance)):
        for mistake in sealed.get("mistakes", ()):
            if digest(salt, item.id, "mistake", candidate) == mistake["bin"]:
                return False, decrypt(digest(salt, item.id, "mistake-why", candidate), mistake["why"])
    return False, None


def is_sealed(data: dict) -> bool:
    return isinstance(data.get("sealed"), dict)

