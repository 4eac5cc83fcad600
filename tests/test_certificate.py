"""Certificates: an instructor-signed one verifies with the public key alone, any edit or another
signer is caught, a self-issued one counts only when accepted and says it is tamper-evident only.
Also the `parallel-lab certificate` CLI."""

import json
import os
import stat

import pytest

from parallel_lab import cli
from parallel_lab.course import certificate as cert
from parallel_lab.course.quiz import progress

GRADEBOOK = ("student,lesson,exercise,passed,points,max_points,reason\n"
             "ada,00_why_split_a_model,quiz:00,true,3,3,\n"
             "ada,01_ranks_and_collectives,ring-all-reduce,true,2,2,\n"
             "ada,01_ranks_and_collectives,quiz:01,false,0,3,wrong\n"
             "bob,00_why_split_a_model,quiz:00,true,3,3,\n")


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("PARALLEL_LAB_HOME", str(tmp_path / "home"))


@pytest.fixture
def parallel_lab(monkeypatch, capsys):
    """`parallel-lab` with the two commands registered as the lead will (cli.COMMANDS)."""
    monkeypatch.setitem(cli.COMMANDS, "grade", (cli._grade, "grade", cli._grade_arguments))
    monkeypatch.setitem(cli.COMMANDS, "certificate",
                        (cli._certificate, "certificates", cli._certificate_arguments))

    def run(*argv):
        status = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return status, out, err
    return run


@pytest.fixture
def instructor(tmp_path):
    """(private key, public key file, fingerprint) of a fresh instructor key pair."""
    made = cert.keygen(tmp_path / "keys")
    return cert.load_private_key(made["private_key"]), made["public_key"], made["fingerprint"]


def test_keygen_writes_a_private_and_a_public_file_and_refuses_to_overwrite(tmp_path):
    made = cert.keygen(tmp_path / "keys", name="lin")
    private, public = tmp_path / "keys" / "lin.key", tmp_path / "keys" / "lin.pub"
    assert made == {"private_key": str(private), "public_key": str(public), "fingerprint": made["fingerprint"]}
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    key = cert.load_private_key(private)
    assert cert.fingerprint(cert.load_public_key(public)) == cert.fingerprint(key.public_key()) == made["fingerprint"]
    assert made["fingerprint"].startswith("SHA256:") and len(made["fingerprint"]) == 7 + 43
    before = private.read_bytes()
    with pytest.raises(ValueError, match="refusing to overwrite"):
        cert.keygen(tmp_path / "keys", name="lin")
    public.unlink()
    with pytest.raises(ValueError, match="refusing to overwrite"):  # either file existing is enough
        cert.keygen(tmp_path / "keys", name="lin")
    assert private.read_bytes() == before and not public.exists()
    with pytest.raises(ValueError, match="plain file name"):
        cert.keygen(tmp_path / "keys", name="../evil")


def test_key_files_that_are_not_ed25519_keys_are_rejected(tmp_path, instructor):
    _, public, fp = instructor
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        cert.load_private_key(public)  # the .pub given as --key-file
    with pytest.raises(ValueError, match="cannot read the private key file"):
        cert.load_private_key(tmp_path / "nope.key")
    line = tmp_path / "line.pub"  # the one-line form is accepted too
    line.write_text(cert.public_key_line(cert.load_public_key(public)) + "\n")
    assert cert.fingerprint(cert.load_public_key(line)) == fp
    line.write_text("AAAA\n")
    with pytest.raises(ValueError, match="not an Ed25519 public key.*32 bytes, got 3"):
        cert.load_public_key(line)


def test_signed_certificate_verifies_with_the_public_key_alone(tmp_path, instructor):
    key, public, fp = instructor
    c = cert.issue("  Ada   Lovelace ", ["01", "00", "01"], key, date="2025-03-01", issuer="Prof. Lin")
    assert c["name"] == "Ada Lovelace" and c["lessons"] == ["00", "01"] and c["version"] == 2
    assert list(c) == list(cert.SIGNED_FIELDS) and c["trust"] == cert.SIGNED and c["fingerprint"] == fp
    assert c["id"].startswith("PL-") and len(c["id"]) == 22 and c["id"] == cert.compute_id(c)
    path = cert.save(c, tmp_path / "ada.json")
    os.remove(tmp_path / "keys" / "instructor.key")  # the verifier has no secret
    assert not [p for p in tmp_path.rglob("*.key")]
    result = cert.verify(path, public)
    assert result["valid"] and result["self_issued"] is False
    assert result["fingerprint"] == result["public_key_fingerprint"] == fp
    assert result["reason"] == f"valid, instructor-signed (Ed25519) by key {fp}: Ada Lovelace, lessons 00, 01, " \
                               "2025-03-01, issuer Prof. Lin"
    # Whitespace and key order in the file do not matter: the signed bytes are canonical JSON.
    path.write_text(json.dumps(dict(reversed(list(c.items()))), indent=7))
    assert cert.verify(path, cert.load_public_key(public))["valid"]


