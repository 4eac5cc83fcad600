"""Open Badges 3.0 credentials (parallel_lab.course.credentials): the W3C eddsa-rdfc-2022 test vectors
and 1EdTech's Open Badges one; issuing and verifying offline with the issuer's public key alone;
edits, foreign keys, self-issued and revoked credentials rejected with reasons; the Bitstring Status
List; no network. The command line is in tests/test_cli.py."""

import copy
import datetime as dt
import gzip
import hashlib
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pyld import jsonld

from parallel_lab.course import credentials as cr
from parallel_lab.course.credentials import badge, keys, proof, status
from parallel_lab.course.credentials.gradebook import lessons_from_gradebook
from parallel_lab.course.quiz import progress
from parallel_lab.i18n import using
from parallel_lab.show import quizbox
from parallel_lab.show.progress import my_progress

DATA = Path(__file__).parent / "data" / "credentials"
W3C = DATA / "vc-di-eddsa"
EXAMPLE_CONTEXTS = {"https://www.w3.org/ns/credentials/examples/v2": W3C / "context-examples-v2.jsonld",
                    "https://w3id.org/citizenship/v4rc1": W3C / "context-citizenship-v4rc1.jsonld"}
WHEN = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
LIST_URL = "https://course.example.org/status/1"


def _json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _text(path):
    return Path(path).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def examples():
    return {url: _json(path) for url, path in EXAMPLE_CONTEXTS.items()}


@pytest.fixture(scope="module")
def instructor():
    key = Ed25519PrivateKey.generate()
    return key, key.public_key()


@pytest.fixture(scope="module")
def achievement():
    return cr.Achievement({"01": ["quiz:01", "ring-all-reduce"], "00": ["quiz:00"]})


@pytest.fixture(scope="module")
def issued(instructor, achievement):
    key, _ = instructor
    return cr.issue("Ada Lovelace", "ada@example.org", achievement, key, "Prof. Lin, CS 4xx",
                    credential_id="https://course.example.org/credentials/c-17", valid_from=WHEN,
                    status=cr.status_entry(LIST_URL, 17), created=WHEN)


# --- the W3C test vectors ------------------------------------------------------------------------

def test_the_shipped_vc_context_is_the_one_the_recommendation_names():
    """VC Data Model 2.0 §B.1 publishes the SHA-256 of https://www.w3.org/ns/credentials/v2."""
    shipped = (proof.CONTEXTS / proof.SHIPPED[proof.VC_V2]).read_bytes()
    assert hashlib.sha256(shipped).hexdigest() == "59955ced6697d61e03f2b2556febe5308ab16842846f5b586d7f1f7adec92734"


@pytest.mark.parametrize("case,unsigned", [("", "unsigned.json"), ("employ", "employmentAuth.json")])
def test_w3c_vectors_canonical_forms_and_hashes(case, unsigned, examples):
    """Data Integrity EdDSA Cryptosuites v1.0, appendix A (eddsa-rdfc-2022): RDFC-1.0 N-Quads of the
    credential and of the proof configuration, their SHA-256, and the 64 bytes that are signed."""
    here = W3C / "eddsa-rdfc-2022" / case
    document, config = _json(W3C / unsigned), _json(here / "proofConfigDataInt.json")
    assert proof.canonize(document, examples) == _text(here / "canonDocDataInt.txt")
    assert proof.canonize(config, examples) == _text(here / "proofCanonDataInt.txt")
    assert hashlib.sha256(proof.canonize(document, examples).encode()).hexdigest() == \
        _text(here / "docHashDataInt.txt").strip()
    assert hashlib.sha256(proof.canonize(config, examples).encode()).hexdigest() == \
        _text(here / "proofHashDataInt.txt").strip()
    assert proof.hash_data(document, config, examples).hex() == _text(here / "combinedHashDataInt.txt").strip()


@pytest.mark.parametrize("case,unsigned", [("", "unsigned.json"), ("employ", "employmentAuth.json")])
def test_w3c_vectors_signature_and_signed_credential(case, unsigned, examples):
    """The spec's key pair signs the credential into exactly the spec's proofValue and document."""
    here = W3C / "eddsa-rdfc-2022" / case
    pair = _json(W3C / "keyPair.json")
    key = keys.private_key_from_multibase(pair["privateKeyMultibase"])
    assert keys.multikey(key.public_key()) == pair["publicKeyMultibase"]
    config = _json(here / "proofConfigDataInt.json")
    assert config["verificationMethod"] == keys.verification_method(key.public_key())
    signed = proof.sign(_json(W3C / unsigned), key, config["verificationMethod"], config["created"], examples)
    assert signed["proof"]["proofValue"] == _text(here / "sigBTC58DataInt.txt").strip()
    assert keys.multibase_decode(signed["proof"]["proofValue"]).hex() == _text(here / "sigHexDataInt.txt").strip()
    assert signed == _json(here / "signedDataInt.json")


