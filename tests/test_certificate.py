"""Certificates: an untouched one verifies, any edit is caught, and an instructor key cannot be
forged by someone who only has the public course key. Also the `parallel-lab certificate` CLI."""

import json
import os
import stat

import pytest

from parallel_lab.course import certificate as cert
from parallel_lab import cli

INSTRUCTOR = cert.Key(b"0123456789abcdef0123456789abcdef", instructor=True)
OTHER = cert.Key(b"fedcba9876543210fedcba9876543210", instructor=True)


@pytest.fixture(autouse=True)
def no_key(monkeypatch, tmp_path):
    for name in ("PARALLEL_LAB_CERT_KEY", "PARALLEL_LAB_CERT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLEL_LAB_HOME", str(tmp_path / "home"))


@pytest.fixture
def parallel_lab(monkeypatch, capsys):
    """`parallel-lab` with the two commands registered as the lead will (cli.COMMANDS)."""
    monkeypatch.setitem(cli.COMMANDS, "grade", (cli._grade, "grade", cli._grade_arguments))
    monkeypatch.setitem(cli.COMMANDS, "certificate",
                        (cli._certificate, "certificates", cli._certificate_arguments))

    def run(*argv):
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err
    return run


def test_untouched_certificate_verifies():
    c = cert.issue("  Ada   Lovelace ", ["01", "00", "01"], date="2025-03-01")
    assert c["name"] == "Ada Lovelace" and c["lessons"] == ["00", "01"]
    assert c["id"].startswith("PL-") and len(c["id"]) == 22
    result = cert.verify(c)
    assert result["valid"] and "tamper-evident only" in result["reason"]
    assert cert.issue("Ada Lovelace", ["00", "01"], date="2025-03-01")["id"] == c["id"]  # deterministic


@pytest.mark.parametrize("field,value", [("name", "Ada Byron"), ("lessons", ["00", "01", "02"]),
                                         ("date", "2025-03-02"), ("course", "another course"),
                                         ("issuer", "instructor"), ("id", "PL-AAAA-AAAA-AAAA-AAAA")])
def test_any_edit_is_rejected(field, value):
    c = cert.issue("Ada Lovelace", ["00", "01"], date="2025-03-01")
    c[field] = value
    result = cert.verify(c)
    assert result == {"valid": False, "reason": "edited after issue: the ID does not match the name, course, "
                                                "lessons, date and issuer (or the ID itself was changed)"}


def test_malformed_certificates_say_why(tmp_path):
    c = cert.issue("Ada", ["01"])
    assert cert.verify({**c, "grade": "A"})["reason"] == "not a certificate: unexpected field(s) grade"
    del c["date"]
    assert cert.verify(c)["reason"] == "not a certificate: missing field(s) date"
    (tmp_path / "x.json").write_text("not json")
    assert cert.verify(tmp_path / "x.json")["reason"].startswith("not a certificate: not JSON")
    assert cert.verify(tmp_path / "missing.json")["reason"].startswith("cannot read")
    with pytest.raises(ValueError, match="at least one lesson"):
        cert.issue("Ada", [])


def test_instructor_key_cannot_be_forged_with_the_public_key():
    real = cert.issue("Ada", ["01"], key=INSTRUCTOR, date="2025-03-01")
    assert real["key_id"] == INSTRUCTOR.key_id and real["issuer"] == "instructor"
    assert cert.verify(real, INSTRUCTOR)["valid"]
    # A student copies the instructor's key id but can only compute IDs with the public key.
    forged = dict(real, name="Mallory")
    forged["id"] = cert.compute_id(forged, cert.PUBLIC_KEY)
    assert cert.verify(forged, INSTRUCTOR)["reason"].startswith("edited after issue")
    # Self-issued (public key) certificates do not count in instructor mode unless accepted.
    own = cert.issue("Mallory", ["01"])
    assert not cert.verify(own, INSTRUCTOR)["valid"]
    assert "self-issued with the public course key" in cert.verify(own, INSTRUCTOR)["reason"]
    assert cert.verify(own, INSTRUCTOR, accept_self_issued=True)["valid"]
    # Without the key, or with another one, an instructor certificate cannot be checked.
    assert "verify it with that key" in cert.verify(real)["reason"]
    assert "not with this key" in cert.verify(real, OTHER)["reason"]


