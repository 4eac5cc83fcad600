"""Open Badges 3.0 credentials for the course: issue one, verify one with reasons.

A credential (1EdTech "Open Badges Specification v3.0", a W3C "Verifiable Credentials Data Model
v2.0" credential) looks like this (``issue`` makes it; ``proof`` by ``proof.sign``)::

    {"@context": ["https://www.w3.org/ns/credentials/v2",
                  "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"],
     "id": "https://course.example.org/credentials/7f3c...",       # or urn:uuid:...
     "type": ["VerifiableCredential", "OpenBadgeCredential"],
     "name": "parallel-lab: ... : lessons 00, 01",
     "issuer": {"id": "did:key:z6Mk...", "type": ["Profile"], "name": "Prof. Lin, CS 4xx"},
     "validFrom": "2026-05-01T12:00:00Z",
     "credentialSubject": {
         "type": ["AchievementSubject"],
         "identifier": [{"type": "IdentityObject", "identityType": "emailAddress", "hashed": true,
                         "identityHash": "sha256$<hex of sha256(email + salt)>", "salt": "<random>"},
                        {"type": "IdentityObject", "identityType": "name", "hashed": false,
                         "identityHash": "Ada Lovelace"}],
         "achievement": {"id": "urn:uuid:...", "type": ["Achievement"], "name": ..., "description": ...,
                         "criteria": {"narrative": "lessons and checks passed"}}},
     "credentialStatus": {"type": "BitstringStatusListEntry", ...},              # when revocable
     "proof": {"type": "DataIntegrityProof", "cryptosuite": "eddsa-rdfc-2022",
               "verificationMethod": "did:key:z6Mk...#z6Mk...", "proofPurpose": "assertionMethod",
               "created": ..., "proofValue": "z..."}}

The learner is identified as Open Badges 3.0 allows without a DID (§ IdentityObject): their email
hashed with a per-credential salt (whoever knows the email can check it, ``subject_matches``; the
credential alone does not reveal it), or a URI of theirs as ``credentialSubject.id``; and their name
as they want it shown, in the clear.

Trust: a credential is valid only against the issuer key the verifier supplies (the instructor's
``.pub``, whose fingerprint the instructor publishes, or the service's own key). Anyone can make a
key pair and sign a credential for any name, which is what a "self-issued" credential is: its proof
verifies with the key it names, and it is rejected because that key is not the issuer's.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import secrets
import unicodedata
import uuid
from dataclasses import asdict, dataclass, field
from typing import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from parallel_lab.course.credentials import keys, proof, status
from parallel_lab.i18n import DEFAULT, N_, _, check_language, using

COURSE = N_("parallel-lab: model parallelism (tensor and pipeline), run for real")
CONTEXT = [proof.VC_V2, proof.OB_V3]
TYPES = ["VerifiableCredential", "OpenBadgeCredential"]


# --- what was achieved -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Achievement:
    """What a credential certifies: ``lessons`` passed, each with the checks passed in it
    (``{"01": ["ring-all-reduce", "quiz:01"]}``, or a plain list of lessons), of ``course``.
    ``id``: the achievement's URI (default a UUID derived from the course and the lessons, so the
    same lessons give the same achievement); ``description``: one paragraph (default says how it was
    graded). ``lang``: the language of its name, description and criteria (``en`` or ``zh-Hant``;
    Open Badges 3.0's ``inLanguage``, stated when not English); the id does not depend on it."""

    lessons: Mapping[str, tuple] | tuple
    course: str = COURSE
    id: str | None = None
    description: str | None = None
    lang: str = DEFAULT
    checks: tuple = field(init=False, repr=False)  # ((lesson, (checks passed, sorted)), ...), by lesson

    def __post_init__(self):
        lessons = self.lessons if isinstance(self.lessons, Mapping) else {lesson: () for lesson in self.lessons}
        checks = {str(lesson): tuple(sorted(map(str, done))) for lesson, done in lessons.items()}
        if not checks:
            raise ValueError("an achievement needs at least one lesson passed, got none")
        check_language(self.lang)
        object.__setattr__(self, "checks", tuple(sorted(checks.items())))
        object.__setattr__(self, "lessons", tuple(lesson for lesson, _done in self.checks))

    @property
    def name(self) -> str:
        with using(self.lang):
            return _("{course}: lessons {lessons}").format(course=_(self.course), lessons=", ".join(self.lessons))

    @property
    def uri(self) -> str:
        return self.id or "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.course}|{','.join(self.lessons)}"))

    def narrative(self) -> str:
        """The criteria, in Markdown: every lesson and the checks passed in it."""
        with using(self.lang):
            rows = [_("- lesson {lesson}: {checks}").format(lesson=lesson, checks=", ".join(done)) if done
                    else _("- lesson {lesson}").format(lesson=lesson) for lesson, done in self.checks]
            return _("Passed these lessons of the course, graded by its sandboxed grader:") + "\n" + "\n".join(rows)

    def as_json(self) -> dict:
        with using(self.lang):
            description = self.description or _(
                "Lessons {lessons} of {course}: exercises run on real ranks and quizzes, graded by the course's "
                "grader, not by the learner's own notebook.").format(lessons=", ".join(self.lessons),
                                                                     course=_(self.course))
        data = {"id": self.uri, "type": ["Achievement"], "name": self.name, "description": description,
                "criteria": {"narrative": self.narrative()}}
        if self.lang != DEFAULT:
            data["inLanguage"] = self.lang
        return data