@pytest.mark.parametrize("case", ["", "employ"])
def test_w3c_signed_examples_verify_and_any_edit_fails(case, examples):
    signed = _json(W3C / "eddsa-rdfc-2022" / case / "signedDataInt.json")
    signer = keys.public_key_from_method(signed["proof"]["verificationMethod"])  # the did:key names the key
    assert proof.check(signed, signer, examples) == ""
    edited = copy.deepcopy(signed)
    edited["validFrom"] = edited["validFrom"].replace("T00", "T01")
    assert proof.check(edited, signer, examples) == proof.MISMATCH
    edited = copy.deepcopy(signed)
    edited["proof"]["created"] = "2023-02-24T23:36:39Z"
    assert proof.check(edited, signer, examples) == proof.MISMATCH
    assert proof.check(signed, Ed25519PrivateKey.generate().public_key(), examples) == proof.MISMATCH


def test_1edtech_open_badges_vector():
    """1EdTech's "Linked Data Proof Test Vector for Open Badges 3.0": an OpenBadgeCredential on the
    VC v2 and OB 3.0.3 contexts (the ones the package ships), canonical forms, hashes, signature."""
    vector = _json(DATA / "ob-v3p0" / "vector.json")
    signed = vector["signed"]
    unsigned = {k: v for k, v in signed.items() if k != "proof"}
    options = {k: v for k, v in signed["proof"].items() if k != "proofValue"}
    assert proof.canonize(unsigned) == _text(DATA / "ob-v3p0" / "document-canon.txt")
    assert proof.canonize({**options, "@context": signed["@context"]}) == _text(DATA / "ob-v3p0" / "proof-canon.txt")
    assert proof.hash_data(unsigned, options).hex() == vector["proofHashHex"] + vector["documentHashHex"]
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["secretKeyHex"])[:32])
    assert keys.raw(key.public_key()).hex() == vector["publicKeyHex"]
    assert keys.multikey(key.public_key()) == vector["publicKeyMultibase"]
    again = proof.sign(unsigned, key, options["verificationMethod"], options["created"])
    assert keys.multibase_decode(again["proof"]["proofValue"]).hex() == vector["signatureHex"]
    assert again["proof"]["proofValue"] == signed["proof"]["proofValue"]
    assert proof.check(signed, key.public_key()) == ""


def test_base58btc_and_identity_hash_examples():
    for data in (b"", b"\0", b"\0\0\1", bytes(range(256)), b"hello world"):
        assert keys.b58decode(keys.b58encode(data)) == data
    assert keys.b58encode(b"hello world") == "StV1DL6CwTryKyV"  # the base58 draft's example
    with pytest.raises(ValueError, match="not in the alphabet"):
        keys.b58decode("0OIl")
    # Open Badges 3.0, IdentityHash: 'a@example.com' salted with 'Kosher'.
    assert badge.identity_hash("a@example.com", "Kosher") == \
        "sha256$b5809d8a92f8858436d7e6b87c12ebc0ae1eac4baecc2c0b913aee2c922ef399"


# --- no network ----------------------------------------------------------------------------------

@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection or fetch a JSON-LD document fails the test."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args[:2]}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(jsonld, "_default_document_loader", refuse)
    proof._LOADERS.clear()  # no context cached from an earlier test
    proof._shipped.cache_clear()
    yield attempts
    assert attempts == []


def test_signing_and_verifying_never_touch_the_network(no_network, achievement):
    key = Ed25519PrivateKey.generate()
    c = cr.issue("Ada", "ada@example.org", achievement, key, "Prof. Lin", status=cr.status_entry(LIST_URL, 3))
    lst = cr.status_list_credential(LIST_URL, [3], key)
    result = cr.verify(c, key.public_key(), lst)
    assert not result.valid and result.revoked is True and result.reason.startswith("revoked by the issuer")
    assert cr.verify(c, key.public_key()).valid


