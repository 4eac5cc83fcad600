"""3D parallelism (parallel_lab.parallel3d.train3d): dp x pp x tp training of the tiny GPT against one process.

In fp64 every step's loss and the final weights of every rank equal single-process training with
the same optimiser (1e-9; they agree to ~1e-11 after Adam). The 4-rank cases share one pool; the
8-rank case (2 x 2 x 2) and the torchrun runs (4 and 8 processes) each start their own processes. Bad plans fail before
any process starts, with the broken invariant in the message. The grid runner that checks the
planner's predictions is tested for its machinery only (timing is not a test).
"""

import json
import os
import re
import subprocess
import sys

import pytest

from parallel_lab.hardware import Cluster
from parallel_lab.i18n import using
from parallel_lab.parallel3d import config, train3d, validate_plans
from parallel_lab.pipeline.schedules import ScheduleError
from parallel_lab.planning import cost, memory
from parallel_lab.runtime import launcher
from parallel_lab.show import train3d as show_train3d

TINY = train3d.Config(steps=2, layers=4, hidden=16, heads=4, vocab=32, seq=8, batch=8)

# (dp, pp, tp, changes): 4 ranks, one pool
FOUR = [
    (1, 2, 2, {}),
    (1, 2, 2, {"schedule": "gpipe", "optimizer": "sgd", "lr": 0.1}),
    (1, 2, 2, {"schedule": "zb-h1", "microbatches": 4, "sequence_parallel": True}),
    (1, 2, 2, {"schedule": "interleaved-1f1b", "virtual": 2, "recompute": True}),
    (2, 1, 2, {}),
    (2, 2, 1, {"steps": 3}),
    (2, 2, 1, {"zero": 1, "steps": 3}),  # ZeRO-1 with the pipeline
    (2, 1, 2, {"zero": 1, "sequence_parallel": True}),  # ZeRO-1 with tensor (and sequence) parallelism
]


def _run(dp, pp, tp, **changes):
    return train3d.train(TINY, dp=dp, pp=pp, tp=tp, progress=None, timeout=120, **changes)


def _assert_equal(result):
    assert result["losses_equal"] and result["weights_equal"], (result["max_loss_diff"], result["max_weight_diff"])
    assert result["max_loss_diff"] < train3d.TOLERANCE and result["max_weight_diff"] < train3d.TOLERANCE
    assert len(result["losses"]) == result["config"]["steps"]
    assert abs(result["checksum"] - result["reference_checksum"]) < 1e-8


@pytest.mark.ranks
@pytest.mark.timeout(150)
@pytest.mark.parametrize("dp,pp,tp,changes", FOUR, ids=[f"{d}x{p}x{t}-{'-'.join(map(str, c.values())) or 'default'}"
                                                       for d, p, t, c in FOUR])
def test_four_ranks_train_exactly_like_one_process(dp, pp, tp, changes):
    _assert_equal(_run(dp, pp, tp, **changes))


def test_progress_lines_are_deterministic_text(monkeypatch):
    lines = []
    fake = [{"rank": 0, "coords": (0, 0, 0), "losses": [1.0, 0.5], "step_s": [0.1, 0.1], "cpu_s": [0.1, 0.1],
             "checksum": 0.0,
             "max_weight_diff": 0.0}]
    monkeypatch.setattr(train3d.launcher, "start", lambda launch, *a, **k: fake)
    monkeypatch.setattr(train3d, "reference", lambda cfg: {"losses": [1.0, 0.5], "state": {}})
    result = train3d.train(TINY.replace(dp=1, pp=1, tp=1), progress=lines.append)
    assert lines[0].startswith("training the tiny GPT (4 layers, hidden 16) on dp 1 x pp 1 x tp 1 = 1 ranks")
    assert lines[1:] == ["step 1/2 loss 1.000000 (one process: 1.000000)",
                         "step 2/2 loss 0.500000 (one process: 0.500000)"]
    assert show_train3d.format_result(result).endswith("losses equal the single process: True; final weights "
                                                  "equal: True (tolerance 1e-09)")
    fig = show_train3d.loss_figure(result)
    assert [t.name for t in fig.data] == ["one process", "dp 1 x pp 1 x tp 1 (1f1b)"]