# --- the learner ---------------------------------------------------------------------------------

def _clean(text: str) -> str:
    return unicodedata.normalize("NFC", " ".join(str(text).split()))


def identity_hash(identity: str, salt: str) -> str:
    """Open Badges 3.0 IdentityHash: ``sha256$`` + hex SHA-256 of the UTF-8 identity + salt. An
    email is compared trimmed and lower-cased."""
    return "sha256$" + hashlib.sha256((identity.strip().lower() + salt).encode("utf-8")).hexdigest()


def _subject(name: str, email_or_id: str, salt: str | None) -> dict:
    name = _clean(name)
    if not name:
        raise ValueError("a credential needs the learner's name as it should be shown, got an empty one")
    who = str(email_or_id).strip()
    if who.lower().startswith("mailto:"):
        who = who[len("mailto:"):]
    subject: dict = {"type": ["AchievementSubject"]}
    identifiers = []
    if "@" in who and not proof.ABSOLUTE_IRI.match(who) and " " not in who:
        salt = salt or secrets.token_hex(16)
        identifiers.append({"type": "IdentityObject", "identityType": "emailAddress", "hashed": True,
                            "identityHash": identity_hash(who, salt), "salt": salt})
    elif proof.ABSOLUTE_IRI.match(who) and " " not in who:
        subject["id"] = who
    else:
        raise ValueError(f"the learner must be an email address or a URI of theirs (did:..., https://..., "
                         f"urn:...), got {who!r}")
    identifiers.append({"type": "IdentityObject", "identityType": "name", "hashed": False, "identityHash": name})
    subject["identifier"] = identifiers
    return subject


def subject_matches(credential: dict, email: str) -> bool:
    """Whether ``credential`` was issued to ``email`` (its hashed emailAddress identifier)."""
    for ident in (credential.get("credentialSubject") or {}).get("identifier") or []:
        if isinstance(ident, dict) and ident.get("identityType") == "emailAddress":
            if ident.get("hashed") and ident.get("identityHash") == identity_hash(email, ident.get("salt", "")):
                return True
            if not ident.get("hashed") and str(ident.get("identityHash", "")).strip().lower() == email.strip().lower():
                return True
    return False


# --- issuing -------------------------------------------------------------------------------------