def test_a_context_the_package_does_not_ship_is_refused_not_fetched(no_network, issued, instructor):
    other = copy.deepcopy(issued)
    other["@context"].append("https://example.org/my-context.jsonld")
    result = cr.verify(other, instructor[1])
    assert not result.valid and "'https://example.org/my-context.jsonld' is not one the package ships" in result.reason
    with pytest.raises(proof.ContextNotShipped, match="never fetched"):
        proof.canonize({"@context": "https://example.org/x", "@id": "urn:x"})


# --- issuing -------------------------------------------------------------------------------------

def test_an_issued_credential_is_an_open_badge_that_verifies_with_the_public_key_alone(issued, instructor):
    _, public = instructor
    assert issued["@context"] == ["https://www.w3.org/ns/credentials/v2",
                                  "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"]
    assert issued["type"] == ["VerifiableCredential", "OpenBadgeCredential"]
    assert issued["issuer"] == {"id": cr.did_key(public), "type": ["Profile"], "name": "Prof. Lin, CS 4xx"}
    assert cr.did_key(public).startswith("did:key:z6Mk") and issued["validFrom"] == "2026-03-01T12:00:00Z"
    assert issued["proof"]["verificationMethod"] == f"{cr.did_key(public)}#{cr.did_key(public)[8:]}"
    assert issued["proof"]["cryptosuite"] == "eddsa-rdfc-2022" and issued["proof"]["proofValue"].startswith("z")
    achievement = issued["credentialSubject"]["achievement"]
    assert achievement["type"] == ["Achievement"] and "lessons 00, 01" in achievement["name"]
    assert achievement["criteria"]["narrative"].endswith("- lesson 00: quiz:00\n- lesson 01: quiz:01, ring-all-reduce")
    result = cr.verify(json.loads(json.dumps(issued)), public)  # as read back from a file
    assert result.valid and result.revoked is None and result.code == "valid", result.reason
    assert result.fingerprint == result.expected_fingerprint == cr.fingerprint(public)
    assert result.subject == {"name": "Ada Lovelace", "id": None, "email_hashed": True}
    assert result.issuer == {"id": cr.did_key(public), "name": "Prof. Lin, CS 4xx"}
    assert result.achievement["name"] == achievement["name"] and result.id.endswith("/credentials/c-17")
    assert result.reason.startswith("valid: Ada Lovelace, parallel-lab") and "revocation not checked" in result.reason
    assert set(result.as_dict()) >= {"valid", "reason", "fingerprint", "issuer", "subject", "achievement", "revoked"}


def test_the_learner_is_identified_by_a_salted_email_hash_and_a_display_name(issued):
    text = json.dumps(issued)
    assert "ada@example.org" not in text
    email, name = issued["credentialSubject"]["identifier"]
    assert email["identityType"] == "emailAddress" and email["hashed"] is True and len(email["salt"]) == 32
    assert email["identityHash"] == badge.identity_hash("ada@example.org", email["salt"])
    assert name == {"type": "IdentityObject", "identityType": "name", "hashed": False, "identityHash": "Ada Lovelace"}
    assert cr.subject_matches(issued, " Ada@Example.org") and not cr.subject_matches(issued, "eve@example.org")


def test_a_learner_with_a_uri_and_names_normalised(instructor, achievement):
    key, public = instructor
    c = cr.issue("Ade\u0301le\n  Dupont", "did:example:adele", achievement, key, "Prof. Lin")
    assert c["credentialSubject"]["id"] == "did:example:adele"
    assert c["credentialSubject"]["identifier"][0]["identityHash"] == "Ad\u00e9le Dupont"
    assert c["id"].startswith("urn:uuid:")
    assert cr.verify(c, public).subject["id"] == "did:example:adele"


def test_bad_issuing_input_is_refused_with_the_value(instructor, achievement):
    key, _ = instructor
    cases = [(dict(subject_name="  "), "learner's name"), (dict(subject_email_or_id="ada"), "email address or a URI"),
             (dict(issuer_name=""), "issuer's name"), (dict(credential_id="c 17"), "must be a URI"),
             (dict(valid_from="1 March"), "not an ISO date"), (dict(achievement=["01"]), "must be an Achievement"),
             (dict(issuer_id="https://example.org"), "did:key or a did:web")]
    for change, message in cases:
        args = dict(subject_name="Ada", subject_email_or_id="ada@example.org", achievement=achievement, key=key,
                    issuer_name="Prof. Lin") | change
        with pytest.raises(ValueError, match=message):
            cr.issue(**args)
    with pytest.raises(ValueError, match="at least one lesson"):
        cr.Achievement([])