def test_signed_certificate_needs_the_verifiers_key(instructor):
    key, _, fp = instructor
    result = cert.verify(cert.issue("Ada", ["01"], key))
    assert not result["valid"] and result["fingerprint"] == fp and result["public_key_fingerprint"] is None
    assert "--public-key" in result["reason"] and "proves nothing" in result["reason"]


SIGNED_EDITS = [("version", 1, "unsupported certificate version 1"), ("version", 2.0, "unsupported"),
                ("name", "Ada Byron", "edited after signing"), ("course", "another", "edited after signing"),
                ("lessons", ["00", "01", "02"], "edited after signing"), ("date", "2025-03-02", "edited after signing"),
                ("issuer", "Prof. Someone Else", "edited after signing"),
                ("trust", cert.SELF_ISSUED, "unexpected field(s) fingerprint, public_key, signature"),
                ("id", "PL-AAAA-AAAA-AAAA-AAAA", "edited after signing"),
                ("fingerprint", "SHA256:" + "A" * 43, "inconsistent: the fingerprint field"),
                ("public_key", "A" * 43 + "=", "not with the supplied public key"),
                ("public_key", "not base64!", "public_key is not an Ed25519 key"),
                ("signature", "A" * 86 + "==", "edited after signing"),
                ("signature", "???", "signature is not base64")]


@pytest.mark.parametrize("field,value,reason", SIGNED_EDITS)
def test_any_edit_of_a_signed_certificate_is_rejected(field, value, reason, instructor):
    key, public, _ = instructor
    c = cert.issue("Ada Lovelace", ["00", "01"], key, date="2025-03-01")
    assert cert.verify(c, public)["valid"]
    c[field] = value
    result = cert.verify(c, public)
    assert result["valid"] is False and reason in result["reason"] and "\n" not in result["reason"]


def test_every_field_of_a_signed_certificate_is_covered():
    assert {f for f, _, _ in SIGNED_EDITS} == set(cert.SIGNED_FIELDS)


def test_another_key_and_a_forger_embedding_his_own_key_are_rejected(tmp_path, instructor):
    key, public, fp = instructor
    forger = cert.load_private_key(cert.keygen(tmp_path / "mallory")["private_key"])
    forged_fp = cert.fingerprint(forger.public_key())
    # Signed by another key: the embedded key and fingerprint are the forger's, consistently.
    forged = cert.issue("Mallory", ["00", "01"], forger, issuer="instructor")
    result = cert.verify(forged, public)
    assert not result["valid"] and forged_fp in result["reason"] and fp in result["reason"]
    assert cert.verify(forged, cert.load_public_key(tmp_path / "mallory" / "instructor.pub"))["valid"]
    # Forger copies the instructor's fingerprint but embeds and signs with his own key.
    copied = cert.issue("Mallory", ["00", "01"], forger)
    copied["fingerprint"] = fp
    copied["signature"] = cert.base64.b64encode(forger.sign(cert.canonical(copied))).decode()
    result = cert.verify(copied, public)
    assert not result["valid"] and forged_fp in result["reason"] and fp in result["reason"]
    # Forger embeds the instructor's key but can only sign with his own.
    real = cert.issue("Ada", ["00"], key)
    stolen = dict(real, name="Mallory")
    stolen["signature"] = cert.base64.b64encode(forger.sign(cert.canonical(stolen))).decode()
    assert cert.verify(stolen, public)["reason"].startswith("edited after signing")


