"""The pipeline executor on real ranks against one process, the simulator, and a hang.

Every schedule on 2 and 4 gloo ranks (m < p where the schedule allows it), for an MLP stack in fp64
with and without recomputation, and the tiny GPT on 1F1B and ZB-H1: after one step, the loss and
every parameter gradient equal the whole-batch single-process reference to 1e-10 (also with the
plain autograd backward instead of the fused weight gradients, and without message tags: matched in
order per pair of ranks as on NCCL), and the stashed
activations peak exactly where the simulator says. All jobs of one world size run in one launch
(the pool starts once per size). Checks made before launch, the trace file and the prediction of
the bubble from measured costs follow; the hang goes last (it restarts the pool).
"""

import functools
import json

import pytest
import torch

from parallel_lab.bench import pipeline as bench
from parallel_lab.hardware import PCIE4
from parallel_lab.pipeline import pipedream
from parallel_lab.pipeline import run as prun
from parallel_lab.pipeline.communication import communication
from parallel_lab.pipeline.schedules import Action, Schedule, ScheduleError, build
from parallel_lab.pipeline.simulate import simulate
from parallel_lab.pipeline.stages import ModelSpec, bounds, cut, reference
from parallel_lab.runtime import launcher

TOL = 1e-10
MLP = ModelSpec("mlp", hidden=8, layers=8, batch=12)
GPT = ModelSpec("gpt", hidden=16, layers=4, heads=2, seq=6, vocab=24, batch=4)

# (schedule, m, v) per world size; batches are m * rows so microbatches are equal
SCHEDULES = {
    2: [("naive", 1, 1), ("gpipe", 1, 1), ("gpipe", 5, 1), ("1f1b", 1, 1), ("1f1b", 3, 1),
        ("interleaved-1f1b", 2, 2), ("interleaved-1f1b", 4, 4), ("zb-h1", 1, 1), ("zb-h1", 4, 1),
        ("zb-v", 1, 2), ("zb-v", 3, 2), ("dualpipe-v", 5, 2)],
    4: [("naive", 1, 1), ("gpipe", 3, 1), ("gpipe", 6, 1), ("1f1b", 2, 1), ("1f1b", 6, 1),
        ("interleaved-1f1b", 4, 2), ("interleaved-1f1b", 8, 2), ("zb-h1", 2, 1), ("zb-h1", 5, 1),
        ("zb-v", 3, 2), ("zb-v", 6, 2), ("dualpipe-v", 8, 2)],
}


def _jobs(p):
    """(schedule, m, v, model, variant): variant "" (default), "recompute", "unfused" (plain
    autograd backward, autograd for W too) or "untagged" (no message tags: a pair's messages match
    in the order they are posted, as on NCCL; ZB-V receives in another order than it sends)."""
    jobs = [(name, m, v, "mlp", variant) for name, m, v in SCHEDULES[p] for variant in ("", "recompute")]
    for name in ("1f1b", "zb-h1"):
        jobs += [(name, 3, 1, "gpt", variant) for variant in ("", "recompute", "unfused")]
        jobs.append((name, 3, 1, "mlp", "unfused"))
    jobs += [(name, m, v, "mlp", "untagged") for name, m, v in SCHEDULES[p] if m > 1]
    return jobs


@functools.lru_cache(maxsize=None)
def results(p):
    """Every job of world size p in one launch; -> {job: run_pipeline-style report}."""
    jobs, calls = _jobs(p), []
    for name, m, v, model, variant in jobs:
        base = MLP if model == "mlp" else GPT
        spec = base.replace(batch=m * (3 if model == "mlp" else 2))
        sched = build(name, p, m, v)
        calls.append(dict(spec=spec, schedule=sched, recompute=variant == "recompute",
                          fuse=variant != "unfused", warmup=0, tags=variant != "untagged", steps=1))
    per_rank = launcher.run(prun.pipeline_jobs, p, args=(calls,), timeout=120)
    return {job: prun.report(call["schedule"], call["spec"], [r[i] for r in per_rank],
                             recompute=call["recompute"])
            for i, (job, call) in enumerate(zip(jobs, calls))}