def test_achievements_are_named_by_their_lessons():
    a, b = cr.Achievement(["01", "00"]), cr.Achievement({"00": [], "01": []})
    assert a.lessons == b.lessons == ("00", "01") and a.uri == b.uri and a.uri.startswith("urn:uuid:")
    assert cr.Achievement(["00"]).uri != a.uri
    assert cr.Achievement({"01": ["x", "y"]}) == cr.Achievement({"01": ("y", "x")}) != cr.Achievement(["01"])
    assert len({cr.Achievement({"01": ["x"]}), cr.Achievement({"01": ["x"]})}) == 1  # hashable
    assert cr.Achievement(["00"], id="https://x.org/a").as_json()["id"] == "https://x.org/a"


def test_did_web_issuer(instructor, achievement):
    key, public = instructor
    did = cr.did_web("course.example.org")
    c = cr.issue("Ada", "ada@example.org", achievement, key, "parallel-lab course service", issuer_id=did)
    assert c["issuer"]["id"] == "did:web:course.example.org"
    assert c["proof"]["verificationMethod"] == f"did:web:course.example.org#{keys.multikey(public)}"
    assert cr.verify(c, public).valid
    assert not cr.verify(c, Ed25519PrivateKey.generate().public_key()).valid
    document = cr.did_web_document("course.example.org", public)
    assert document["assertionMethod"] == [c["proof"]["verificationMethod"]]
    assert document["verificationMethod"][0]["publicKeyMultibase"] == keys.multikey(public)
    assert cr.did_web("localhost:8000/course") == "did:web:localhost%3A8000:course"
    with pytest.raises(ValueError, match="host name"):
        cr.did_web("https://x.org")


# --- rejected, with reasons ----------------------------------------------------------------------

def _edit(credential, path, value):
    edited = copy.deepcopy(credential)
    *parents, last = path
    node = edited
    for step in parents:
        node = node[step]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return edited


_DELETE = object()


def _paths(node, here=()):
    """The path of every value in a JSON document, the document's own (``()``) first."""
    yield here
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        yield from _paths(value, here + (key,))


def _value(node, path):
    for step in path:
        node = node[step]
    return node
EDITS = [(("name",), "Badge for everything"),
         (("validFrom",), "2020-03-01T12:00:00Z"),
         (("id",), "https://course.example.org/credentials/c-18"),
         (("issuer", "name"), "Prof. Someone Else"),
         (("credentialSubject", "identifier", 1, "identityHash"), "Eve"),
         (("credentialSubject", "identifier", 0, "identityHash"), "sha256$" + "0" * 64),
         (("credentialSubject", "identifier", 0, "salt"), "x"),
         (("credentialSubject", "achievement", "name"), "parallel-lab: lessons 00-18"),
         (("credentialSubject", "achievement", "criteria", "narrative"), "Passed every lesson"),
         (("credentialSubject", "achievement", "id"), "urn:uuid:00000000-0000-0000-0000-000000000000"),
         (("credentialSubject", "id"), "did:example:eve"),
         (("credentialStatus",), _DELETE),
         (("credentialStatus", "statusListIndex"), "18"),
         (("credentialStatus", "statusListIndex"), 17),
         (("proof", "created"), "2026-03-01T12:00:01Z"),
         (("proof", "proofValue"), "z" + keys.b58encode(bytes(64)))]


@pytest.mark.parametrize("path,value", EDITS, ids=[".".join(map(str, p)) for p, _ in EDITS])
def test_any_edit_is_rejected(path, value, issued, instructor):
    result = cr.verify(_edit(issued, path, value), instructor[1])
    assert not result.valid and result.reason.startswith("edited after signing"), result.reason
    assert result.code == "edited" and "\n" not in result.reason and result.fingerprint == cr.fingerprint(instructor[1])


def test_an_added_field_with_no_meaning_is_rejected_not_ignored(issued, instructor):
    """Without @vocab an undefined term would be dropped from the signed N-Quads, so adding one would
    not break the proof: it is refused instead."""
    for edited, term in [(_edit(issued, ("grade",), "A+"), "grade"),
                         (_edit(issued, ("credentialSubject", "score"), 100), "score"),
                         (_edit(issued, ("type",), [*issued["type"], "Diploma"]), "Diploma")]:
        result = cr.verify(edited, instructor[1])
        assert not result.valid and result.reason.startswith("cannot be verified") and term in result.reason


