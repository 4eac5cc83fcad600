"""The parallel-lab command's contracts (ARCHITECTURE.md, "The command line"): one JSON object with --json, exit status
0 on success and non-zero with a one-line reason on stderr otherwise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("parallel-lab"))


def cli(*args, timeout=120):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_schedule_json_contract():
    out = cli("schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"schedule", "stages", "microbatches", "ranks", "makespan", "bubble_fraction",
            "peak_activations"} <= set(report)
    assert report["schedule"] == "1f1b" and report["stages"] == 4 and report["microbatches"] == 8
    assert report["bubble_fraction"] == pytest.approx(3 / 11)
    assert report["peak_activations"] == [4, 3, 2, 1]
    assert sorted(report["ranks"]) == ["0", "1", "2", "3"]
    assert report["ranks"]["0"][0] == "0F0" and report["ranks"]["3"][0] is None


def test_schedule_text_shows_the_grid_and_the_numbers():
    out = cli("schedule", "gpipe", "--stages", "2", "--microbatches", "2")
    assert out.returncode == 0
    assert "rank 0" in out.stdout and "0F0" in out.stdout and "bubble 33.3%" in out.stdout


def test_bad_input_exits_non_zero_with_one_line_naming_the_invariant():
    out = cli("schedule", "interleaved-1f1b", "--stages", "4", "--microbatches", "6", "--virtual", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "parallel-lab schedule: interleaved-1f1b needs microbatches % ranks == 0, got microbatches 6, ranks 4: the "
        "course implements Megatron-LM's default order, micro-batches through each chunk in groups of p (Megatron-LM "
        "takes other m with --microbatch-group-size-per-virtual-pipeline-stage)"]


def test_unknown_benchmark_suite_is_refused():
    out = cli("bench", "nonsense", "--json")
    assert out.returncode == 2 and "unknown benchmark 'nonsense'" in out.stderr


@pytest.mark.ranks
def test_run_tensor_json_contract():
    out = cli("run", "tensor", "--tp", "2", "--model", "block", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["tp"] == 2 and report["model"] == "block"
    assert report["max_output_diff"] < 1e-10 and report["max_grad_diff"] < 1e-10
    assert report["collectives"]["all_reduce"]["count"] == 4  # 2 forward + 2 backward


def test_run_tensor_bad_input_fails_before_launch():
    out = cli("run", "tensor", "--tp", "5", "--model", "mlp")
    assert out.returncode == 2
    assert "is not divisible by tp 5" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_plan_speaks_the_language_of_its_environment():
    """A lesson's kernel sets $PARALLEL_LAB_LANG (course.notebook.setup), so lesson 16's zh-Hant edition
    runs parallel-lab plan in Chinese: its table's heads, its count and its rejections' reasons; the
    JSON keeps the English reason beside the kind and values."""
    args = [EXE, "plan", "--layers", "8", "--hidden", "1024", "--heads", "8", "--vocab", "1000", "--seq", "512",
            "--batch", "16", "--nodes", "2", "--gpus-per-node", "4", "--gpu-mem-gb", "80", "--top", "2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PARALLEL_LAB_LANG": "zh-Hant"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "排程" in lines[0] and "重新計算" in lines[0] and "個計畫放得下" in out.stdout, out.stdout
    assert "張量平行群組會跨越節點" in out.stdout and "would cross" not in out.stdout
    report = json.loads(subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120,
                                       env={**os.environ, "PARALLEL_LAB_LANG": "zh-Hant"}).stdout)
    crossing = next(r for r in report["rejected"] if r["kind"] == "tp-over-node")
    assert crossing["reason"].endswith("tensor parallel groups would cross nodes") and crossing["values"]["tp"] == 8


def test_plan_json_contract_and_rejections_with_reasons():
    out = cli("plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "50257",
              "--seq", "2048", "--batch", "1536", "--nodes", "64", "--gpus-per-node", "8",
              "--gpu-mem-gb", "80", "--top", "3", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["plans"]) == 3
    for plan in report["plans"]:
        assert {"dp", "pp", "tp", "microbatches", "schedule", "recompute", "step_s", "memory_gb"} <= set(plan)
        assert plan["dp"] * plan["pp"] * plan["tp"] == 512 and plan["memory_gb"] <= 80
        assert plan["tp"] <= 8  # tensor parallelism stays inside an 8-GPU node
    assert [p["step_s"] for p in report["plans"]] == sorted(p["step_s"] for p in report["plans"])
    assert report["rejected"] and all(r["reason"] for r in report["rejected"])
    assert any("would cross nodes" in r["reason"] for r in report["rejected"])


# ----------------------------------------------------------------------------------------------
# Every technique's `run` sub-command, once each, on real ranks (run tensor: above).


@pytest.mark.ranks
def test_run_pipeline_json_contract():
    out = cli("run", "pipeline", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "4", "--json",
              timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"max_grad_diff", "loss_diff", "bubble_measured", "bubble_predicted", "peak_activations"} <= set(report)
    assert report["stages"] == 2 and report["max_grad_diff"] < 1e-10 and report["loss_diff"] < 1e-10
    assert report["peak_activations"] == [2, 1]


@pytest.mark.ranks
def test_run_3d_json_contract():
    out = cli("run", "3d", "--dp", "1", "--pp", "2", "--tp", "2", "--steps", "2", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["world_size"] == 4 and report["config"]["pp"] == 2 and len(report["losses"]) == 2
    assert report["losses_equal"] and report["weights_equal"]
    assert "step 2/2 loss" in out.stderr  # progress on stderr, the JSON object alone on stdout


def test_stages_is_the_same_option_as_ranks():
    one = cli("schedule", "gpipe", "--ranks", "3", "--microbatches", "2", "--json")
    two = cli("schedule", "gpipe", "--stages", "3", "--microbatches", "2", "--json")
    assert one.returncode == two.returncode == 0 and one.stdout == two.stdout


def test_run_3d_bad_mesh_fails_before_launch():
    out = cli("run", "3d", "--dp", "3", "--pp", "1", "--tp", "1", "--batch", "8")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["parallel-lab run: batch 8 is not divisible by dp 3 (replicas "
                                               "need equal rows)"]


GRADEBOOK = ("student,lesson,exercise,passed,points,max_points,reason\n"
             "ada,00_why_split_a_model,quiz:00,true,3,3,\n"
             "ada,01_ranks_and_collectives,ring-all-reduce,true,2,2,\n"
             "ada,01_ranks_and_collectives,quiz:01,true,3,3,\n")


def test_certificate_keygen_issue_verify_with_the_public_key_alone(tmp_path):
    """An instructor makes keys, issues an Open Badges 3.0 credential from a gradebook; anyone verifies it
    offline with the public key; an edit, a foreign key, a self-issued and a revoked one exit 1 with the
    reason; bad input exits 2."""
    (tmp_path / "grades.csv").write_text(GRADEBOOK)
    out = cli("certificate", "keygen", str(tmp_path / "lin"), "--json")
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["did"].startswith("did:key:z6Mk") and made["fingerprint"].startswith("SHA256:")
    assert cli("certificate", "keygen", str(tmp_path / "lin")).returncode == 2  # never overwrites a key
    out = cli("certificate", "issue", "--name", "Ada Lovelace", "--email", "ada@example.org", "--gradebook",
              str(tmp_path / "grades.csv"), "--student", "ada", "--key-file", made["private_key"], "--issuer",
              "Prof. Lin, CS 4xx", "--status-list", "https://course.example.org/status/1", "--status-index", "4",
              "--out", str(tmp_path / "ada.json"), "--json")
    assert out.returncode == 0, out.stderr
    issued = json.loads(out.stdout)
    assert issued["lessons"] == ["00", "01"] and issued["fingerprint"] == made["fingerprint"]
    credential = json.loads((tmp_path / "ada.json").read_text())
    assert credential["type"] == ["VerifiableCredential", "OpenBadgeCredential"]
    assert "ada@" not in json.dumps(credential)
    assert credential["credentialSubject"]["achievement"]["criteria"]["narrative"].endswith(
        "- lesson 00: quiz:00\n- lesson 01: quiz:01, ring-all-reduce")
    for revoked in ([3], [4]):
        out = cli("certificate", "status-list", "https://course.example.org/status/1", "--revoked", *map(str, revoked),
                  "--key-file", made["private_key"], "--out", str(tmp_path / f"status{revoked[0]}.json"))
        assert out.returncode == 0, out.stderr
    Path(made["private_key"]).unlink()  # the verifier has no secret

    out = cli("certificate", "verify", str(tmp_path / "ada.json"), "--public-key", made["public_key"], "--json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    report = json.loads(out.stdout)
    assert {"valid", "reason", "fingerprint", "issuer", "subject", "achievement", "revoked"} <= set(report)
    assert report["valid"] is True and report["fingerprint"] == made["fingerprint"] and report["revoked"] is None
    assert report["issuer"] == {"id": made["did"], "name": "Prof. Lin, CS 4xx"}
    assert report["subject"]["name"] == "Ada Lovelace" and "lessons 00, 01" in report["achievement"]["name"]
    out = cli("certificate", "verify", str(tmp_path / "ada.json"), "--public-key", made["public_key"],
              "--status-list", str(tmp_path / "status3.json"))
    assert out.returncode == 0 and out.stdout.startswith("valid: Ada Lovelace") and "not revoked" in out.stdout
    out = cli("certificate", "verify", str(tmp_path / "ada.json"), "--public-key", made["public_key"],
              "--status-list", str(tmp_path / "status4.json"), "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["revoked"] is True
    assert out.stderr.strip() == "certificate verify: revoked by the issuer " \
                                 "(status list https://course.example.org/status/1, index 4)"
    out = cli("certificate", "verify", str(tmp_path / "ada.json"))
    assert out.returncode == 1 and "no issuer key was given" in out.stderr

    # A learner's own key pair and credential: its proof is fine, but not by the instructor's key.
    out = cli("certificate", "keygen", str(tmp_path / "me"), "--json")
    mine = json.loads(out.stdout)
    out = cli("certificate", "issue", "--name", "Ada Lovelace", "--email", "ada@example.org", "--lessons", "00", "01",
              "02", "--key-file", mine["private_key"], "--issuer", "Prof. Lin, CS 4xx", "--out",
              str(tmp_path / "mine.json"))
    assert out.returncode == 0, out.stderr
    out = cli("certificate", "verify", str(tmp_path / "mine.json"), "--public-key", made["public_key"], "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["fingerprint"] == mine["fingerprint"]
    assert f"signed by key {mine['fingerprint']}, not by the issuer key given ({made['fingerprint']})" in out.stderr
    assert cli("certificate", "verify", str(tmp_path / "mine.json"), "--public-key", mine["public_key"]).returncode == 0

    edited = json.loads((tmp_path / "ada.json").read_text())
    edited["credentialSubject"]["identifier"][1]["identityHash"] = "Mallory"
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    out = cli("certificate", "verify", str(tmp_path / "edited.json"), "--public-key", made["public_key"])
    assert out.returncode == 1 and out.stderr.startswith("certificate verify: edited after signing")

    (tmp_path / "junk.json").write_text("{not json")
    for args, message in [((str(tmp_path / "junk.json"),), "is not UTF-8 JSON"),
                          ((str(tmp_path / "none.json"),), "cannot read the credential"),
                          ((str(tmp_path / "ada.json"), "--public-key", str(tmp_path / "grades.csv")),
                           "is not an Ed25519 public key"),
                          ((str(tmp_path / "ada.json"), "--status-list", str(tmp_path / "none.json")),
                           "cannot read the status list")]:
        out = cli("certificate", "verify", *args)
        assert out.returncode == 2 and out.stdout == "" and message in out.stderr, out.stderr
    out = cli("certificate", "issue", "--name", "X", "--email", "x@example.org", "--lessons", "00", "--issuer", "I",
              "--key-file", made["private_key"])
    assert out.returncode == 2 and "cannot read the private key file" in out.stderr
    out = cli("certificate", "issue", "--name", "X", "--email", "x@example.org", "--gradebook",
              str(tmp_path / "grades.csv"), "--student", "eve", "--issuer", "I", "--key-file", mine["private_key"])
    assert out.returncode == 2 and "no rows for student 'eve'" in out.stderr