def test_self_issued_is_tamper_evident_only_and_counts_only_when_accepted():
    c = cert.issue("Ada", ["01", "00"], date="2025-03-01", issuer="Prof. Lin")
    assert list(c) == list(cert.FIELDS) and c["trust"] == "self-issued (tamper-evident only)"
    assert cert.issue("Ada", ["00", "01"], date="2025-03-01", issuer="Prof. Lin")["id"] == c["id"]  # a digest
    refused, accepted = cert.verify(c), cert.verify(c, accept_self_issued=True)
    assert not refused["valid"] and accepted["valid"]
    for result in (refused, accepted):
        assert "self-issued (tamper-evident only)" in result["reason"] and result["self_issued"] is True
        assert "issuer (claimed, not verified): Prof. Lin" in result["reason"] and result["fingerprint"] is None
    assert "--accept-self-issued" in refused["reason"] and "ask the instructor" in refused["reason"]
    for field, value in [("name", "Ada Byron"), ("lessons", ["00"]), ("date", "2025-03-02"), ("course", "x"),
                         ("issuer", "instructor"), ("id", "PL-AAAA-AAAA-AAAA-AAAA")]:
        result = cert.verify(dict(c, **{field: value}), accept_self_issued=True)
        assert not result["valid"] and result["reason"].startswith("self-issued (tamper-evident only): edited after")
    assert "unexpected field(s) signature" in cert.verify(dict(c, signature="x"), accept_self_issued=True)["reason"]