def test_keys_come_from_env_or_file(tmp_path, monkeypatch):
    assert cert.load_key() == cert.PUBLIC_KEY
    monkeypatch.setenv("PARALLEL_LAB_CERT_KEY", INSTRUCTOR.secret.decode())
    assert cert.load_key() == INSTRUCTOR
    monkeypatch.delenv("PARALLEL_LAB_CERT_KEY")
    key = cert.keygen(tmp_path / "key")
    assert stat.S_IMODE(os.stat(tmp_path / "key").st_mode) == 0o600 and key.instructor
    monkeypatch.setenv("PARALLEL_LAB_CERT_KEY_FILE", str(tmp_path / "key"))
    assert cert.load_key() == key
    with pytest.raises(ValueError, match="refusing to overwrite"):
        cert.keygen(tmp_path / "key")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        cert.load_key(environ={"PARALLEL_LAB_CERT_KEY": "short"})


def test_notebook_certificate_lists_passed_quizzes(tmp_path):
    from parallel_lab.course.quiz import progress

    with pytest.raises(ValueError, match="no quiz passed yet"):
        cert.certificate("Ada", out=tmp_path / "c.json")
    progress.record_pass("collectives", "01", 7, 8)
    with pytest.raises(ValueError, match="not yet passed: 00"):
        cert.certificate("Ada", require=["00", "01"], out=tmp_path / "c.json")
    c = cert.certificate("Ada", require=["01"], out=tmp_path / "c.json")
    assert c["lessons"] == ["01"] and cert.verify(tmp_path / "c.json")["valid"]
    assert "passed lessons 01" in c._repr_html_() and str(c).startswith(f"Certificate {c['id']}: Ada")


def test_cli_verify_accepts_untouched_and_rejects_edited(tmp_path, parallel_lab):
    path = cert.save(cert.issue("Ada", ["00", "01"]), tmp_path / "c.json")
    status, out, err = parallel_lab("certificate", "verify", str(path), "--json")
    assert status == 0 and json.loads(out)["valid"] is True and err == ""
    edited = json.loads(path.read_text())
    edited["lessons"].append("02")
    path.write_text(json.dumps(edited))
    status, out, err = parallel_lab("certificate", "--json", "verify", str(path))
    report = json.loads(out)
    assert status == 1 and report["valid"] is False and report["reason"].startswith("edited after issue")
    assert err.strip() == f"certificate verify: {report['reason']}"


def test_cli_issue_from_gradebook_with_instructor_key(tmp_path, parallel_lab):
    (tmp_path / "grades.csv").write_text(
        "student,lesson,exercise,passed,points,max_points,reason\n"
        "ada,00_why_split_a_model,quiz:00,true,3,3,\n"
        "ada,01_ranks_and_collectives,ring-all-reduce,true,2,2,\n"
        "ada,01_ranks_and_collectives,quiz:01,false,0,3,wrong\n"
        "bob,00_why_split_a_model,quiz:00,true,3,3,\n")
    status, out, _ = parallel_lab("certificate", "keygen", str(tmp_path / "key"), "--json")
    assert status == 0 and json.loads(out)["key_id"].startswith("k-")
    status, out, _ = parallel_lab("certificate", "issue", "--name", "Ada L.", "--gradebook",
                                  str(tmp_path / "grades.csv"), "--student", "ada", "--key-file",
                                  str(tmp_path / "key"), "--out", str(tmp_path / "ada.json"), "--json")
    issued = json.loads(out)
    assert status == 0 and issued["lessons"] == ["00"]  # 01: 2 of 5 points, under 0.8
    status, out, _ = parallel_lab("certificate", "verify", str(tmp_path / "ada.json"), "--key-file",
                                  str(tmp_path / "key"), "--json")
    assert status == 0 and json.loads(out)["key_id"] == issued["key_id"]
    status, out, err = parallel_lab("certificate", "verify", str(tmp_path / "ada.json"))
    assert status == 1 and "signed with instructor key" in err
    status, _, err = parallel_lab("certificate", "issue", "--name", "X", "--gradebook",
                                  str(tmp_path / "grades.csv"), "--student", "nobody")
    assert status == 2 and "no rows for student 'nobody'" in err
