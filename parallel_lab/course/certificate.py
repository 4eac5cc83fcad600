"""Course certificates with a verifiable ID.

    from parallel_lab.course.certificate import certificate
    certificate("Ada Lovelace")        # in a notebook: lists every lesson whose quiz you passed

    parallel-lab certificate verify certificate.json [--json]      # {"valid": ..., "reason": ...}
    parallel-lab certificate issue --name "Ada" --gradebook grades.csv --student ada --key-file KEY

A certificate is a small JSON file: ``name``, ``course``, ``lessons`` (passed), ``date``, ``issuer``,
``key_id`` and ``id``. The ID is a keyed MAC of every other field (HMAC-SHA256, first 80 bits,
written ``PL-XXXX-XXXX-XXXX-XXXX``), so changing any field, or the ID, makes verification fail.

Trust model -- who can mint a valid ID depends on the key:

- **Public course key** (the default, written in this file; ``key_id`` "public"). Anyone can
  compute IDs, so a certificate is *tamper-evident only*: an edit made after issue is detected, but
  a student can mint a certificate saying anything. (The quiz passes it is issued from,
  ``~/.parallel_lab/progress.json``, are the student's own record too.) Self-issued certificates
  are for the student's own satisfaction.
- **Instructor key** (a secret: ``$PARALLEL_LAB_CERT_KEY``, or a file named by
  ``$PARALLEL_LAB_CERT_KEY_FILE`` or ``--key-file``; ``key_id`` "k-" + a fingerprint). Students
  without the secret cannot mint a valid ID: the certificate is *unforgeable* by them. HMAC is
  symmetric, so checking it needs the same secret: the instructor (or a colleague given the key)
  verifies, and in that mode self-issued certificates are rejected unless explicitly accepted.
  Letting anyone verify without being able to mint would need a public-key signature (e.g.
  Ed25519 via the ``cryptography`` package), which the course does not depend on.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import hashlib
import hmac
import html
import json
import os
import secrets
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from parallel_lab.course.quiz import progress

COURSE = "parallel-lab: model parallelism (tensor and pipeline), run for real"
VERSION = 1
PUBLIC_SECRET = b"parallel-lab public course key v1 (not a secret: certificates signed with it are tamper-evident only)"
FIELDS = ("version", "name", "course", "lessons", "date", "issuer", "key_id", "id")
DEFAULT_THRESHOLD = 0.8  # share of a lesson's points needed to count it as passed (gradebook)


@dataclass(frozen=True)
class Key:
    """A MAC key: the public course key, or an instructor's secret."""

    secret: bytes
    instructor: bool

    @property
    def key_id(self) -> str:
        if not self.instructor:
            return "public"
        return "k-" + hashlib.sha256(b"parallel-lab key id\0" + self.secret).hexdigest()[:12]


PUBLIC_KEY = Key(PUBLIC_SECRET, instructor=False)


def load_key(key_file: str | os.PathLike | None = None, environ=None) -> Key:
    """The instructor key from ``key_file``, ``$PARALLEL_LAB_CERT_KEY`` (the secret itself) or
    ``$PARALLEL_LAB_CERT_KEY_FILE``; the public course key when none is set."""
    environ = os.environ if environ is None else environ
    path = key_file or environ.get("PARALLEL_LAB_CERT_KEY_FILE")
    if path:
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the instructor key file {path}: {exc.strerror}") from None
    else:
        secret = environ.get("PARALLEL_LAB_CERT_KEY", "").strip().encode()
    if not secret:
        return PUBLIC_KEY
    if len(secret) < 16:
        raise ValueError(f"an instructor key needs at least 16 bytes of secret, got {len(secret)}; "
                         "make one with `parallel-lab certificate keygen FILE`")
    return Key(secret, instructor=True)