def test_a_foreign_key_is_rejected(issued, instructor, achievement):
    _, public = instructor
    other = Ed25519PrivateKey.generate()
    theirs = cr.issue("Ada Lovelace", "ada@example.org", achievement, other, "Prof. Lin, CS 4xx")
    assert cr.verify(theirs, other.public_key()).valid  # a fine credential, of another issuer
    result = cr.verify(theirs, public)
    assert not result.valid and result.code == "foreign-key"
    assert result.fingerprint == cr.fingerprint(other.public_key())
    assert f"signed by key {cr.fingerprint(other.public_key())}, not by the issuer key given " \
           f"({cr.fingerprint(public)})" in result.reason


def test_a_self_issued_credential_is_rejected(issued, instructor, achievement):
    """A learner can make a key, copy the instructor's name, even the instructor's credential, and
    re-sign: only the instructor's key makes a credential valid."""
    _, public = instructor
    mine = Ed25519PrivateKey.generate()
    forged = {k: v for k, v in copy.deepcopy(issued).items() if k != "proof"}
    forged["credentialSubject"]["identifier"][1]["identityHash"] = "Mallory"
    # 1. Keeps the instructor's did:key as issuer, signs with their own key under the instructor's DID.
    method = keys.verification_method(public)
    with_their_did = proof.sign(forged, mine, method, WHEN)
    result = cr.verify(with_their_did, public)
    assert not result.valid and result.reason.startswith("edited after signing")
    # 2. Their own did:key throughout: the proof verifies, but it is not the issuer's key.
    forged["issuer"] = dict(forged["issuer"], id=cr.did_key(mine.public_key()))
    self_signed = proof.sign(forged, mine, keys.verification_method(mine.public_key()), WHEN)
    result = cr.verify(self_signed, public)
    assert not result.valid and "not by the issuer key given" in result.reason and "self-issued" in result.reason
    # 3. A proof by the key the issuer field does not name.
    mixed = proof.sign(_edit(issued, ("proof",), _DELETE), mine, keys.verification_method(mine.public_key()), WHEN)
    assert "not to the issuer" in cr.verify(mixed, public).reason
    # 4. Without the issuer's key nothing is valid, however well it is signed.
    result = cr.verify(issued)
    assert not result.valid and "no issuer key was given" in result.reason and result.fingerprint
    assert result.code == "no-key"


def test_validity_period(instructor, achievement):
    key, public = instructor
    later = cr.issue("Ada", "ada@example.org", achievement, key, "Prof. Lin", valid_from=WHEN + dt.timedelta(days=3))
    assert "not valid yet" in cr.verify(later, public, now=WHEN).reason
    assert cr.verify(later, public, now=WHEN).code == "not-yet-valid"
    assert cr.verify(later, public, now=WHEN + dt.timedelta(days=4)).valid


def test_malformed_credentials_say_why_and_never_raise(issued, instructor):
    _, public = instructor
    old = {"version": 2, "name": "Ada", "course": "x", "lessons": ["01"], "date": "2025-03-01", "issuer": "i",
           "trust": "instructor-signed (Ed25519)", "id": "PL-AAAA", "signature": "x"}
    cases = {"not a credential: expected a JSON object, got list": [issued],
             "an old parallel-lab certificate": old,
             "not an Open Badges 3.0 credential: @context": _edit(issued, ("@context",), [proof.VC_V2]),
             "not an Open Badges 3.0 credential: type": _edit(issued, ("type",), ["VerifiableCredential"]),
             "not an Open Badges 3.0 credential: credentialSubject": _edit(issued, ("credentialSubject",), []),
             "not a credential: issuer": _edit(issued, ("issuer",), 7),
             "not a credential: validFrom is not": _edit(issued, ("validFrom",), "yesterday"),
             "not signed": _edit(issued, ("proof",), _DELETE),
             "cannot be verified: the credential has 2 proofs": _edit(issued, ("proof",), [issued["proof"]] * 2),
             "cannot be verified: not an eddsa-rdfc-2022 assertion proof: cryptosuite 'eddsa-jcs-2022'":
                 _edit(issued, ("proof", "cryptosuite"), "eddsa-jcs-2022"),
             "cannot be verified: the proofValue is not a signature": _edit(issued, ("proof", "proofValue"), "z0OIl"),
             "the proof's verificationMethod names no Ed25519 key": _edit(issued, ("proof", "verificationMethod"),
                                                                          "did:key:zQ3s#zQ3s")}
    for reason, bad in cases.items():
        result = cr.verify(bad, public)
        assert not result.valid and result.reason.startswith(reason), (reason, result.reason)
        assert result.code == "malformed"
    for junk in (None, 7, "text", {}, {"@context": None}, {"@context": [proof.VC_V2, proof.OB_V3], "type": "x"},
                 _edit(issued, ("credentialSubject", "achievement"), "x"),
                 _edit(issued, ("@context",), [proof.VC_V2, proof.OB_V3, {"@vocab": 5}])):
        assert not cr.verify(junk, public).valid


