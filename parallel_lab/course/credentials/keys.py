"""An issuer's Ed25519 keys: files, fingerprints, and the ``did:key`` that names them in a credential.

Key files (``keygen``): ``NAME.key``, the private key as PEM PKCS8 (unencrypted, mode 0600), and
``NAME.pub``, the public key as PEM SubjectPublicKeyInfo; the same files the course's earlier
certificates used, so an instructor's key keeps working. ``load_public_key`` also reads one line of
base64 of the 32 raw bytes, a ``did:key:z6Mk...`` or its bare multibase ``z6Mk...``.

Fingerprint: ``SHA256:`` + unpadded base64 of the SHA-256 of the 32 raw public key bytes (as OpenSSH
writes them): what an instructor publishes and a verifier compares.

``did:key`` (W3C CCG "The did:key Method v0.9", and "Data Integrity EdDSA Cryptosuites v1.0" §2.1.1
Multikey): ``did:key:`` + multibase base58btc (``z``) of the multicodec ``ed25519-pub`` prefix
``0xed 0x01`` and the 32 raw bytes; its one verification method is ``did:key:z6Mk...#z6Mk...``.
A ``did:web`` issuer (``did_web``) names the same key as ``did:web:DOMAIN#z6Mk...``; its DID document
(``did_web_document``) is what the service publishes at ``https://DOMAIN/.well-known/did.json``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DEFAULT_KEY_NAME = "instructor"
ED25519_PUB = b"\xed\x01"   # multicodec ed25519-pub, as an unsigned varint
ED25519_PRIV = b"\x80\x26"  # multicodec ed25519-priv (0x1300), as an unsigned varint
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


# --- base58btc and multibase ---------------------------------------------------------------------

def b58encode(data: bytes) -> str:
    """Bitcoin's base58 alphabet; each leading zero byte becomes a leading ``1``."""
    number = int.from_bytes(data, "big")
    out = ""
    while number:
        number, digit = divmod(number, 58)
        out = _B58[digit] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def b58decode(text: str) -> bytes:
    """The bytes of a base58btc string; ValueError on a character outside the alphabet."""
    number = 0
    for char in text:
        digit = _B58.find(char)
        if digit < 0:
            raise ValueError(f"not base58btc: {char!r} is not in the alphabet")
        number = number * 58 + digit
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def multibase_decode(text: str) -> bytes:
    """Bytes of a multibase string in base58btc (``z``) or unpadded base64url (``u``)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a multibase string: {text!r}"[:100])
    if text[0] == "z":
        return b58decode(text[1:])
    if text[0] == "u":
        try:
            return base64.urlsafe_b64decode(text[1:] + "=" * (-len(text[1:]) % 4))
        except (binascii.Error, ValueError):
            raise ValueError(f"not base64url after the multibase prefix u: {text[:40]!r}") from None
    raise ValueError(f"multibase prefix {text[0]!r} is neither z (base58btc) nor u (base64url)")


# --- public keys ---------------------------------------------------------------------------------

def raw(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """``SHA256:`` + unpadded base64 of SHA-256 of the key's 32 raw bytes (43 characters after the colon)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw(public_key)).digest()).decode().rstrip("=")


def multikey(public_key: Ed25519PublicKey) -> str:
    """The key's ``publicKeyMultibase``: ``z6Mk...`` (base58btc of 0xed01 + 32 raw bytes)."""
    return "z" + b58encode(ED25519_PUB + raw(public_key))


def did_key(public_key: Ed25519PublicKey) -> str:
    """``did:key:z6Mk...`` naming this key."""
    return "did:key:" + multikey(public_key)


def did_web(domain: str) -> str:
    """``did:web:DOMAIN`` (a port's colon percent-encoded, a path's slashes as colons), e.g.
    ``did_web("course.example.org")``; ValueError if ``domain`` is not a host name."""
    host, _, path = domain.partition("/")
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?", host) or ".." in host:
        raise ValueError(f"did:web needs a host name such as course.example.org, got {domain!r}")
    return "did:web:" + host.replace(":", "%3A") + "".join(":" + p for p in path.split("/") if p)


def verification_method(public_key: Ed25519PublicKey, issuer: str | None = None) -> str:
    """The proof's ``verificationMethod``: ``ISSUER#z6Mk...`` (issuer default ``did_key(public_key)``)."""
    return f"{issuer or did_key(public_key)}#{multikey(public_key)}"


