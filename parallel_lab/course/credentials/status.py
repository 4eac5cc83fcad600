"""Revocation with a Bitstring Status List (W3C Recommendation "Bitstring Status List v1.0", 2025).

A revocable credential carries a ``credentialStatus`` of type ``BitstringStatusListEntry``
(``status_entry``): the URL of the issuer's status list credential and the credential's index in it.
The issuer publishes a ``BitstringStatusListCredential`` (``status_list_credential``), signed like
any credential, whose ``encodedList`` is the bitstring (bit i set: the credential at index i is
revoked), GZIP-compressed and multibase base64url-encoded (``u`` + unpadded base64url), at least
16 KB uncompressed (131,072 entries, §2.1: so that a list does not give away how many credentials
an issuer has). Bit 0 is the left-most bit: the most significant bit of the first byte (§3.1.1).
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import zlib
from typing import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from parallel_lab.course.credentials import keys, proof

MIN_ENTRIES = 131_072        # 16 KB of bits, the spec's minimum (§2.1, §3.2)
MAX_BYTES = 1 << 24          # decompressed size a verifier accepts (16 MiB, 134 M entries): no gzip bomb
PURPOSE = "revocation"


def status_entry(list_url: str, index: int) -> dict:
    """The ``credentialStatus`` of a credential at ``index`` of the revocation list at ``list_url``."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"a status list index is an integer >= 0, got {index!r}")
    if not proof.ABSOLUTE_IRI.match(str(list_url)):
        raise ValueError(f"a status list's URL must be absolute (https://...), got {list_url!r}")
    return {"id": f"{list_url}#{index}", "type": "BitstringStatusListEntry", "statusPurpose": PURPOSE,
            "statusListIndex": str(index), "statusListCredential": list_url}


def encode(revoked: Iterable[int], entries: int = MIN_ENTRIES) -> str:
    """``encodedList`` for a list of ``entries`` bits with the ``revoked`` indices set."""
    if entries < MIN_ENTRIES or entries % 8:
        raise ValueError(f"a status list has at least {MIN_ENTRIES} entries, a multiple of 8, got {entries}")
    bits = bytearray(entries // 8)
    for index in revoked:
        if not isinstance(index, int) or not 0 <= index < entries:
            raise ValueError(f"a revoked index must be an integer in [0, {entries}), got {index!r}")
        bits[index // 8] |= 0x80 >> (index % 8)
    return "u" + base64.urlsafe_b64encode(gzip.compress(bytes(bits), mtime=0)).decode().rstrip("=")


def decode(encoded: str) -> bytes:
    """The bitstring of an ``encodedList``; ValueError if it is not multibase base64url GZIP of at
    least 16 KB (and at most ``MAX_BYTES``)."""
    if not isinstance(encoded, str) or not encoded.startswith("u"):
        raise ValueError("encodedList must be multibase base64url (a string starting with u)")
    packed = keys.multibase_decode(encoded)
    inflate = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
    try:
        bits = inflate.decompress(packed, MAX_BYTES)
    except zlib.error as exc:
        raise ValueError(f"encodedList is not GZIP data ({exc})") from None
    if inflate.unconsumed_tail:
        raise ValueError(f"encodedList inflates past {MAX_BYTES} bytes")
    if len(bits) * 8 < MIN_ENTRIES:
        raise ValueError(f"the status list has {len(bits) * 8} entries, fewer than the {MIN_ENTRIES} the spec requires")
    return bits


def status_list_credential(list_url: str, revoked: Iterable[int], key: Ed25519PrivateKey,
                           valid_from=None, entries: int = MIN_ENTRIES, issuer_id: str | None = None,
                           created=None) -> dict:
    """The signed ``BitstringStatusListCredential`` at ``list_url`` with the ``revoked`` indices set,
    issued (like the credentials it covers) by ``issuer_id`` (default the key's did:key). Publish it at
    ``list_url``; issue it again after every revocation (``valid_from``, ``created`` default now)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    issuer = issuer_id or keys.did_key(key.public_key())
    document = {"@context": [proof.VC_V2], "id": list_url,
                "type": ["VerifiableCredential", "BitstringStatusListCredential"], "issuer": issuer,
                "validFrom": proof.timestamp(valid_from or now),
                "credentialSubject": {"id": f"{list_url}#list", "type": "BitstringStatusList",
                                      "statusPurpose": PURPOSE, "encodedList": encode(revoked, entries)}}
    return proof.sign(document, key, keys.verification_method(key.public_key(), issuer), created or now)


def revoked_indices(status_list: dict) -> list[int]:
    """Every index set in a status list credential (not verified here: see ``check``)."""
    bits = decode(status_list["credentialSubject"]["encodedList"])
    return [8 * i + b for i, byte in enumerate(bits) if byte for b in range(8) if byte & (0x80 >> b)]


def is_revoked(status_list: dict, index: int) -> bool:
    """Whether bit ``index`` of a status list credential is set (not verified here: see ``check``)."""
    bits = decode(status_list["credentialSubject"]["encodedList"])
    if not 0 <= index < len(bits) * 8:
        raise ValueError(f"status list index {index} is outside the list's {len(bits) * 8} entries")
    return bool(bits[index // 8] & (0x80 >> (index % 8)))


def check(entry, status_list, issuer: str, public_key) -> tuple[bool | None, str]:
    """(revoked, why not known) for a credential's ``credentialStatus`` ``entry`` against
    ``status_list``, which must be the list it names, a valid BitstringStatusListCredential of the
    same ``issuer`` signed by ``public_key``. ``(None, reason)`` when the list cannot answer."""
    if not isinstance(entry, dict) or entry.get("type") != "BitstringStatusListEntry":
        return None, f"the credentialStatus is not a BitstringStatusListEntry: {str(entry)[:80]}"
    if entry.get("statusPurpose") != PURPOSE:
        return None, f"the credentialStatus's purpose is {entry.get('statusPurpose')!r}, not {PURPOSE!r}"
    if not isinstance(status_list, dict):
        return None, "the status list is not a JSON object"
    url = entry.get("statusListCredential")
    if status_list.get("id") != url:
        return None, f"the status list given is {status_list.get('id')!r}, but the credential's is {url!r}"
    types = status_list.get("type")
    if "BitstringStatusListCredential" not in (types if isinstance(types, list) else [types]):
        return None, "the status list given is not a BitstringStatusListCredential"
    listed_by = status_list.get("issuer")
    listed_by = listed_by.get("id") if isinstance(listed_by, dict) else listed_by
    if listed_by != issuer:
        return None, f"the status list is issued by {str(listed_by)[:80]!r}, not by the credential's issuer"
    signed = status_list.get("proof")
    method = signed.get("verificationMethod") if isinstance(signed, dict) else None
    if method != keys.verification_method(public_key, issuer):
        return None, "the status list is not signed by the issuer's key"
    problem = proof.check(status_list, public_key)
    if problem:
        return None, f"the status list's proof does not verify ({problem})"
    subject = status_list.get("credentialSubject") or {}
    if not isinstance(subject, dict) or subject.get("statusPurpose") != PURPOSE:
        return None, f"the status list is not a {PURPOSE} list"
    index = entry.get("statusListIndex")
    if not isinstance(index, str) or not index.isdigit():
        return None, f"the statusListIndex must be a string of digits, got {index!r}"
    try:
        return is_revoked(status_list, int(index)), ""
    except (ValueError, KeyError) as exc:
        return None, f"the status list cannot be read: {exc}"