def keygen(path: str | os.PathLike) -> Key:
    """Write a new random instructor key (64 hex characters) to ``path``, readable by its owner only."""
    path = Path(path)
    if path.exists():
        raise ValueError(f"{path} exists; refusing to overwrite a key (certificates signed with it "
                         "would no longer verify)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return load_key(path)


def _normal(text: str) -> str:
    return unicodedata.normalize("NFC", " ".join(str(text).split()))


def _mac_input(cert: dict) -> bytes:
    body = {k: cert[k] for k in FIELDS if k != "id"}
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def compute_id(cert: dict, key: Key) -> str:
    """``PL-XXXX-XXXX-XXXX-XXXX``: HMAC-SHA256 of the other fields, first 80 bits, base32."""
    mac = hmac.new(key.secret, _mac_input(cert), hashlib.sha256).digest()[:10]
    code = base64.b32encode(mac).decode()
    return "PL-" + "-".join(code[i:i + 4] for i in range(0, 16, 4))


def issue(name: str, lessons, key: Key | None = None, date: str | None = None,
          issuer: str | None = None, course: str = COURSE) -> dict:
    """A certificate for ``name`` and the ``lessons`` passed, signed with ``key`` (default: the
    instructor key if one is configured, else the public course key)."""
    key = key or load_key()
    name = _normal(name)
    if not name:
        raise ValueError("a certificate needs a non-empty name")
    lessons = sorted({str(lesson) for lesson in lessons})
    if not lessons:
        raise ValueError("a certificate needs at least one lesson passed, got none")
    date = date or _dt.date.today().isoformat()
    _dt.date.fromisoformat(date)  # raises ValueError on a malformed date
    cert = {"version": VERSION, "name": name, "course": course, "lessons": lessons, "date": date,
            "issuer": _normal(issuer) if issuer else ("instructor" if key.instructor else "self-issued"),
            "key_id": key.key_id}
    cert["id"] = compute_id(cert, key)
    return cert


def _shape_error(cert) -> str:
    if not isinstance(cert, dict):
        return f"not a certificate: expected a JSON object, got {type(cert).__name__}"
    missing = [f for f in FIELDS if f not in cert]
    extra = sorted(set(cert) - set(FIELDS))
    if missing or extra:
        return ("not a certificate: " + (f"missing field(s) {', '.join(missing)}" if missing else "")
                + ("; " if missing and extra else "") + (f"unexpected field(s) {', '.join(extra)}" if extra else ""))
    if cert["version"] != VERSION:
        return f"unsupported certificate version {cert['version']!r} (this is version {VERSION})"
    if not isinstance(cert["lessons"], list) or not all(isinstance(x, str) for x in cert["lessons"]):
        return "not a certificate: lessons must be a list of strings"
    if not all(isinstance(cert[f], str) for f in ("name", "course", "date", "issuer", "key_id", "id")):
        return "not a certificate: name, course, date, issuer, key_id and id must be strings"
    return ""


def verify(cert, key: Key | None = None, accept_self_issued: bool | None = None) -> dict:
    """``{"valid": bool, "reason": str, ...}`` for a certificate (dict, or path to its JSON).

    With the public key (no instructor key configured) a self-issued certificate is valid when
    untouched. With an instructor key, only certificates signed with that key are valid, unless
    ``accept_self_issued``. Any edit of any field (or of the ID) makes it invalid."""
    if isinstance(cert, (str, os.PathLike)):
        try:
            cert = json.loads(Path(cert).read_text(encoding="utf-8"))
        except OSError as exc:
            return {"valid": False, "reason": f"cannot read {cert}: {exc.strerror}"}
        except ValueError as exc:
            return {"valid": False, "reason": f"not a certificate: not JSON ({exc})"}
    key = key or load_key()
    problem = _shape_error(cert)
    if problem:
        return {"valid": False, "reason": problem}
    signer = cert["key_id"]
    if signer == "public":
        if key.instructor and not accept_self_issued:
            return {"valid": False, "reason": "self-issued with the public course key, which anyone can use; "
                                              f"instructor mode (key {key.key_id}) accepts only certificates it "
                                              "signed (--accept-self-issued to check it anyway)"}
        use = PUBLIC_KEY
    elif not key.instructor:
        return {"valid": False, "reason": f"signed with instructor key {signer}; verify it with that key "
                                          "(--key-file or PARALLEL_LAB_CERT_KEY_FILE)"}
    elif signer != key.key_id:
        return {"valid": False, "reason": f"signed with instructor key {signer}, not with this key ({key.key_id})"}
    else:
        use = key
    if not hmac.compare_digest(compute_id(cert, use), cert["id"]):
        return {"valid": False, "reason": "edited after issue: the ID does not match the name, course, lessons, "
                                          "date and issuer (or the ID itself was changed)"}
    trust = ("public course key: tamper-evident only, anyone can mint one" if signer == "public"
             else f"instructor key {signer}")
    return {"valid": True, "reason": f"valid: {cert['name']}, lessons {', '.join(cert['lessons'])}, "
                                     f"{cert['date']}, issued by {cert['issuer']} ({trust})",
            "id": cert["id"], "name": cert["name"], "lessons": cert["lessons"], "date": cert["date"],
            "issuer": cert["issuer"], "key_id": signer}


def save(cert: dict, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.write_text(json.dumps(cert, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def lessons_from_gradebook(gradebook: str | os.PathLike, student: str,
                           threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """Lessons in which ``student`` earned at least ``threshold`` of the points (a gradebook
    written by ``parallel-lab grade``). A lesson named ``01_ranks_and_collectives`` counts as "01"."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    earned, possible = {}, {}
    with open(gradebook, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("student") != student:
                continue
            lesson = row["lesson"].split("_", 1)[0]
            earned[lesson] = earned.get(lesson, 0.0) + float(row["points"] or 0)
            possible[lesson] = possible.get(lesson, 0.0) + float(row["max_points"] or 0)
    if not possible:
        raise ValueError(f"no rows for student {student!r} in {gradebook}")
    return sorted(l for l in possible if possible[l] > 0 and earned[l] >= threshold * possible[l] - 1e-9)


class Certificate(dict):
    """A certificate (a dict) that shows itself as a card in a notebook."""

    def _repr_html_(self) -> str:
        e = {k: html.escape(str(v)) for k, v in self.items()}
        lessons = html.escape(", ".join(self["lessons"]))
        return (f'<div style="border:2px solid #444;padding:1em 1.5em;max-width:36em;font-family:serif">'
                f'<div style="font-size:1.4em">Certificate of completion</div>'
                f'<p>This certifies that <b>{e["name"]}</b> passed lessons {lessons} of<br><i>{e["course"]}</i>'
                f'<br>on {e["date"]}.</p><p style="font-family:monospace">ID {e["id"]} · issuer {e["issuer"]} '
                f'· key {e["key_id"]}</p><small>Check it: <code>parallel-lab certificate verify FILE</code></small></div>')

    def __str__(self) -> str:
        return (f"Certificate {self['id']}: {self['name']} passed lessons {', '.join(self['lessons'])} of "
                f"{self['course']} on {self['date']} (issuer {self['issuer']}, key {self['key_id']})")


def certificate(name: str, require=None, out: str | os.PathLike = "certificate.json") -> Certificate:
    """Issue a certificate for every quiz you have passed (``parallel_lab.course.quiz``) and save it to
    ``out``. ``require``: lessons that must be among them (e.g. ``["00", "01"]``)."""
    passed = progress.lessons_passed()
    missing = sorted(set(map(str, require or ())) - set(passed))
    if missing:
        raise ValueError(f"not yet passed: {', '.join(missing)} (passed so far: {', '.join(passed) or 'none'}); "
                         "pass a quiz with check_quiz(lesson, my_answers)")
    if not passed:
        raise ValueError("no quiz passed yet: pass a lesson's quiz first (its check cell, or the widget)")
    cert = Certificate(issue(name, passed))
    save(cert, out)
    return cert
