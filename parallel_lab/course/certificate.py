"""Course certificates: instructor-signed (Ed25519, anyone can verify) or self-issued (tamper-evident only).

    from parallel_lab.course.certificate import certificate
    certificate("Ada Lovelace")        # in a notebook: self-issued, lists every lesson whose quiz you passed

    parallel-lab certificate keygen ~/.parallel_lab/keys       # instructor.key (secret) + instructor.pub
    parallel-lab certificate issue --name "Ada" --gradebook grades.csv --student ada --key-file KEY
    parallel-lab certificate verify certificate.json --public-key instructor.pub [--json]

A certificate (format version 2) is a small JSON object. Every certificate has ``version``, ``name``,
``course``, ``lessons`` (passed, sorted), ``date`` (YYYY-MM-DD), ``issuer``, ``trust`` and ``id``
(``PL-XXXX-XXXX-XXXX-XXXX``: the first 80 bits of the SHA-256 of the canonical JSON of the fields
before it, base32). An instructor-signed one also has ``fingerprint`` and ``public_key`` (the
signer's key, base64 of its 32 raw bytes) and ``signature`` (base64 Ed25519 signature of the
canonical JSON of every other field). Canonical JSON: ``json.dumps(fields, sort_keys=True,
ensure_ascii=False, separators=(",", ":"))`` in UTF-8, so whitespace and key order in the file do
not matter.

Trust model:

- **Instructor-signed** (``"trust": "instructor-signed (Ed25519)"``). Only the holder of the private
  key can make one; anyone holding the public key can check it, with no secret. The verifier
  supplies the public key (the instructor's ``.pub`` file, its fingerprint checked against the one
  the instructor published); the key embedded in the certificate is never trusted by itself and
  must be that same key.
- **Self-issued** (``"trust": "self-issued (tamper-evident only)"``, students in a notebook). No
  signature: the ID only shows that the file was not edited since it was made, but anyone can make
  one for any name, lessons and issuer (the quiz record it comes from is the student's own file).
  ``verify`` accepts it only with ``accept_self_issued``, and its issuer is a claim.

Key files (``keygen``): ``NAME.key``, the private key as PEM PKCS8 (unencrypted, mode 0600), and
``NAME.pub``, the public key as PEM SubjectPublicKeyInfo. ``load_public_key`` also reads a one-line
base64 of the 32 raw bytes (the form in a certificate's ``public_key``). Fingerprint: ``SHA256:`` +
unpadded base64 of the SHA-256 of the 32 raw public key bytes (as OpenSSH writes them).
"""

from __future__ import annotations

import base64
import binascii
import csv
import datetime as _dt
import hashlib
import html
import json
import os
import unicodedata
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from parallel_lab.course.quiz import progress

COURSE = "parallel-lab: model parallelism (tensor and pipeline), run for real"
VERSION = 2
SIGNED = "instructor-signed (Ed25519)"
SELF_ISSUED = "self-issued (tamper-evident only)"
FIELDS = ("version", "name", "course", "lessons", "date", "issuer", "trust", "id")
SIGNED_FIELDS = FIELDS + ("fingerprint", "public_key", "signature")
DEFAULT_KEY_NAME = "instructor"
DEFAULT_THRESHOLD = 0.8  # share of a lesson's points needed to count it as passed (gradebook)


# --- keys -------------------------------------------------------------------------------------------