def issue(subject_name: str, subject_email_or_id: str, achievement: Achievement, key: Ed25519PrivateKey,
          issuer_name: str, credential_id: str | None = None, valid_from=None, status: dict | None = None,
          *, issuer_id: str | None = None, issuer_url: str | None = None, salt: str | None = None,
          created=None) -> dict:
    """A signed ``OpenBadgeCredential`` (dict, ready for ``json.dumps``).

    ``subject_email_or_id``: the learner's email (stored hashed with ``salt``, default random) or a
    URI of theirs; ``subject_name``: their name as shown. ``achievement``: an ``Achievement``.
    ``key``: the issuer's private key; ``issuer_name`` its display name, ``issuer_id`` its DID
    (default the key's did:key; a ``did:web:...`` for a service on its own domain), ``issuer_url``
    its web page. ``credential_id``: the credential's URI (default ``urn:uuid:`` + a random UUID; the
    service uses its verification page's URL). ``valid_from``: date or time (default now, UTC);
    ``created``: the proof's time (default now). ``status``: ``status.status_entry(...)`` for a
    revocable credential. ValueError on bad input (names the field and the value)."""
    if not isinstance(achievement, Achievement):
        raise ValueError(f"achievement must be an Achievement, got {type(achievement).__name__}")
    issuer_name = _clean(issuer_name)
    if not issuer_name:
        raise ValueError("a credential needs the issuer's name, got an empty one")
    public = key.public_key()
    issuer_id = issuer_id or keys.did_key(public)
    if not (issuer_id == keys.did_key(public) or issuer_id.startswith("did:web:")):
        raise ValueError(f"issuer_id must be the key's did:key or a did:web, got {issuer_id!r}")
    credential_id = credential_id or f"urn:uuid:{uuid.uuid4()}"
    if not proof.ABSOLUTE_IRI.match(credential_id) or " " in credential_id:
        raise ValueError(f"credential_id must be a URI (https://... or urn:...), got {credential_id!r}")
    now = _dt.datetime.now(_dt.timezone.utc)
    issuer = {"id": issuer_id, "type": ["Profile"], "name": issuer_name}
    if issuer_url:
        issuer["url"] = issuer_url
    credential = {"@context": list(CONTEXT), "id": credential_id, "type": list(TYPES), "name": achievement.name,
                  "issuer": issuer, "validFrom": proof.timestamp(valid_from or now),
                  "credentialSubject": {**_subject(subject_name, subject_email_or_id, salt),
                                        "achievement": achievement.as_json()}}
    if status is not None:
        credential["credentialStatus"] = status
    return proof.sign(credential, key, keys.verification_method(public, issuer_id), created or now)


# --- verifying -----------------------------------------------------------------------------------

@dataclass
class Verification:
    """What ``verify`` found. ``valid``: the credential can be trusted as issued by the expected key,
    is in its validity period and not revoked; ``reason``: one line, why or why not, in English;
    ``code``: the kind of answer, for a page that words it in its own language (``CODES``). ``fingerprint``:
    of the key that signed it (None if unknown); ``expected_fingerprint``: of the key it was checked
    against. ``revoked``: True/False when a status list was checked, None otherwise. ``issuer``
    (``id``, ``name``), ``subject`` (``name``, ``id``, ``email_hashed``), ``achievement`` (``id``,
    ``name``, ``criteria``), ``id`` and ``valid_from`` as the credential states them (None when it is
    malformed)."""

    valid: bool
    reason: str
    code: str = "malformed"
    fingerprint: str | None = None
    expected_fingerprint: str | None = None
    revoked: bool | None = None
    id: str | None = None
    valid_from: str | None = None
    issuer: dict | None = None
    subject: dict | None = None
    achievement: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


CODES = {"valid": "valid", "malformed": "not a credential this course can verify (the reason says what is wrong)",
         "edited": "edited after signing", "foreign-key": "signed by another key than the issuer's",
         "no-key": "no issuer key given to verify against", "not-yet-valid": "validFrom is in the future",
         "expired": "validUntil has passed", "revoked": "revoked by the issuer",
         "status-unavailable": "the status list given cannot say whether it is revoked"}