def test_no_value_anywhere_makes_verify_raise(issued, instructor):
    """Every field replaced by every JSON type: a reason each time, never an exception."""
    for path in list(_paths(issued))[1:]:
        current = _value(issued, path)
        for value in (None, 7, True, "x", [], {}, _DELETE):
            if type(value) is type(current) and value == current:
                continue
            result = cr.verify(_edit(issued, path, value), instructor[1])
            assert isinstance(result.reason, str) and result.reason and result.code in cr.CODES
            assert not result.valid, (path, value, result.reason)


def test_no_value_anywhere_in_a_status_list_makes_verify_raise(issued, instructor):
    key, public = instructor
    listed = cr.status_list_credential(LIST_URL, [3], key)
    assert cr.verify(issued, public, listed).valid
    for path in list(_paths(listed))[1:]:
        current = _value(listed, path)
        for value in (None, 7, "x", [], {}, _DELETE):
            if type(value) is type(current) and value == current:
                continue
            result = cr.verify(issued, public, _edit(listed, path, value))
            assert not result.valid and result.revoked is None, (path, value, result.reason)


def test_a_poisoned_dataset_is_refused_quickly():
    """Seven blank nodes that only their neighbours tell apart cost RDFC-1.0 30,000 steps (10 s here):
    canonicalisation stops at proof._Canonicalizer.MAX_CALLS."""
    clique = [{"@id": f"_:b{i}", "https://example.org/knows": [{"@id": f"_:b{j}"} for j in range(7) if j != i]}
              for i in range(7)]
    with pytest.raises(ValueError, match="poisoned dataset"):
        proof.canonize({"@context": {}, "@graph": clique})


# --- revocation ----------------------------------------------------------------------------------

def test_status_list_is_gzip_base64url_of_at_least_16_kb_left_bit_first(instructor):
    key, public = instructor
    lst = cr.status_list_credential(LIST_URL, [0, 9, 131_071], key, valid_from=WHEN, created=WHEN)
    assert lst["type"] == ["VerifiableCredential", "BitstringStatusListCredential"] and lst["id"] == LIST_URL
    subject = lst["credentialSubject"]
    assert subject["type"] == "BitstringStatusList" and subject["statusPurpose"] == "revocation"
    encoded = subject["encodedList"]
    assert encoded[0] == "u" and "=" not in encoded
    bits = gzip.decompress(keys.multibase_decode(encoded))
    assert len(bits) == 16 * 1024 and bits[0] == 0x80 and bits[1] == 0x40 and bits[-1] == 0x01
    assert cr.revoked_indices(lst) == [0, 9, 131_071]
    assert cr.is_revoked(lst, 9) and not cr.is_revoked(lst, 8)
    assert status.check(cr.status_entry(LIST_URL, 9), lst, cr.did_key(public), public) == (True, "")
    assert status.encode([]) == status.encode([], 131_072) and len(cr.revoked_indices(
        cr.status_list_credential(LIST_URL, range(5000), key))) == 5000
    with pytest.raises(ValueError, match="at least 131072 entries"):
        status.encode([], 1024)
    with pytest.raises(ValueError, match=r"integer in \[0, 131072\)"):
        status.encode([131_072])
    with pytest.raises(ValueError, match="integer >= 0"):
        cr.status_entry(LIST_URL, -1)