def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """``SHA256:`` + unpadded base64 of SHA-256 of the key's 32 raw bytes (43 characters after the colon)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(_raw(public_key)).digest()).decode().rstrip("=")


def public_key_line(public_key: Ed25519PublicKey) -> str:
    """The one-line form of a public key: base64 of its 32 raw bytes."""
    return base64.b64encode(_raw(public_key)).decode()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ValueError(f"{path} exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def keygen(directory: str | os.PathLike, name: str = DEFAULT_KEY_NAME) -> dict:
    """Make a new Ed25519 key pair in ``directory`` (created if missing): ``NAME.key`` (private, PEM
    PKCS8, mode 0600) and ``NAME.pub`` (public, PEM). Refuses to overwrite either file. Returns
    ``{"private_key": path, "public_key": path, "fingerprint": "SHA256:..."}``."""
    if not name or name != Path(name).name or name.startswith("."):
        raise ValueError(f"a key name must be a plain file name (no folder, no leading dot), got {name!r}")
    directory = Path(directory)
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    existing = [str(p) for p in (private, public) if p.exists()]
    if existing:
        raise ValueError(f"{' and '.join(existing)} already exist(s); refusing to overwrite a key "
                         "(certificates signed with it would no longer verify)")
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    _write_new(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()), 0o600)
    _write_new(public, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return {"private_key": str(private), "public_key": str(public), "fingerprint": fingerprint(key.public_key())}


def _read_key_file(path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc.strerror}") from None


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM PKCS8, as ``keygen`` writes ``NAME.key``); ValueError if not."""
    data = _read_key_file(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(f"{path} is not an unencrypted PEM private key (the NAME.key that "
                         "`parallel-lab certificate keygen` writes; NAME.pub is the public one)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def decode_public_key(line: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 of its 32 raw bytes; ValueError if it is not that."""
    try:
        raw = base64.b64decode(line.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not base64: {line.strip()[:60]!r}") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path``: PEM (``NAME.pub`` from ``keygen``) or one line of base64 of
    its 32 raw bytes. ValueError if it is neither."""
    data = _read_key_file(path, "public key")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = decode_public_key(data.decode("ascii"))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{path} is not an Ed25519 public key (PEM or one-line base64): "
                         f"{str(exc).splitlines()[0][:120]}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


# --- issuing ----------------------------------------------------------------------------------------

def _normal(text: str) -> str:
    return unicodedata.normalize("NFC", " ".join(str(text).split()))


def canonical(cert: dict, without=("signature",)) -> bytes:
    """The bytes that are digested or signed: sorted-key compact JSON (UTF-8) of every field but ``without``."""
    body = {k: v for k, v in cert.items() if k not in without}
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def compute_id(cert: dict) -> str:
    """``PL-XXXX-XXXX-XXXX-XXXX``: SHA-256 of every field but ``id`` and ``signature``, first 80 bits, base32."""
    code = base64.b32encode(hashlib.sha256(canonical(cert, ("id", "signature"))).digest()[:10]).decode()
    return "PL-" + "-".join(code[i:i + 4] for i in range(0, 16, 4))


def _checked_date(date: str | None) -> str:
    if date is None:
        return _dt.date.today().isoformat()
    try:
        return _dt.date.fromisoformat(str(date)).isoformat()
    except ValueError:
        raise ValueError(f"a certificate date must be YYYY-MM-DD, got {date!r}") from None


def issue(name: str, lessons, key: Ed25519PrivateKey | None = None, date: str | None = None,
          issuer: str | None = None, course: str = COURSE) -> dict:
    """A certificate (dict) for ``name`` and the ``lessons`` passed: signed with the Ed25519 private
    ``key``, or self-issued (tamper-evident only) when ``key`` is None. ``date`` YYYY-MM-DD (default
    today); ``issuer`` default "instructor" / "self-issued". ValueError on an empty name or no lessons."""
    signed = key is not None
    name = _normal(name)
    if not name:
        raise ValueError("a certificate needs a non-empty name")
    lessons = sorted({str(lesson) for lesson in lessons})
    if not lessons:
        raise ValueError("a certificate needs at least one lesson passed, got none")
    cert = {"version": VERSION, "name": name, "course": course, "lessons": lessons, "date": _checked_date(date),
            "issuer": _normal(issuer) if issuer else ("instructor" if signed else "self-issued"),
            "trust": SIGNED if signed else SELF_ISSUED}
    if signed:
        cert.update(fingerprint=fingerprint(key.public_key()), public_key=public_key_line(key.public_key()))
    cert["id"] = compute_id(cert)
    if signed:
        cert["signature"] = base64.b64encode(key.sign(canonical(cert))).decode()
    return {f: cert[f] for f in (SIGNED_FIELDS if signed else FIELDS)}


def save(cert: dict, path: str | os.PathLike) -> Path:
    """Write ``cert`` to ``path`` as indented UTF-8 JSON; returns the path."""
    path = Path(path)
    path.write_text(json.dumps(cert, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --- verifying --------------------------------------------------------------------------------------

def _read_certificate(path) -> tuple[object, str]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")), ""
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror}"
    except (ValueError, RecursionError) as exc:
        return None, f"not a certificate: not UTF-8 JSON ({str(exc).splitlines()[0][:120]})"


def _fields_error(cert: dict) -> str:
    expected = SIGNED_FIELDS if cert["trust"] == SIGNED else FIELDS
    missing = [f for f in expected if f not in cert]
    extra = sorted(set(cert) - set(expected))
    parts = ([f"missing field(s) {', '.join(missing)}"] if missing else []) + \
            ([f"unexpected field(s) {', '.join(map(str, extra))}"] if extra else [])
    return f"not a certificate: {'; '.join(parts)} for trust {cert['trust']!r}" if parts else ""


def _shape_error(cert) -> str:
    """Why ``cert`` is not a well-formed version-2 certificate, or ""."""
    if not isinstance(cert, dict):
        return f"not a certificate: expected a JSON object, got {type(cert).__name__}"
    if "version" not in cert:
        return "not a certificate: missing field(s) version"
    if type(cert["version"]) is not int or cert["version"] != VERSION:
        return (f"unsupported certificate version {cert['version']!r} (this is version {VERSION}; "
                "ask the issuer for a new certificate)")
    if cert.get("trust") not in (SIGNED, SELF_ISSUED):
        return f"not a certificate: trust must be {SIGNED!r} or {SELF_ISSUED!r}, got {cert.get('trust')!r}"
    problem = _fields_error(cert)
    if problem:
        return problem
    if not isinstance(cert["lessons"], list) or not all(isinstance(x, str) for x in cert["lessons"]):
        return f"not a certificate: lessons must be a list of strings, got {cert['lessons']!r}"[:200]
    wrong = [f for f in cert if f not in ("version", "lessons") and not isinstance(cert[f], str)]
    if wrong:
        return f"not a certificate: {', '.join(wrong)} must be string(s)"
    try:
        if _dt.date.fromisoformat(cert["date"]).isoformat() != cert["date"]:
            raise ValueError
    except ValueError:
        return f"not a certificate: date must be YYYY-MM-DD, got {cert['date']!r}"
    return ""


def _result(valid: bool, reason: str, cert: dict | None, supplied: str | None) -> dict:
    """The verification report: valid, reason, self_issued and fingerprint (None when unknown), the
    supplied key's fingerprint, and the certificate's fields when valid."""
    report = {"valid": valid, "reason": reason,
              "self_issued": None if cert is None else cert["trust"] == SELF_ISSUED,
              "fingerprint": None if cert is None else cert.get("fingerprint"),
              "public_key_fingerprint": supplied}
    if valid:
        report.update({k: cert[k] for k in ("id", "name", "course", "lessons", "date", "issuer", "trust")})
    return report


def _summary(cert: dict) -> str:
    return f"{cert['name']}, lessons {', '.join(cert['lessons'])}, {cert['date']}"


def _verify_self_issued(cert: dict, accept: bool, supplied: str | None) -> dict:
    claim = f"issuer (claimed, not verified): {cert['issuer']}"
    digest = compute_id(cert)
    if digest != cert["id"]:
        return _result(False, f"{SELF_ISSUED}: edited after issue: the ID {cert['id']} is not the content's "
                              f"SHA-256 digest {digest}; {claim}", cert, supplied)
    if not accept:
        return _result(False, f"{SELF_ISSUED}: untouched since made, but anyone can make one for any name and "
                              f"lessons ({_summary(cert)}; {claim}); add --accept-self-issued to accept it as "
                              "such, or ask the instructor for a signed certificate", cert, supplied)
    return _result(True, f"valid as {SELF_ISSUED}: {_summary(cert)}; {claim}; anyone can make such a "
                         "certificate", cert, supplied)


def _signature_error(cert: dict, public_key: Ed25519PublicKey) -> str:
    try:
        signature = base64.b64decode(cert["signature"], validate=True)
    except (binascii.Error, ValueError):
        return f"not a certificate: signature is not base64: {cert['signature'][:60]!r}"
    try:
        public_key.verify(signature, canonical(cert))
    except InvalidSignature:
        return (f"edited after signing (or not signed by key {fingerprint(public_key)}): the Ed25519 signature "
                "does not match the name, course, lessons, date, issuer, ID and key")
    digest = compute_id(cert)
    if digest != cert["id"]:
        return f"the signed ID {cert['id']} is not the content's digest {digest}: the issuing tool is broken"
    return ""


def _verify_signed(cert: dict, public_key: Ed25519PublicKey | None, supplied: str | None) -> dict:
    try:
        embedded = decode_public_key(cert["public_key"])
    except ValueError as exc:
        return _result(False, f"not a certificate: public_key is not an Ed25519 key ({exc})", cert, supplied)
    if public_key is not None and _raw(embedded) != _raw(public_key):
        return _result(False, f"signed with key {fingerprint(embedded)} (embedded in the certificate), not with "
                              f"the supplied public key {supplied}", cert, supplied)
    if cert["fingerprint"] != fingerprint(embedded):
        return _result(False, f"inconsistent: the fingerprint field {cert['fingerprint']} is not the fingerprint "
                              f"{fingerprint(embedded)} of the embedded public key", cert, supplied)
    if public_key is None:
        return _result(False, f"{SIGNED} by key {cert['fingerprint']}: verify it against the instructor's public "
                              "key (--public-key FILE, its fingerprint checked against the published one); a key "
                              "taken from the certificate itself proves nothing", cert, supplied)
    problem = _signature_error(cert, public_key)
    if problem:
        return _result(False, problem, cert, supplied)
    return _result(True, f"valid, {SIGNED} by key {supplied}: {_summary(cert)}, issuer {cert['issuer']}",
                   cert, supplied)


def verify(cert, public_key: Ed25519PublicKey | str | os.PathLike | None = None,
           accept_self_issued: bool = False) -> dict:
    """Check a certificate (dict, or path to its JSON). Returns ``{"valid": bool, "reason": one line,
    "self_issued": bool | None, "fingerprint": signer's | None, "public_key_fingerprint": supplied | None,
    ...}`` (plus the certificate's fields when valid); a malformed certificate gives a reason, never an
    exception. An instructor-signed certificate is valid only against ``public_key`` (a key, or a file
    for ``load_public_key``, which raises ValueError if unreadable); a self-issued one only with
    ``accept_self_issued``. Any edit of any field makes it invalid."""
    if isinstance(public_key, (str, os.PathLike)):
        public_key = load_public_key(public_key)
    supplied = fingerprint(public_key) if public_key is not None else None
    problem = ""
    if isinstance(cert, (str, os.PathLike)):
        cert, problem = _read_certificate(cert)
    problem = problem or _shape_error(cert)
    if problem:
        return _result(False, problem, None, supplied)
    if cert["trust"] == SELF_ISSUED:
        return _verify_self_issued(cert, accept_self_issued, supplied)
    return _verify_signed(cert, public_key, supplied)


# --- gradebook and notebook -------------------------------------------------------------------------

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

    def _trust_line(self) -> str:
        if self["trust"] == SIGNED:
            return f"signed by key {self['fingerprint']} · issuer {self['issuer']}"
        return f"{SELF_ISSUED} · issuer (claimed, not verified): {self['issuer']}"

    def _repr_html_(self) -> str:
        e = {k: html.escape(str(v)) for k, v in self.items()}
        lessons = html.escape(", ".join(self["lessons"]))
        check = ("--public-key INSTRUCTOR.pub" if self["trust"] == SIGNED else "--accept-self-issued")
        return (f'<div style="border:2px solid #444;padding:1em 1.5em;max-width:36em;font-family:serif">'
                f'<div style="font-size:1.4em">Certificate of completion</div>'
                f'<p>This certifies that <b>{e["name"]}</b> passed lessons {lessons} of<br><i>{e["course"]}</i>'
                f'<br>on {e["date"]}.</p><p style="font-family:monospace">ID {e["id"]} · '
                f'{html.escape(self._trust_line())}</p>'
                f'<small>Check it: <code>parallel-lab certificate verify FILE {check}</code></small></div>')

    def __str__(self) -> str:
        return (f"Certificate {self['id']}: {self['name']} passed lessons {', '.join(self['lessons'])} of "
                f"{self['course']} on {self['date']} ({self._trust_line()})")


def certificate(name: str, require=None, out: str | os.PathLike = "certificate.json") -> Certificate:
    """A self-issued (tamper-evident only) certificate for every quiz you have passed
    (``parallel_lab.course.quiz``), saved to ``out``. ``require``: lessons that must be among them
    (e.g. ``["00", "01"]``). ValueError if one is missing or none is passed."""
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
