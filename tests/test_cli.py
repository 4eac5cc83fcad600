"""The parallel-lab command's contracts (ARCHITECTURE.md, "The command line"): one JSON object with --json, exit status
0 on success and non-zero with a one-line reason on stderr otherwise."""

import json
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
        "parallel-lab schedule: interleaved-1f1b needs microbatches % ranks == 0, got microbatches 6, ranks 4"]


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