def test_revocation_is_checked_against_the_issuers_signed_list(issued, instructor):
    key, public = instructor
    revoked = cr.verify(issued, public, cr.status_list_credential(LIST_URL, [3, 17], key))
    assert not revoked.valid and revoked.revoked is True and revoked.code == "revoked"
    assert revoked.reason == f"revoked by the issuer (status list {LIST_URL}, index 17)"
    kept = cr.verify(issued, public, cr.status_list_credential(LIST_URL, [3, 16, 18], key))
    assert kept.valid and kept.revoked is False and kept.reason.endswith("; not revoked")
    # A list that does not answer for this credential makes it invalid, with the reason.
    other = Ed25519PrivateKey.generate()
    cases = {"is issued by": cr.status_list_credential(LIST_URL, [], other),
             "the credential's is": cr.status_list_credential(LIST_URL + "x", [], key)}
    cleared = cr.status_list_credential(LIST_URL, [17], key)
    cleared["credentialSubject"]["encodedList"] = status.encode([])  # un-revoked by editing the list
    cases["the status list's proof does not verify"] = cleared
    small = cr.status_list_credential(LIST_URL, [], key)
    small["credentialSubject"]["encodedList"] = "u" + status.base64.urlsafe_b64encode(
        gzip.compress(bytes(16))).decode().rstrip("=")
    cases["the status list's proof does not verify"] = small
    for reason, lst in cases.items():
        result = cr.verify(issued, public, lst)
        assert not result.valid and result.revoked is None and reason in result.reason, result.reason
        assert result.code == "status-unavailable"
    with pytest.raises(ValueError, match="fewer than the 131072"):
        status.decode(small["credentialSubject"]["encodedList"])
    with pytest.raises(ValueError, match="inflates past"):
        status.decode("u" + status.base64.urlsafe_b64encode(gzip.compress(bytes(status.MAX_BYTES + 8))).decode())


# --- keys ----------------------------------------------------------------------------------------

def test_keygen_writes_a_private_and_a_public_file_and_refuses_to_overwrite(tmp_path):
    made = cr.keygen(tmp_path / "keys", name="lin")
    private, public = tmp_path / "keys" / "lin.key", tmp_path / "keys" / "lin.pub"
    assert made["private_key"] == str(private) and made["public_key"] == str(public)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600 and stat.S_IMODE(os.stat(public).st_mode) == 0o644
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    key = cr.load_private_key(private)
    assert cr.fingerprint(cr.load_public_key(public)) == cr.fingerprint(key.public_key()) == made["fingerprint"]
    assert made["fingerprint"].startswith("SHA256:") and len(made["fingerprint"]) == 7 + 43
    assert made["did"] == cr.did_key(key.public_key())
    before = private.read_bytes()
    with pytest.raises(ValueError, match="refusing to overwrite"):
        cr.keygen(tmp_path / "keys", name="lin")
    public.unlink()
    with pytest.raises(ValueError, match="refusing to overwrite"):  # either file existing is enough
        cr.keygen(tmp_path / "keys", name="lin")
    assert private.read_bytes() == before and not public.exists()
    with pytest.raises(ValueError, match="plain file name"):
        cr.keygen(tmp_path / "keys", name="../evil")


def test_public_keys_in_every_form_and_bad_key_files(tmp_path):
    made = cr.keygen(tmp_path / "keys")
    public = cr.load_public_key(made["public_key"])
    for text in (keys.public_key_line(public), cr.did_key(public), keys.multikey(public),
                 keys.verification_method(public), Path(made["public_key"]).read_text()):
        (tmp_path / "k.pub").write_text(text + "\n")
        assert cr.fingerprint(cr.load_public_key(tmp_path / "k.pub")) == made["fingerprint"]
        assert isinstance(cr.parse_public_key(text), Ed25519PublicKey)
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        cr.load_private_key(made["public_key"])  # the .pub given as the private key
    with pytest.raises(ValueError, match="cannot read the private key file"):
        cr.load_private_key(tmp_path / "nope.key")
    for text, message in [("AAAA", "32 bytes, got 3"), ("not a key!", "not PEM, did:key, multibase or base64"),
                          ("did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme", "not an Ed25519 Multikey"),
                          (Path(made["private_key"]).read_text(), "not an Ed25519 public key")]:
        (tmp_path / "bad.pub").write_text(text)
        with pytest.raises(ValueError, match=message):
            cr.load_public_key(tmp_path / "bad.pub")


# --- the gradebook -------------------------------------------------------------------------------

