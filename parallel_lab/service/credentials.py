"""The service's one door to the course's credentials: the issuer key, issuing, verifying, and the
status list that publishes revocations.

The credential itself is the course's (``course.certificate``): the service never writes a format
of its own. Revocation lives in the service's database and is published as a W3C Bitstring Status
List (``status_list``: bit ``i`` of the GZIP-compressed bitstring, at least 131,072 entries, is 1
when the credential with status index ``i`` is revoked) at a stable URL.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from parallel_lab.course import certificate

KEY_NAME = "issuer"
STATUS_LIST_SIZE = 131_072  # the specification's minimum (16 KiB), so one list hides who is revoked


def issuer_key(directory: Path) -> Ed25519PrivateKey:
    """The service's signing key in ``directory`` (``issuer.key``, mode 0600), made on first use."""
    private = Path(directory) / f"{KEY_NAME}.key"
    if not private.exists():
        certificate.keygen(directory, KEY_NAME)
    return certificate.load_private_key(private)


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return certificate.fingerprint(public)


def public_pem(key: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def issue(key: Ed25519PrivateKey, *, name: str, course: str, lessons: list[str], issuer: str,
          issued: dt.datetime) -> dict:
    """A signed credential for ``name``, who passed ``lessons`` of ``course``."""
    return certificate.issue(name, lessons, key, date=issued.date().isoformat(), issuer=issuer, course=course)


def verify(document: dict, public_key: Ed25519PublicKey, revoked: bool) -> dict:
    """``{"valid", "reason", "fingerprint", ...}``: the signature checked with the issuer's public key,
    then the status list's word."""
    result = certificate.verify(document, public_key)
    if result["valid"] and revoked:
        result = {**result, "valid": False, "reason": "revoked by the issuer (its bit in the status list is set)"}
    return {**result, "revoked": revoked}


def holder(document: dict) -> dict:
    """Whom, what and when a credential says (whatever its verification)."""
    return {"name": document.get("name"), "course": document.get("course"), "lessons": document.get("lessons", []),
            "date": document.get("date"), "issuer": document.get("issuer"), "id": document.get("id")}


def encoded_list(revoked_indexes, size: int = STATUS_LIST_SIZE) -> str:
    """The Bitstring Status List's ``encodedList``: multibase base64url (``u``) of the GZIP of the
    bitstring; index 0 is the most significant bit of the first byte."""
    bits = bytearray(size // 8)
    for i in revoked_indexes:
        if not 0 <= i < size:
            raise ValueError(f"status index {i} is outside the list of {size} entries")
        bits[i // 8] |= 0x80 >> (i % 8)
    return "u" + base64.urlsafe_b64encode(gzip.compress(bytes(bits), mtime=0)).decode().rstrip("=")


def decode_list(encoded: str) -> bytes:
    data = encoded[1:] if encoded.startswith("u") else encoded
    return gzip.decompress(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))


def is_set(encoded: str, index: int) -> bool:
    bits = decode_list(encoded)
    return bool(bits[index // 8] & (0x80 >> (index % 8)))


def status_list(url: str, issuer: str, revoked_indexes, now: dt.datetime) -> dict:
    """The service's status list (``/status/1``): a ``BitstringStatusListCredential`` body with
    purpose ``revocation``. Unsigned: it is served by the issuer's own service."""
    return {"@context": ["https://www.w3.org/ns/credentials/v2"], "id": url,
            "type": ["VerifiableCredential", "BitstringStatusListCredential"], "issuer": issuer,
            "validFrom": now.replace(microsecond=0).isoformat() + "Z",
            "credentialSubject": {"id": f"{url}#list", "type": "BitstringStatusList", "statusPurpose": "revocation",
                                  "encodedList": encoded_list(revoked_indexes)}}