# ----------------------------------------------------------------------------------------------
# Bad plans: clear errors before launch.

BAD = [
    (dict(dp=3, pp=2, tp=2), 8, ValueError, "world_size 8 != dp 3 x pp 2 x tp 2"),
    (dict(pp=2, layers=1), None, ValueError, "stages 2 > layers 1"),
    (dict(pp=2, schedule="interleaved-1f1b", virtual=2, layers=3), None, ValueError, "stages 4 > layers 3"),
    (dict(microbatches=3), None, ValueError, "not divisible by microbatches 3"),
    (dict(dp=2, pp=1, batch=5), None, ValueError, "batch 5 is not divisible by dp 2"),
    (dict(tp=2, heads=3, hidden=12), None, ValueError, "heads 3 is not divisible by tp 2"),
    (dict(tp=4, pp=1, hidden=18, heads=6), None, ValueError, "hidden 18 is not divisible by tp 4"),
    (dict(tp=2, vocab=33), None, ValueError, "vocab 33 is not divisible by tp 2"),
    (dict(tp=2, seq=7, sequence_parallel=True), None, ValueError, "sequence length 7 is not divisible by tp 2"),
    (dict(dp=1, pp=1, tp=2, nodes=2), None, ValueError, "tensor parallel groups would cross nodes"),
    (dict(schedule="interleaved-1f1b", virtual=2, microbatches=3, batch=6), None, ScheduleError,
     "microbatches % ranks == 0"),
    (dict(schedule="nope"), None, ScheduleError, "unknown schedule 'nope'"),
    (dict(optimizer="lamb"), None, ValueError, "optimizer must be one of"),
    (dict(zero=2), None, ValueError, "zero must be 0 or 1 (ZeRO-1), got zero 2"),
    (dict(zero=1, optimizer="sgd"), None, ValueError, "optimizer 'sgd' keeps no state to shard"),
]


@pytest.mark.parametrize("changes,world,error,message", BAD, ids=[m for *_, m in BAD])
def test_bad_plans_fail_before_launch_naming_the_invariant(changes, world, error, message):
    with pytest.raises(error, match=re.escape(message)):
        train3d.check(TINY.replace(**changes), world_size=world)


# The same checks as lesson 11's zh-Hant edition shows them: the invariant and its values, in Chinese.
BAD_ZH = [
    (dict(pp=4, tp=1, layers=2, microbatches=4), 1e6, "無法把 gpt 切成 4 個模型階段"),
    (dict(microbatches=3), 1e6, "每個副本 batch / dp = 8 列，無法被 microbatches 3 整除"),
    (dict(tp=2, vocab=33), 1e6, "詞彙表大小 vocab 33 無法被 tp 2 整除"),
    (dict(dp=1, pp=1, tp=2, nodes=2), 1e6, "tp 2 > devices_per_node 1：張量平行群組會跨越節點"),
    (dict(hidden=64, batch=64), 0.001, "計畫放不下：階段 0 需要 0.00703 GB"),
]


@pytest.mark.parametrize("changes,limit,message", BAD_ZH, ids=[m for *_, m in BAD_ZH])
def test_a_bad_config_names_its_invariant_in_chinese(changes, limit, message):
    with using("zh-Hant"), pytest.raises(ValueError) as caught:
        train3d.check(TINY.replace(**changes), memory_limit_gb=limit)
    assert message in str(caught.value) and not re.search(r"divisible|cannot cut|does not fit|would cross",
                                                          str(caught.value))