OLD_FORMAT = ("an old parallel-lab certificate (format version 2: Ed25519 over sorted JSON), replaced by "
              "Open Badges 3.0 credentials; ask the issuer for a new one")


def _shape_error(c) -> str:
    """Why ``c`` is not an Open Badges 3.0 credential this course can verify, or ""."""
    if not isinstance(c, dict):
        return f"not a credential: expected a JSON object, got {type(c).__name__}"
    if {"version", "trust", "id"} <= set(c) and "@context" not in c:
        return OLD_FORMAT
    context = c.get("@context")
    if not isinstance(context, list) or context[:1] != [proof.VC_V2] or proof.OB_V3 not in context:
        return (f"not an Open Badges 3.0 credential: @context must start with {proof.VC_V2} and include "
                f"{proof.OB_V3}, got {str(context)[:160]}")
    types = c.get("type")
    if not isinstance(types, list) or "VerifiableCredential" not in types or "OpenBadgeCredential" not in types:
        return f"not an Open Badges 3.0 credential: type must include VerifiableCredential and OpenBadgeCredential, " \
               f"got {str(types)[:100]}"
    issuer = c.get("issuer")
    if not isinstance(issuer, (str, dict)) or (isinstance(issuer, dict) and not isinstance(issuer.get("id"), str)):
        return "not a credential: issuer must be a URI or a Profile with an id"
    subject = c.get("credentialSubject")
    if not isinstance(subject, dict) or not isinstance(subject.get("achievement"), dict):
        return "not an Open Badges 3.0 credential: credentialSubject must be one object with an achievement"
    if not isinstance(c.get("validFrom"), str):
        return "not a credential: validFrom is missing"
    try:
        proof.timestamp(c["validFrom"])
    except ValueError:
        return f"not a credential: validFrom is not a date-time with a time zone, got {c['validFrom']!r}"[:200]
    if isinstance(c.get("proof"), list):
        return f"cannot be verified: the credential has {len(c['proof'])} proofs (a proof set); one is expected"
    if not isinstance(c.get("proof"), dict) or not isinstance(c["proof"].get("verificationMethod"), str):
        return "not signed: the credential has no proof with a verificationMethod"
    return ""


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _summary(c: dict) -> dict:
    """What the credential states (read before, and whether or not, it verifies: strings or None)."""
    issuer = c["issuer"] if isinstance(c["issuer"], dict) else {"id": c["issuer"]}
    subject = c["credentialSubject"]
    idents = subject.get("identifier")
    idents = [i for i in (idents if isinstance(idents, list) else [idents]) if isinstance(i, dict)]
    name = next((i.get("identityHash") for i in idents if i.get("identityType") == "name" and not i.get("hashed")),
                None)
    achievement = subject["achievement"]
    criteria = achievement.get("criteria")
    return {"id": _text(c.get("id")), "valid_from": c["validFrom"],
            "issuer": {"id": issuer["id"], "name": _text(issuer.get("name"))},
            "subject": {"name": _text(name), "id": _text(subject.get("id")),
                        "email_hashed": any(i.get("identityType") == "emailAddress" for i in idents)},
            "achievement": {"id": _text(achievement.get("id")), "name": _text(achievement.get("name")),
                            "criteria": _text(criteria.get("narrative")) if isinstance(criteria, dict) else None}}


def _window_error(c: dict, now: _dt.datetime) -> tuple[str, str]:
    """(code, reason) if ``now`` is outside the credential's validity period, else ("", "")."""
    if proof.timestamp(c["validFrom"]) > proof.timestamp(now):
        return "not-yet-valid", _("not valid yet: validFrom {date} is in the future").format(date=c["validFrom"])
    until = c.get("validUntil")
    if until is not None:
        try:
            if proof.timestamp(until) < proof.timestamp(now):
                return "expired", _("expired: validUntil {date} has passed").format(date=until)
        except ValueError:
            return "malformed", f"not a credential: validUntil is not a date-time with a time zone, got {until!r}"[:200]
    return "", ""