def test_malformed_certificates_say_why(tmp_path, instructor):
    key, public, _ = instructor
    c = cert.issue("Ada", ["01"], key)
    cases = {"not a certificate: unexpected field(s) grade": {**c, "grade": "A"},
             "not a certificate: missing field(s) date": {k: v for k, v in c.items() if k != "date"},
             "not a certificate: missing field(s) version": {k: v for k, v in c.items() if k != "version"},
             "not a certificate: lessons must be a list of strings": {**c, "lessons": "01"},
             "not a certificate: name must be string(s)": {**c, "name": 7},
             "not a certificate: date must be YYYY-MM-DD": {**c, "date": "1 March"},
             "not a certificate: trust must be": {**c, "trust": "trust me"},
             "unsupported certificate version 1": {"version": 1, "name": "Ada", "key_id": "public", "id": "PL-"},
             "not a certificate: expected a JSON object, got list": [c],
             "edited after signing": {**c, "name": "\ud800"}}
    for reason, bad in cases.items():
        result = cert.verify(bad, public)
        assert not result["valid"] and result["reason"].startswith(reason), (reason, result)
    (tmp_path / "x.json").write_text("not json")
    assert cert.verify(tmp_path / "x.json")["reason"].startswith("not a certificate: not UTF-8 JSON")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert cert.verify(tmp_path / "deep.json")["reason"].startswith("not a certificate: not UTF-8 JSON")
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe{")
    assert cert.verify(tmp_path / "bytes.json")["reason"].startswith("not a certificate: not UTF-8 JSON")
    assert cert.verify(tmp_path / "missing.json")["reason"].startswith("cannot read")
    with pytest.raises(ValueError, match="at least one lesson"):
        cert.issue("Ada", [])
    with pytest.raises(ValueError, match="non-empty name"):
        cert.issue("  ", ["01"])
    with pytest.raises(ValueError, match="YYYY-MM-DD, got '2025-13-01'"):
        cert.issue("Ada", ["01"], date="2025-13-01")


def test_names_are_normalised_to_nfc():
    assert cert.issue("Ade\u0301le\n Dupont", ["01"])["name"] == "Ad\u00e9le Dupont"


def test_lessons_from_gradebook(tmp_path):
    (tmp_path / "grades.csv").write_text(GRADEBOOK)
    assert cert.lessons_from_gradebook(tmp_path / "grades.csv", "ada") == ["00"]  # 01: 2 of 5 points
    assert cert.lessons_from_gradebook(tmp_path / "grades.csv", "ada", threshold=0.4) == ["00", "01"]
    with pytest.raises(ValueError, match="no rows for student 'eve'"):
        cert.lessons_from_gradebook(tmp_path / "grades.csv", "eve")
    with pytest.raises(ValueError, match="threshold must be in"):
        cert.lessons_from_gradebook(tmp_path / "grades.csv", "ada", threshold=1.5)


def test_notebook_certificate_lists_passed_quizzes(tmp_path):
    with pytest.raises(ValueError, match="no quiz passed yet"):
        cert.certificate("Ada", out=tmp_path / "c.json")
    progress.record_pass("collectives", "01", 7, 8)
    with pytest.raises(ValueError, match="not yet passed: 00"):
        cert.certificate("Ada", require=["00", "01"], out=tmp_path / "c.json")
    c = cert.certificate("Ada", require=["01"], out=tmp_path / "c.json")
    assert c["lessons"] == ["01"] and c["trust"] == cert.SELF_ISSUED
    assert not cert.verify(tmp_path / "c.json")["valid"]
    assert cert.verify(tmp_path / "c.json", accept_self_issued=True)["valid"]
    card = c._repr_html_()
    assert "passed lessons 01" in card and "tamper-evident only" in card and "claimed, not verified" in card
    assert str(c).startswith(f"Certificate {c['id']}: Ada") and "self-issued (tamper-evident only)" in str(c)


def test_signed_card_names_the_key(instructor):
    key, _, fp = instructor
    c = cert.Certificate(cert.issue("Ada <b>", ["01"], key))
    assert fp in c._repr_html_() and "Ada &lt;b&gt;" in c._repr_html_() and f"signed by key {fp}" in str(c)


def test_cli_keygen_issue_verify_round_trip(tmp_path, parallel_lab):
    (tmp_path / "grades.csv").write_text(GRADEBOOK)
    status, out, err = parallel_lab("certificate", "keygen", tmp_path / "keys", "--json")
    made = json.loads(out)
    assert status == 0 and err == "" and made["public_key"] == str(tmp_path / "keys" / "instructor.pub")
    status, out, _ = parallel_lab("certificate", "keygen", tmp_path / "keys")
    assert status == 2
    status, out, _ = parallel_lab("certificate", "keygen", tmp_path / "keys2", "--name", "lin")
    assert status == 0 and "fingerprint: SHA256:" in out and (tmp_path / "keys2" / "lin.key").exists()
    status, out, _ = parallel_lab("certificate", "issue", "--name", "Ada L.", "--gradebook", tmp_path / "grades.csv",
                                  "--student", "ada", "--key-file", made["private_key"], "--issuer", "Prof. Lin",
                                  "--date", "2025-03-01", "--out", tmp_path / "ada.json", "--json")
    issued = json.loads(out)
    assert status == 0 and issued["lessons"] == ["00"] and issued["file"] == str(tmp_path / "ada.json")
    os.remove(made["private_key"])
    status, out, err = parallel_lab("certificate", "verify", tmp_path / "ada.json", "--public-key",
                                    made["public_key"], "--json")
    report = json.loads(out)
    assert status == 0 and err == "" and report["valid"] is True and report["self_issued"] is False
    assert report["fingerprint"] == made["fingerprint"] == issued["fingerprint"]
    status, out, err = parallel_lab("certificate", "--json", "verify", tmp_path / "ada.json", "--public-key",
                                    tmp_path / "keys2" / "lin.pub")
    report = json.loads(out)
    assert status == 1 and not report["valid"] and err.strip() == f"certificate verify: {report['reason']}"
    status, out, err = parallel_lab("certificate", "verify", tmp_path / "ada.json")
    assert status == 1 and "--public-key" in err
    edited = json.loads((tmp_path / "ada.json").read_text())
    edited["lessons"].append("01")
    (tmp_path / "ada.json").write_text(json.dumps(edited))
    status, out, err = parallel_lab("certificate", "verify", tmp_path / "ada.json", "--public-key", made["public_key"])
    assert status == 1 and "edited after signing" in err and "edited after signing" in out


def test_cli_self_issued_and_bad_input(tmp_path, parallel_lab):
    (tmp_path / "grades.csv").write_text(GRADEBOOK)
    status, out, _ = parallel_lab("certificate", "issue", "--self-issued", "--name", "Ada", "--lessons", "00", "01",
                                  "--issuer", "Prof. Lin", "--out", tmp_path / "own.json")
    assert status == 0 and "issuer (claimed, not verified): Prof. Lin" in out
    status, out, err = parallel_lab("certificate", "verify", tmp_path / "own.json", "--json")
    report = json.loads(out)
    assert status == 1 and report["self_issued"] is True and "--accept-self-issued" in err
    status, out, err = parallel_lab("certificate", "verify", tmp_path / "own.json", "--accept-self-issued", "--json")
    assert status == 0 and json.loads(out)["valid"] and "tamper-evident only" in json.loads(out)["reason"]
    status, _, err = parallel_lab("certificate", "issue", "--name", "X", "--gradebook", tmp_path / "grades.csv",
                                  "--student", "nobody", "--self-issued")
    assert status == 2 and "no rows for student 'nobody'" in err
    status, _, err = parallel_lab("certificate", "issue", "--name", "X", "--lessons", "00",
                                  "--key-file", tmp_path / "missing.key")
    assert status == 2 and "cannot read the private key file" in err
    status, _, err = parallel_lab("certificate", "verify", tmp_path / "own.json", "--public-key", tmp_path / "no.pub")
    assert status == 2 and "cannot read the public key file" in err
    with pytest.raises(SystemExit):  # argparse: --key-file or --self-issued is required
        parallel_lab("certificate", "issue", "--name", "X", "--lessons", "00")