def test_a_plan_that_does_not_fit_the_memory_limit_is_refused():
    cfg = TINY.replace(hidden=64, batch=64)
    need = config.predicted_memory(cfg)["total"]
    train3d.check(cfg, memory_limit_gb=2 * need / 1e9)
    with pytest.raises(ValueError, match=r"plan does not fit: stage \d needs .* > memory limit"):
        train3d.check(cfg, memory_limit_gb=need / 2e9)


def test_train_refuses_before_any_process_starts(monkeypatch):
    def started(*args, **kwargs):
        pytest.fail("ranks were started")
    monkeypatch.setattr(train3d.launcher, "run", started)
    monkeypatch.setattr(train3d.launcher, "start", started)
    with pytest.raises(ValueError, match="world_size must be in 1..8"):
        train3d.train(TINY, dp=3, pp=2, tp=2, batch=12)
    with pytest.raises(ValueError, match="heads 3 is not divisible by tp 2"):
        train3d.train(TINY, heads=3, hidden=12)


def test_train_checks_the_world_size_once(monkeypatch):
    """The launcher's checks run once, before the reference is computed; the launch they passed is
    what starts the ranks (here stopped at the door)."""
    seen, checked = [], []
    monkeypatch.setattr(launcher, "check_world_size", lambda n: checked.append(n))

    class Stop(Exception):
        pass

    def start(launch, args=(), kwargs=None):
        seen.append(launch)
        raise Stop
    monkeypatch.setattr(train3d.launcher, "start", start)
    monkeypatch.setattr(train3d, "reference", lambda cfg: (checked.append("reference"), {"state": {}})[1])
    with pytest.raises(Stop):
        train3d.train(TINY)
    assert checked == [TINY.world_size, "reference"]
    assert [(launch.fn, launch.world_size) for launch in seen] == [(train3d.train_rank, TINY.world_size)]


# ----------------------------------------------------------------------------------------------
# torchrun: the same rank function, one process per rank, JSON on stdout.


def _torchrun(n, *args):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(n), "-m", "parallel_lab.cli", "run", "3d",
                           "--json", *args], capture_output=True, text=True, timeout=270, env=env)


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp,pp,tp", [(1, 2, 2), (2, 2, 2)], ids=["4 processes", "8 processes"])
def test_torchrun_prints_losses_equal_to_one_process(dp, pp, tp):
    out = _torchrun(dp * pp * tp, "--dp", str(dp), "--pp", str(pp), "--tp", str(tp), "--steps", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    reference = train3d.reference(TINY.replace(dp=dp, pp=pp, tp=tp))
    assert result["world_size"] == dp * pp * tp and result["losses_equal"] and result["weights_equal"]
    assert max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])) < train3d.TOLERANCE
    assert "step 2/2 loss" in out.stderr