def verify(credential, public_key: Ed25519PublicKey | None = None, status_list: dict | None = None,
           now: _dt.datetime | None = None) -> Verification:
    """Verify an Open Badges 3.0 credential (a parsed JSON object) offline. Valid only if it is well
    formed, its eddsa-rdfc-2022 proof verifies, its signer is ``public_key`` (the issuer's key, as the
    verifier knows it: without one nothing is valid, since anyone can make a key), it is within its
    validity period at ``now`` (default now) and, when ``status_list`` (the issuer's
    BitstringStatusListCredential) is given and the credential has a ``credentialStatus``, its bit is
    not set. Never raises on a bad credential: the reason says what is wrong."""
    problem = _shape_error(credential)
    if problem:
        return Verification(False, problem)
    seen = _summary(credential)
    issuer_id = seen["issuer"]["id"]
    method = credential["proof"]["verificationMethod"]
    expected = keys.fingerprint(public_key) if public_key is not None else None
    try:
        signer = keys.public_key_from_method(method)
    except ValueError as exc:
        return Verification(False, _("the proof's verificationMethod names no Ed25519 key: {error}").format(error=exc),
                            expected_fingerprint=expected, **seen)
    found = keys.fingerprint(signer)

    def result(code, reason, revoked=None):
        return Verification(code == "valid", reason, code, found, expected, revoked, **seen)

    if method.partition("#")[0] != issuer_id:
        return result("foreign-key", _("the proof's key belongs to {owner}, not to the issuer {issuer}").format(
            owner=method.partition("#")[0][:60], issuer=issuer_id[:60]))
    if public_key is not None and keys.raw(signer) != keys.raw(public_key):
        return result("foreign-key", _("signed by key {found}, not by the issuer key given ({expected}): a credential "
                                       "made with another key (self-issued, or another issuer's) proves nothing "
                                       "here").format(found=found, expected=expected))
    problem = proof.check(credential, signer)
    if problem == proof.MISMATCH:
        return result("edited", _("edited after signing: the eddsa-rdfc-2022 proof by key {found} does not match "
                                  "the credential's content").format(found=found))
    if problem:
        return result("malformed", _("cannot be verified: {problem}").format(problem=problem))
    if public_key is None:
        return result("no-key", _("the proof verifies with the key the credential names ({found}), but no issuer "
                                  "key was given to check it against; anyone can make a key and sign, so pass the "
                                  "issuer's public key").format(found=found))
    code, problem = _window_error(credential, now or _dt.datetime.now(_dt.timezone.utc))
    if problem:
        return result(code, problem)
    entry = credential.get("credentialStatus")
    revoked, note = None, ""
    if entry is not None and status_list is not None:
        revoked, problem = status.check(entry, status_list, issuer_id, public_key)
        if problem:
            return result("status-unavailable", _("revocation could not be checked: {problem}").format(problem=problem))
        if revoked:
            return result("revoked", _("revoked by the issuer (status list {list}, index {index})").format(
                list=entry["statusListCredential"], index=entry["statusListIndex"]), True)
        note = _("; not revoked")
    elif entry is not None:
        note = _("; revocation not checked (no status list given; the issuer's is {list})").format(
            list=entry.get("statusListCredential"))
    elif status_list is not None:
        note = _("; it has no credentialStatus (the issuer cannot revoke it)")
    who = seen["subject"]["name"] or seen["subject"]["id"] or _("the learner")
    return result("valid", _("valid: {who}, {achievement}, issued by {issuer} (key {key}) on {date}{note}").format(
        who=who, achievement=seen["achievement"]["name"], issuer=seen["issuer"]["name"] or issuer_id, key=found,
        date=credential["validFrom"][:10], note=note), revoked)