def _id(job):
    name, m, v, model, variant = job
    return f"{model}-{name}-m{m}" + (f"-v{v}" if v > 1 else "") + (f"-{variant}" if variant else "")


JOBS = [(p, job) for p in (2, 4) for job in _jobs(p)]


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("p,job", JOBS, ids=[f"p{p}-{_id(j)}" for p, j in JOBS])
def test_gradients_and_loss_equal_the_single_process_reference(p, job):
    r = results(p)[job]
    assert r["max_grad_diff"] < TOL, (r["max_grad_diff"], max(r["grad_diffs"].items(), key=lambda kv: kv[1]))
    assert r["loss_diff"] < TOL
    assert len(r["grad_diffs"]) == len(reference(MLP if job[3] == "mlp" else GPT)["grads"])


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("p,job", JOBS, ids=[f"p{p}-{_id(j)}" for p, j in JOBS])
def test_peak_activations_exactly_as_simulated_and_bytes_as_messages(p, job):
    name, m, v, _, _ = job
    r = results(p)[job]
    sched = build(name, p, m, v)
    assert r["peak_activations"] == simulate(sched, w_share=r["w_share"]).peak_activations  # counted until W
    sends = [sum(1 for op in ops if getattr(op, "op", None) == "send") for ops in communication(sched).values()]
    assert r["bytes_sent"] == [n * r["link"]["message_bytes"] for n in sends]


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("p", (2, 4))
def test_virtual_clock_starts_after_message_plus_link(p):
    """Each action starts on the virtual clock no earlier than its rank is free and every input
    from another rank was sent plus the modelled link cost, and lasts its thread CPU time."""
    for job, r in results(p).items():
        sched = build(job[0], p, job[1], job[2])
        hop = PCIE4.cost(r["link"]["message_bytes"])
        end = {}
        for timed in r["timeline"]["virtual"]:
            for action, start, stop in timed:
                end[Action.parse(action)] = (start, stop)
        owner = sched.stage_to_rank
        for a, (start, _) in end.items():
            if a.kind == "F" and a.stage > 0 and owner[a.stage - 1] != owner[a.stage]:
                assert start >= end[Action(a.stage - 1, "F", a.microbatch)][1] + hop - 1e-6
            if a.kind in "BI" and a.stage + 1 < sched.n_stages and owner[a.stage + 1] != owner[a.stage]:
                grad = end.get(Action(a.stage + 1, "B", a.microbatch)) or end[Action(a.stage + 1, "I", a.microbatch)]
                assert start >= grad[1] + hop - 1e-6
        for clock in ("virtual", "wall"):
            for timed in r["timeline"][clock]:
                times = [t for _, s, e in timed for t in (s, e)]
                assert times == sorted(times) and times[0] >= 0  # one rank runs one action at a time


# ----------------------------------------------------------------------------------------------
# Checked before any process starts.


@pytest.mark.parametrize("kwargs,message", [
    (dict(microbatches=4, batch=10), "batch 10 is not divisible by microbatches 4"),
    (dict(ranks=4, layers=3), "n_stages 4 > layers 3"),
    (dict(schedule="zb-v", ranks=4, layers=6), "n_stages 8 > layers 6"),
    (dict(model="gpt", ranks=4, layers=2), "n_stages 4 > layers 2"),
    (dict(model="cnn"), "model must be one of"),
    (dict(dtype=torch.float16), "dtype must be float64 or float32"),
    (dict(ranks=9, layers=16), "world_size must be in 1..8"),
])
def test_bad_runs_fail_before_launch(kwargs, message):
    before = launcher.pool_pids()
    with pytest.raises(ValueError, match=message):
        prun.run_pipeline(**kwargs)
    assert launcher.pool_pids() == before