GRADEBOOK = ("student,lesson,exercise,passed,points,max_points,reason\n"
             "ada,00_why_split_a_model,quiz:00,true,3,3,\n"
             "ada,01_ranks_and_collectives,ring-all-reduce,true,2,2,\n"
             "ada,01_ranks_and_collectives,quiz:01,false,0,3,wrong\n"
             "bob,00_why_split_a_model,quiz:00,true,3,3,\n")


def test_lessons_and_checks_from_a_gradebook(tmp_path):
    (tmp_path / "grades.csv").write_text(GRADEBOOK)
    assert lessons_from_gradebook(tmp_path / "grades.csv", "ada") == {"00": ["quiz:00"]}  # 01: 2 of 5 points
    assert lessons_from_gradebook(tmp_path / "grades.csv", "ada", threshold=0.4) == \
        {"00": ["quiz:00"], "01": ["ring-all-reduce"]}
    with pytest.raises(ValueError, match="no rows for student 'eve'"):
        lessons_from_gradebook(tmp_path / "grades.csv", "eve")
    with pytest.raises(ValueError, match="threshold must be in"):
        lessons_from_gradebook(tmp_path / "grades.csv", "ada", threshold=1.5)
    with pytest.raises(ValueError, match="cannot read the gradebook"):
        lessons_from_gradebook(tmp_path / "none.csv", "ada")


# --- what a learner sees in the notebook ---------------------------------------------------------

def test_the_notebook_shows_progress_that_says_it_is_not_a_credential(monkeypatch, tmp_path):
    """A learner without an instructor gets their own record of the quizzes passed, which says it
    proves nothing to anyone else and how a verifiable credential is obtained; no notebook function
    makes a "certificate" any more."""
    monkeypatch.setenv("PARALLEL_LAB_HOME", str(tmp_path / "home"))
    assert "No quiz passed yet" in str(my_progress())
    progress.record_pass("collectives", "01", 7, 8)
    progress.record_pass("faq", None, 5, 6)
    card = my_progress()
    text, page = str(card), card._repr_html_()
    assert "lesson 01: quiz collectives, 7 of 8 points" in text and "lesson faq: quiz faq, 5 of 6 points" in text
    assert str(tmp_path / "home" / "progress.json") in text
    for shown in (text, page):
        assert "it is not a credential" in shown and "anyone can edit it" in shown
        assert "A credential that anyone can verify (Open Badges 3.0" in shown and "grading service" in shown
    with using("zh-Hant"):
        assert "它不是憑證（credential）" in str(my_progress()) and "第 01 課" in str(my_progress())
    (tmp_path / "home" / "progress.json").write_text(json.dumps({"passed": {"x": {"points": "many"}, "y": 3}}))
    assert "No quiz passed yet" in str(my_progress())  # the learner's own file may hold anything
    for lang in ("en", "zh-Hant"):
        passed = quizbox._label(lang, "passed")
        assert "my_progress()" in passed and "certificate(" not in passed
    with pytest.raises(ImportError):
        __import__("parallel_lab.course.certificate")


def test_a_credential_in_traditional_chinese_states_its_language_and_verifies(instructor, achievement):
    """The achievement's name, description and criteria in the learner's language (Open Badges 3.0's
    ``inLanguage``), the same achievement id; verify's reason in the verifier's language."""
    key, public = instructor
    chinese = cr.Achievement({"01": ["quiz:01", "ring-all-reduce"], "00": ["quiz:00"]}, lang="zh-Hant")
    assert chinese.uri == achievement.uri and "inLanguage" not in achievement.as_json()
    made = cr.issue("林小美", "mei@example.org", chinese, key, "Prof. Lin, CS 4xx", valid_from=WHEN, created=WHEN)
    shown = made["credentialSubject"]["achievement"]
    assert shown["inLanguage"] == "zh-Hant" and shown["name"].endswith("：第 00, 01 課")
    assert shown["criteria"]["narrative"].startswith("通過本課程的下列各課") and "- 第 01 課：quiz:01" in \
        shown["criteria"]["narrative"] and "在真實 rank 上執行的練習" in shown["description"]
    assert cr.verify(made, public).valid
    with using("zh-Hant"):
        assert cr.verify(made, public).reason.startswith("有效：林小美，parallel-lab：模型平行")
        edited = copy.deepcopy(made)
        edited["credentialSubject"]["achievement"]["name"] += "!"
        refused = cr.verify(edited, public)
    assert refused.code == "edited" and refused.reason.startswith("簽署後被修改過")
    with pytest.raises(ValueError):
        cr.Achievement(["00"], lang="fr")