def test_command_line_refuses_a_bad_mesh_with_one_line():
    out = subprocess.run([sys.executable, "-m", "parallel_lab.cli", "run", "3d", "--dp", "1", "--pp", "2", "--tp", "2",
                          "--heads", "3", "--hidden", "12"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1] == ("parallel-lab run: heads 3 is not divisible by tp 2 (each rank "
                                                   "holds heads/tp whole heads)")


# ----------------------------------------------------------------------------------------------
# Predictions against real runs: the machinery (not the accuracy).


def test_prediction_adds_the_shared_cores_bound_only_when_ranks_outnumber_cores():
    cal = {"tflops": 0.02, "latency_us": 100.0, "intra_gbps": 1.0}
    cluster = validate_plans.cluster_from(cal, 4)
    assert cluster.intra_gbps == 0.5  # fp32 values: twice the planner's 2-byte volume
    assert validate_plans.cluster_from(cal, 4, tflops=0.5).tflops == 0.5
    cfg = TINY.replace(dp=1, pp=2, tp=2, layers=4)
    many = validate_plans.predict(cfg, cluster, n_cores=16)
    few = validate_plans.predict(cfg, cluster, n_cores=2)
    assert many["shared_s"] == 0 and many["step_s"] == many["planner_s"]
    assert few["planner_s"] == many["planner_s"]
    comm = few["tp_comm_s"] + few["pp_comm_s"] + few["dp_comm_s"]
    assert few["shared_s"] == pytest.approx(2 * few["compute_s"] + comm)
    assert few["step_s"] == max(few["planner_s"], few["shared_s"])


def test_cluster_takes_the_all_reduce_constants_of_its_group_size():
    cal = {"tflops": 0.02, "latency_us": 100.0, "intra_gbps": 1.0,
           "groups": {2: {"latency_us": 300.0, "intra_gbps": 4.0}}}
    assert validate_plans.cluster_from(cal, 4, group=2).latency_us == 300.0
    assert validate_plans.cluster_from(cal, 4, group=2).intra_gbps == 2.0
    assert validate_plans.cluster_from(cal, 4, group=4).latency_us == 100.0  # none measured: the world's


def test_messages_through_shared_memory_are_priced_apart_from_the_data_parallel_buckets():
    gloo = {"tflops": 0.02, "latency_us": 1000.0, "intra_gbps": 1.0}
    cal = {**gloo, "near": {"tflops": 0.02, "latency_us": 10.0, "intra_gbps": 8.0}}
    cluster, near = validate_plans.cluster_from(cal, 4), validate_plans.cluster_from(cal, 4, near=True)
    assert (near.latency_us, near.intra_gbps, cluster.latency_us) == (10.0, 4.0, 1000.0)
    assert validate_plans.cluster_from(gloo, 4, near=True).latency_us == 1000.0  # none measured: gloo's
    cfg = TINY.replace(dp=2, pp=2, tp=1, layers=4)
    both = validate_plans.predict(cfg, cluster, n_cores=16, near=near)
    slow, fast = validate_plans.predict(cfg, cluster, n_cores=16), validate_plans.predict(cfg, near, n_cores=16)
    assert both["dp_comm_s"] == slow["dp_comm_s"] > fast["dp_comm_s"]
    assert both["pp_comm_s"] == fast["pp_comm_s"] < slow["pp_comm_s"]
    assert both["bubble_s"] == fast["bubble_s"] and both["compute_s"] == fast["compute_s"]
    assert both["step_s"] == pytest.approx(fast["step_s"] - fast["dp_comm_s"] + slow["dp_comm_s"])


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("pp", (1, 2))
def test_the_planner_counts_every_all_reduce_tensor_parallelism_makes(pp):
    """With a bandwidth that makes bytes free each all-reduce of 2 ranks costs 2α: the planner's TP time
    over 2α is its count, held against commlog's count on the busiest rank of a real step."""
    cfg = TINY.replace(dp=1, pp=pp, tp=2, steps=1, microbatches=2, dtype="float32", optimizer="sgd")
    counts = launcher.run(validate_plans.collective_counts, cfg.world_size, args=(cfg,))
    real = max(c.get("all_reduce", {"count": 0})["count"] for c in counts)
    model = memory.ModelConfig("tiny", cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, cfg.seq)
    cluster = Cluster(nodes=1, gpus_per_node=cfg.world_size, gpu_mem_gb=1, tflops=1.0,
                              intra_gbps=1e9, inter_gbps=1e9, latency_us=1.0)  # bandwidth: negligible
    parts = cost.step_time(model, cluster, cfg.batch, cfg.dp, cfg.pp, cfg.tp, cfg.microbatches)
    assert parts["tp_comm_s"] / 2e-6 == pytest.approx(real)


def test_validate_runs_a_grid_and_reports_errors(monkeypatch):
    monkeypatch.setattr(validate_plans, "measure",
                        lambda cfg: {"steps_s": [2.0, 1.0], "step_s": 1.0, "cores_used": 2.0})
    monkeypatch.setattr(validate_plans, "tp_efficiency", lambda cfg, world_size=None: 0.5 if cfg.tp > 1 else 1.0)
    monkeypatch.setattr(validate_plans, "workload_tflops",
                        lambda cfg, world_size=None, efficiency=None: 0.01 * efficiency)
    cal = {"tflops": 0.02, "latency_us": 100.0, "intra_gbps": 1.0}
    sizes = {"tiny": dict(layers=4, hidden=16, heads=4, vocab=32, seq=8)}
    result = validate_plans.validate(grid=((1, 2, 2), (4, 1, 1)), sizes=sizes, steps=2, calibration=cal,
                                     progress=None)
    assert [(r["dp"], r["pp"], r["tp"]) for r in result["rows"]] == [(1, 2, 2), (4, 1, 1)]
    for r in result["rows"]:
        assert r["rel_error"] == pytest.approx(abs(r["predicted_s"] - 1.0))
        assert r["tp_efficiency"] == (0.5 if r["tp"] > 1 else 1.0)
        assert r["workload_tflops"] == pytest.approx(0.01 * r["tp_efficiency"])  # the shard's FLOP/s
    assert "median relative error" in validate_plans.format_table(result)
    with using("zh-Hant"):  # lesson 16's zh-Hant edition reads the table and its summary in Chinese
        table = validate_plans.format_table(result)
    assert "相對誤差中位數" in table and "誤差" in table.splitlines()[0] and "median" not in table
    with pytest.raises(ValueError, match="!= world_size 4"):
        validate_plans.validate(grid=((1, 2, 1),), sizes=sizes, calibration=cal, progress=None)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_tp_efficiency_profiles_one_block_split_tp_ways_on_every_rank_at_once():
    cfg = TINY.replace(dp=1, pp=2, tp=2, dtype="float32")
    assert validate_plans.tp_efficiency(cfg.replace(tp=1)) == 1.0  # nothing split: nothing to profile
    seconds = launcher.run(validate_plans.block_seconds, 4, args=(cfg.gpt, 2, 2), kwargs={"repeats": 2})
    assert len(seconds) == 4 and all(t > 0 for t in seconds)
    efficiency = validate_plans.tp_efficiency(cfg, 4, repeats=2)
    assert 0 < efficiency < float("inf")


@pytest.mark.ranks
@pytest.mark.timeout(60)
def test_measure_times_every_step_of_a_real_run():
    cfg = TINY.replace(dp=2, pp=2, tp=1, dtype="float32", optimizer="sgd", steps=2)
    timed = validate_plans.measure(cfg)
    assert len(timed["steps_s"]) == 2 and all(t > 0 for t in timed["steps_s"])
    assert timed["step_s"] == timed["steps_s"][1] and timed["cores_used"] > 0
    assert isinstance(validate_plans.cluster_from({"tflops": 1.0, "latency_us": 1.0, "intra_gbps": 1.0}, 4),
                      Cluster)
    assert launcher.MAX_WORLD_SIZE == 8


@pytest.mark.ranks
@pytest.mark.timeout(150)
def test_zero1_keeps_one_dp_th_of_adams_moments_per_rank():
    plain, sharded = _run(2, 2, 1), _run(2, 2, 1, zero=1)
    _assert_equal(sharded)
    for full, shard in zip(plain["optimizer_bytes_per_rank"], sharded["optimizer_bytes_per_rank"]):
        # both moments of this rank's pipeline stage, split over dp 2 (a flat buffer padded to 2 slices)
        assert full > 0 and shard == pytest.approx(full / 2, abs=2 * 8)


@pytest.mark.ranks
@pytest.mark.timeout(150)
@pytest.mark.parametrize("zero", (0, 1))
def test_eight_ranks_2x2x2_train_exactly_like_one_process(zero):
    result = _run(2, 2, 2, zero=zero)
    _assert_equal(result)
    assert result["world_size"] == 8