def test_bad_schedules_fail_before_launch():
    with pytest.raises(ScheduleError, match="microbatches % ranks == 0, got microbatches 6, ranks 4"):
        prun.run_pipeline("interleaved-1f1b", ranks=4, microbatches=6, virtual=2)
    with pytest.raises(ScheduleError, match="naive runs the whole batch as one microbatch"):
        prun.run_pipeline("naive", ranks=2, microbatches=2)


def test_cut_balances_the_middle_and_pins_embedding_and_head():
    assert bounds(8, 0, 0, 3) == [(0, 3), (3, 6), (6, 8)]
    assert bounds(6, 1, 1, 2) == [(0, 3), (3, 6)]  # GPT: embed + 2 blocks | 2 blocks + head
    names = [n for stage in cut(GPT, 2) for n in stage.names]
    assert names == list(reference(GPT)["grads"])  # every parameter exactly once, in model order


# ----------------------------------------------------------------------------------------------
# Trace and prediction.


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_run_pipeline_contract_and_trace(tmp_path):
    path = tmp_path / "trace.json"
    r = prun.run_pipeline("zb-h1", ranks=4, microbatches=4, trace=str(path))
    for key in ("schedule", "stages", "microbatches", "max_grad_diff", "loss_diff", "bubble_measured",
                "bubble_predicted", "peak_activations"):
        assert key in r
    assert r["max_grad_diff"] < TOL and len(r["peak_activations"]) == 4
    json.dumps(r)  # the CLI prints it
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert any(t.startswith("virtual clock") for t in tracks) and any(t.startswith("wall clock") for t in tracks)
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 3 * sum(len(t) for t in r["timeline"]["virtual"])  # virtual, wall, predicted
    assert {e["args"]["clock"] for e in spans} == {"virtual", "wall", "predicted"}
    assert any(e["ph"] == "C" for e in events)


BUBBLE_RUNS = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2), ("dualpipe-v", 2)]


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule, virtual", BUBBLE_RUNS, ids=[name for name, _ in BUBBLE_RUNS])
def test_measured_bubble_is_within_10_percent_of_the_prediction(schedule, virtual):
    """`parallel-lab run pipeline --schedule S --ranks 4 --microbatches 8` (the course MLP): the
    virtual-clock bubble of the typical step (each action's median thread CPU time over the recorded
    steps) is the prediction's (medians per kind, stage and kind before) within 10 %, for every
    schedule. Thread CPU time, not wall time: it holds on 2 cores under the load of this test run.
    One retry, for a machine shared with other jobs."""
    for attempt in range(2):
        r = prun.run_pipeline(schedule, ranks=4, microbatches=8, virtual=virtual, timeout=120)
        error = abs(r["bubble_measured"] / r["bubble_predicted"] - 1)
        if error <= 0.10:
            break
    assert error <= 0.10, (r["bubble_measured"], r["bubble_predicted"])
    assert r["steps_recorded"] == prun.STEPS and r["max_grad_diff"] < TOL
    assert r["peak_activations"] == r["peak_activations_predicted"]


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("zb-v", 2)])
def test_the_executors_virtual_clock_is_list_scheduling_of_its_own_durations(schedule, virtual):
    """Each recorded step's clock, kept by the ranks as they run (a message carries its sender's
    clock), equals the simulator placing the same actions with the same durations and link: the
    measured timeline (the typical step) is that rule, not a second model."""
    sched, spec = prun.plan(schedule, 4, 8, virtual=virtual)
    ranks = launcher.run(prun.pipeline_rank, 4, kwargs=dict(spec=spec, schedule=sched, grads=False), timeout=120)
    costs = prun.measured_costs(sched, ranks, PCIE4)
    for step in range(prun.STEPS):
        records = [rec for r in ranks for rec in r["samples"][step]]
        own = {Action.parse(rec["action"]): rec["cpu"] for rec in records}
        placed = simulate(sched, costs, durations=own)
        ends = {str(a): e for timed in placed.ranks for a, _, e in timed}
        assert max(abs(ends[rec["action"]] - rec["virtual"][1]) for rec in records) < 1e-9


# ----------------------------------------------------------------------------------------------
# PipeDream (asynchronous 1F1B) against the flushed schedule: 4 ranks, 3 steps of 4 microbatches.


