"""The service's one door to the course's credentials (``course.credentials``: Open Badges 3.0,
``eddsa-rdfc-2022`` Data Integrity proofs, ``did:key`` issuer, Bitstring Status List).

The service issues each credential with its verification page's URL as its ``id`` and an entry in
the service's one revocation list (``/status/1``, a signed ``BitstringStatusListCredential`` re-signed
whenever the set of revoked entries changes), and verifies with its own public key and that list:
the same check ``parallel-lab certificate verify FILE --public-key issuer.pub --status-list FILE``
makes offline.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from parallel_lab.course import credentials as cr

KEY_NAME = "issuer"


def issuer_key(directory: Path) -> Ed25519PrivateKey:
    """The service's signing key in ``directory`` (``issuer.key``, mode 0600), made on first use."""
    private = Path(directory) / f"{KEY_NAME}.key"
    if not private.exists():
        cr.keygen(directory, KEY_NAME)
    return cr.load_private_key(private)


def _public(key) -> Ed25519PublicKey:
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def fingerprint(key) -> str:
    return cr.fingerprint(_public(key))


def did(key) -> str:
    return cr.did_key(_public(key))


def public_pem(key) -> bytes:
    return _public(key).public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def issue(key: Ed25519PrivateKey, *, name: str, email: str, lessons: dict, course: str, issuer: str,
          issuer_url: str, credential_url: str, status_url: str, status_index: int, issued: dt.datetime) -> dict:
    """A signed ``OpenBadgeCredential`` for ``name`` (``email`` stored hashed): ``lessons`` maps each
    lesson passed to the checks passed in it."""
    return cr.issue(name, email, cr.Achievement(lessons, course=course), key, issuer, credential_id=credential_url,
                    valid_from=issued.replace(tzinfo=dt.timezone.utc), status=cr.status_entry(status_url, status_index),
                    issuer_url=issuer_url)


class StatusList:
    """The service's signed revocation list, made again only when the revoked entries change."""

    def __init__(self, url: str, key: Ed25519PrivateKey):
        self.url, self.key = url, key
        self._lock, self._revoked, self._document = threading.Lock(), None, None

    def document(self, revoked) -> dict:
        revoked = frozenset(revoked)
        with self._lock:
            if revoked != self._revoked:
                self._document = cr.status_list_credential(self.url, sorted(revoked), self.key)
                self._revoked = revoked
            return self._document


def verify(document: dict, key, status_list: dict) -> dict:
    """``course.credentials.verify`` with the service's public key and status list, as a dict
    (``valid``, ``reason``, ``revoked``, ``fingerprint``, ``subject``, ``achievement``, ...)."""
    return cr.verify(document, _public(key), status_list).as_dict()