def did_web_document(domain: str, public_key: Ed25519PublicKey) -> dict:
    """The DID document of ``did_web(domain)`` (DID Core 1.0; a Multikey verification method), which
    the service serves at ``https://DOMAIN/.well-known/did.json`` for verifiers that resolve did:web."""
    did = did_web(domain)
    method = verification_method(public_key, did)
    return {"@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
            "id": did,
            "verificationMethod": [{"id": method, "type": "Multikey", "controller": did,
                                    "publicKeyMultibase": multikey(public_key)}],
            "assertionMethod": [method]}


def public_key_from_multikey(text: str) -> Ed25519PublicKey:
    """The Ed25519 key of a ``z6Mk...`` multibase; ValueError if it is not one."""
    data = multibase_decode(text)
    if data[:2] != ED25519_PUB or len(data) != 34:
        raise ValueError(f"{text[:60]!r} is not an Ed25519 Multikey (multicodec 0xed01 and 32 bytes, "
                         f"got prefix {data[:2].hex()} and {len(data) - 2} bytes)")
    return Ed25519PublicKey.from_public_bytes(data[2:])


def public_key_from_method(method: str) -> Ed25519PublicKey:
    """The key a verification method names by its fragment: ``did:key:z6Mk...#z6Mk...`` or
    ``did:web:...#z6Mk...``. For did:key the DID and the fragment must be the same key."""
    did, sep, fragment = method.partition("#")
    if not sep:
        raise ValueError(f"verificationMethod {method!r} has no #fragment naming the key"[:160])
    key = public_key_from_multikey(fragment)
    if did.startswith("did:key:") and did[len("did:key:"):] != fragment:
        raise ValueError(f"verificationMethod {method[:80]!r}: the did:key and its fragment name different keys")
    return key


def parse_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from text: PEM, a ``did:key:z6Mk...`` (or a verification method with
    it), a bare ``z6Mk...`` multibase, or base64 of the 32 raw bytes. ValueError if none of these."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode("ascii"))
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError(f"a {type(key).__name__}, not an Ed25519 public key")
            return key
        if text.startswith("did:key:"):
            return public_key_from_multikey(text[len("did:key:"):].partition("#")[0])
        if text.startswith("z6Mk"):
            return public_key_from_multikey(text)
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"not PEM, did:key, multibase or base64: {text[:60]!r}") from None
    except UnsupportedAlgorithm as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    if len(data) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, got {len(data)}")
    return Ed25519PublicKey.from_public_bytes(data)


def public_key_line(public_key: Ed25519PublicKey) -> str:
    """The one-line base64 form of a public key (its 32 raw bytes)."""
    return base64.b64encode(raw(public_key)).decode()


# --- key files -----------------------------------------------------------------------------------

def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ValueError(f"{path} exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask may have taken bits away from a public key's 0644


def keygen(directory: str | os.PathLike, name: str = DEFAULT_KEY_NAME) -> dict:
    """Make a new Ed25519 key pair in ``directory`` (created if missing): ``NAME.key`` (private, PEM
    PKCS8, mode 0600) and ``NAME.pub`` (public, PEM). Refuses to overwrite either file. Returns
    ``{"private_key": path, "public_key": path, "fingerprint": "SHA256:...", "did": "did:key:..."}``."""
    if not name or name != Path(name).name or name.startswith("."):
        raise ValueError(f"a key name must be a plain file name (no folder, no leading dot), got {name!r}")
    directory = Path(directory)
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    existing = [str(p) for p in (private, public) if p.exists()]
    if existing:
        raise ValueError(f"{' and '.join(existing)} already exist(s); refusing to overwrite a key "
                         "(credentials signed with it would no longer verify)")
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    _write_new(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()), 0o600)
    _write_new(public, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return {"private_key": str(private), "public_key": str(public),
            "fingerprint": fingerprint(key.public_key()), "did": did_key(key.public_key())}


def _read_key_file(path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc.strerror}") from None


def private_key_from_multibase(text: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from its ``secretKeyMultibase`` (multicodec ed25519-priv 0x1300 and the
    32-byte seed, base58btc), the form of the W3C test vectors' key pair."""
    data = multibase_decode(text)
    if data[:2] != ED25519_PRIV or len(data) != 34:
        raise ValueError("not an Ed25519 secret key multibase (multicodec 0x1300 and a 32-byte seed)")
    return Ed25519PrivateKey.from_private_bytes(data[2:])


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


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path``: PEM (``NAME.pub`` from ``keygen``), one line of base64 of
    its 32 raw bytes, or a ``did:key``. ValueError if it is none of these."""
    data = _read_key_file(path, "public key")
    try:
        return parse_public_key(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not an Ed25519 public key (PEM, did:key or one-line base64): "
                         f"{str(exc).splitlines()[0][:120]}") from None
