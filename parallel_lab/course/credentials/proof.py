"""Data Integrity proofs with the ``eddsa-rdfc-2022`` cryptosuite, on the contexts the package ships.

The algorithms are those of the W3C Recommendation "Data Integrity EdDSA Cryptosuites v1.0" (2025),
§3.2 (eddsa-rdfc-2022): the document without its proof and the proof's options (with the document's
``@context``) are each canonicalised with RDFC-1.0 (W3C Recommendation "RDF Dataset
Canonicalization", 2024; pyld's ``URDNA2015``, the same algorithm) into N-Quads and hashed with
SHA-256; the signature is Ed25519 over ``sha256(proof options) + sha256(document)`` (64 bytes), its
``proofValue`` base58btc multibase (``z...``). tests/test_certificate.py reproduces the spec's test
vectors (canonical forms, hashes, signature, and the verification of its signed credential) and
1EdTech's Open Badges 3.0 vector.

No network: JSON-LD contexts come only from ``contexts/`` beside this file (``SHIPPED``), through a
document loader that refuses any other URL, with a context cache of its own (pyld's shared cache
could otherwise hold a context some other caller loaded). Undefined terms are errors, not silently
dropped (the "safe mode" the VC Data Model 2.0 §4.2 and Data Integrity §4.4 call for): a field that
has no meaning in the contexts would otherwise be left out of the signed N-Quads, so it could be
added or edited after signing without breaking the proof.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Mapping

from cachetools import LRUCache
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pyld import jsonld
from pyld.canon import URDNA2015
from pyld.context_resolver import ContextResolver

from parallel_lab.course.credentials.keys import b58encode, multibase_decode

VC_V2 = "https://www.w3.org/ns/credentials/v2"
OB_V3 = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
SHIPPED = {VC_V2: "credentials-v2.jsonld", OB_V3: "ob-v3p0-context-3.0.3.json"}
CONTEXTS = Path(__file__).resolve().parent / "contexts"
CRYPTOSUITE = "eddsa-rdfc-2022"
MISMATCH = "the signature does not match the content"
ABSOLUTE_IRI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


class ContextNotShipped(ValueError):
    """A document names a JSON-LD context that the package does not ship (it is never fetched)."""


@cache
def _shipped() -> dict:
    return {url: json.loads((CONTEXTS / name).read_text(encoding="utf-8")) for url, name in SHIPPED.items()}


class _Loader:
    """pyld document loader over a fixed set of documents (URL -> parsed JSON), with its own cache."""

    def __init__(self, documents: Mapping[str, dict]):
        self.documents = dict(documents)
        self.cache = LRUCache(maxsize=64)  # resolved contexts, shared by this loader's operations

    def __call__(self, url, options=None):
        if url not in self.documents:
            raise ContextNotShipped(f"JSON-LD context {url!r} is not one the package ships "
                                    f"({', '.join(sorted(self.documents))}); contexts are never fetched")
        return {"contextUrl": None, "documentUrl": url, "document": copy.deepcopy(self.documents[url])}


_LOADERS: dict = {}


def loader(extra: Mapping[str, dict] | None = None) -> _Loader:
    """The document loader: the shipped contexts, plus ``extra`` (URL -> context; the tests' example
    contexts). One loader, and so one context cache, per set of documents."""
    key = json.dumps(extra, sort_keys=True) if extra else ""
    if key not in _LOADERS:
        _LOADERS[key] = _Loader({**_shipped(), **(extra or {})})
    return _LOADERS[key]


class _Canonicalizer(URDNA2015):
    """pyld's RDFC-1.0 (URDNA2015) with a work limit. Blank nodes that only their neighbours tell
    apart make the Hash N-Degree Quads step try every permutation (RDFC-1.0's security considerations,
    "dataset poisoning"): a clique of 7 such nodes took 10 s and 30,247 calls here, 8 nodes 117 s. A
    credential has a handful of blank nodes, each with its own first-degree hash (no call at all)."""

    MAX_CALLS = 1000

    def __init__(self):
        super().__init__()
        self.calls = 0

    def hash_n_degree_quads(self, id_, issuer):
        self.calls += 1
        if self.calls > self.MAX_CALLS:
            raise ValueError(f"canonicalising needs more than {self.MAX_CALLS} Hash N-Degree Quads steps: a "
                             "document whose blank nodes cannot be told apart (a poisoned dataset) is refused")
        return super().hash_n_degree_quads(id_, issuer)


def _deepest(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or getattr(exc, "cause", None) is not None:
        exc = exc.__cause__ or exc.cause
    return exc


def _check_iris(node, where: str = "") -> None:
    """Every @id and @type of an expanded document is an absolute IRI or a blank node: a relative one
    would be dropped from the N-Quads, so it would not be signed."""
    if isinstance(node, list):
        for item in node:
            _check_iris(item, where)
        return
    if not isinstance(node, dict):
        return
    values = [("@id", node.get("@id"))] if "@id" in node else []
    if "@value" not in node:  # a value object's @type is its datatype, checked by pyld
        types = node.get("@type", [])
        values += [("@type", t) for t in (types if isinstance(types, list) else [types])]
    for keyword, value in values:
        if isinstance(value, str) and not (value.startswith("_:") or ABSOLUTE_IRI.match(value)):
            raise ValueError(f"{where or 'the document'}: the {keyword} {value!r} is not an absolute IRI (a term "
                             "undefined in the document's contexts, or a relative IRI), so it would not be signed")
    for key, value in node.items():
        if key not in ("@id", "@type", "@value"):
            _check_iris(value, key)


def canonize(document: dict, documents: Mapping[str, dict] | None = None) -> str:
    """RDFC-1.0 canonical N-Quads of a JSON-LD ``document``. ValueError (naming the term or context)
    if a term is undefined in its contexts, an IRI is relative, or a context is not shipped
    (``documents`` adds contexts, URL -> JSON)."""
    load = loader(documents)
    # One resolver per operation, as pyld makes (its per-operation cache is never emptied). Base None:
    # no base IRI at all, so a relative IRI stays relative and is refused (given "", pyld resolves
    # against "http://example.org/base/").
    options = {"documentLoader": load, "contextResolver": ContextResolver(load.cache, load), "base": None}

    def dropped(term):
        raise ValueError(f"the term {term!r} is not defined in the document's contexts, so it would not be "
                         "signed (undefined terms are refused)")
    try:
        expanded = jsonld.JsonLdProcessor(on_property_dropped=dropped).expand(document, options)
        _check_iris(expanded)
        dataset = jsonld.to_rdf(expanded, {**options, "produceGeneralizedRdf": False})
        return _Canonicalizer().main(dataset, {"format": "application/n-quads"})
    except jsonld.JsonLdError as exc:
        cause = _deepest(exc)
        if isinstance(cause, ValueError):
            raise cause.__class__(str(cause)) from None
        raise ValueError(f"not valid JSON-LD: {str(exc).splitlines()[0]}"
                         f"{'' if cause is exc else f' ({str(cause).splitlines()[0]})'}"[:300]) from None


def timestamp(value) -> str:
    """An XML Schema dateTime in UTC to the second (``2026-05-01T12:00:00Z``) from a datetime with a time
    zone, a date (midnight UTC) or an ISO string."""
    if isinstance(value, str):
        try:
            value = (_dt.date.fromisoformat(value) if len(value) == 10
                     else _dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            raise ValueError(f"not an ISO date (YYYY-MM-DD) or time with zone, got {value!r}") from None
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc)
    if not isinstance(value, _dt.datetime):
        raise ValueError(f"expected a date or time, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(f"a time needs a time zone, got {value.isoformat()}")
    return value.astimezone(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def proof_options(document: dict, verification_method: str, created) -> dict:
    """The proof without its value (§3.3.5 Proof Configuration's input): type, cryptosuite, created
    (UTC, seconds), verificationMethod, proofPurpose ``assertionMethod``."""
    return {"type": "DataIntegrityProof", "cryptosuite": CRYPTOSUITE, "created": timestamp(created),
            "verificationMethod": verification_method, "proofPurpose": "assertionMethod"}


def hash_data(document: dict, options: dict, documents: Mapping[str, dict] | None = None) -> bytes:
    """§3.3.4 Hashing: sha256(canonical proof configuration) + sha256(canonical document), 64 bytes.
    ``document`` has no proof; ``options`` is the proof without proofValue (its @context, when it has
    one, replaces the document's)."""
    context = options.get("@context", document.get("@context"))
    config = {**{k: v for k, v in options.items() if k != "@context"}, "@context": context}
    body = {**{k: v for k, v in document.items() if k != "@context"}, "@context": context}
    return (hashlib.sha256(canonize(config, documents).encode("utf-8")).digest()
            + hashlib.sha256(canonize(body, documents).encode("utf-8")).digest())


def sign(document: dict, key: Ed25519PrivateKey, verification_method: str, created,
         documents: Mapping[str, dict] | None = None) -> dict:
    """A copy of ``document`` (no proof) with an eddsa-rdfc-2022 ``proof`` by ``key``, named by
    ``verification_method`` (e.g. ``keys.verification_method(key.public_key())``), made at ``created``
    (a datetime with time zone, or an ISO string)."""
    if "proof" in document:
        raise ValueError("the document already has a proof; sign the document without it")
    options = proof_options(document, verification_method, created)
    signature = key.sign(hash_data(document, options, documents))
    return {**document, "proof": {**options, "proofValue": "z" + b58encode(signature)}}


def check(document: dict, public_key: Ed25519PublicKey, documents: Mapping[str, dict] | None = None) -> str:
    """Why ``document``'s proof is not a valid eddsa-rdfc-2022 assertion proof by ``public_key``, or
    "" if it is (§3.3.2 Verify Proof). A reason is one line; a malformed document gives a reason too.
    Which key the proof *should* be by is the caller's question (``keys.public_key_from_method``)."""
    proof = document.get("proof")
    if isinstance(proof, list):
        return f"the document has {len(proof)} proofs (a proof set); one proof is expected"
    if not isinstance(proof, dict):
        return "the document has no proof (unsigned)"
    wrong = [f"{k} {proof.get(k)!r} (expected {v!r})" for k, v in
             (("type", "DataIntegrityProof"), ("cryptosuite", CRYPTOSUITE), ("proofPurpose", "assertionMethod"))
             if proof.get(k) != v]
    if wrong:
        return f"not an eddsa-rdfc-2022 assertion proof: {'; '.join(wrong)}"
    try:
        signature = multibase_decode(proof.get("proofValue"))
        if proof["proofValue"][0] != "z" or len(signature) != 64:
            raise ValueError(f"a base58btc (z) Ed25519 signature of 64 bytes, got {len(signature)} bytes")
    except (ValueError, IndexError) as exc:
        return f"the proofValue is not a signature: {exc}"
    options = {k: v for k, v in proof.items() if k != "proofValue"}
    if "@context" in options:
        ours = document.get("@context")
        theirs = options["@context"] if isinstance(options["@context"], list) else [options["@context"]]
        ours = ours if isinstance(ours, list) else [ours]
        if ours[:len(theirs)] != theirs:
            return "the proof's @context is not the start of the document's @context"
    unsecured = {k: v for k, v in document.items() if k != "proof"}
    try:
        data = hash_data(unsecured, options, documents)
    except ValueError as exc:
        return str(exc)
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return MISMATCH
    return ""