@functools.lru_cache(maxsize=None)
def pipedream_modes():
    return pipedream.compare_modes(stages=4, steps=3, microbatches=4, lr=0.1)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_pipedream_without_stashing_mixes_weight_versions():
    r = pipedream_modes()["no-stash"]
    for s, stale in enumerate(r["staleness"]):
        assert stale[:4] == [min(j, 3 - s) for j in range(4)]  # ramps up while the pipeline fills
        assert set(stale[3:]) == {3 - s}  # steady state: p-1-s updates between F and B
    # so the update is not the gradient of any one model (nor of the stashed mixture)
    assert r["diff_vs_replay"] > 1e-6 and r["diff_vs_sync_sgd"] > 1e-6


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_pipedream_weight_stashing_backward_uses_the_forward_version():
    r = pipedream_modes()["stash"]
    assert all(f == b for per_stage in r["versions"] for _, f, b in per_stage)
    assert r["diff_vs_replay"] < TOL  # exactly PipeDream's semantics, replayed on one process
    assert r["peak_versions"] == [4, 3, 2, 1]  # the memory price: p-s versions on stage s
    assert r["diff_vs_sync_sgd"] > 1e-6  # ... which still is not synchronous SGD


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_flushed_1f1b_is_synchronous_sgd():
    r = pipedream_modes()["flush"]
    assert r["diff_vs_sync_sgd"] < TOL
    assert all(s == 0 for per_stage in r["staleness"] for s in per_stage)
    assert r["diff_vs_replay"] > 1e-6


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_benchmark_rows_have_the_cli_shape():
    """Runs both executors once on a tiny model (no timing assertions: this machine is shared);
    the commlog wrappers are back afterwards."""
    rows = launcher.run(bench.bench_rank, 4, kwargs=dict(schedules=bench.schedules_for(), repeats=1, warmup=1,
                                                       hidden=(16,)), timeout=120)[0]
    assert [r["name"] for r in rows] == ["mlp h16 b64 m8 p4 gpipe", "mlp h16 b64 m8 p4 1f1b"]
    for r in rows:
        assert set(r) == {"name", "ours_s", "peer", "peer_s", "ratio", "compute_s", "cores", "limit_s",
                          "limit_ratio"} and r["peer"] == bench.PEER
        assert r["ratio"] == pytest.approx(r["ours_s"] / r["peer_s"])
        # the limit: every rank's action CPU time over the cores the 4 ranks get
        assert r["compute_s"] > 0 and 1 <= r["cores"] <= 4
        assert r["limit_s"] == pytest.approx(r["compute_s"] / r["cores"])
        assert r["limit_ratio"] == pytest.approx(r["ours_s"] / r["limit_s"])


# ----------------------------------------------------------------------------------------------
# A hang is reported per rank with the action it is stuck in (last: it restarts the pool).


@pytest.mark.ranks
@pytest.mark.timeout(60)
def test_a_deadlocked_schedule_is_reported_by_rank_and_action():
    a = Action.parse
    # rank 0 waits for microbatch 0's gradient, rank 1 for microbatch 1's activation: a cycle
    bad = Schedule("crossed", 2, 2, 1, (0, 1), [[a("0F0"), a("0B0"), a("0F1"), a("0B1")],
                                                [a("1F1"), a("1B1"), a("1F0"), a("1B0")]])
    with pytest.raises(ScheduleError, match="deadlock"):
        communication(bad)
    spec = MLP.replace(batch=4)
    with pytest.raises(launcher.RanksHung) as caught:
        launcher.run(prun.pipeline_rank, 2, kwargs=dict(spec=spec, schedule=bad, check=False, warmup=0),
                     timeout=4)
    blocked = caught.value.blocked
    assert "action 0B0" in blocked[0] and "from rank 1" in blocked[0] and "recv(src=1" in blocked[0]
    assert "action 1F1" in blocked[1] and "from rank 0" in blocked[1] and "recv(src=0" in blocked[1]
