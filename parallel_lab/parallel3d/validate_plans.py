"""Does the planner's cost model predict real 3D runs? Calibrate it here, then time a grid of plans.

    from parallel_lab.parallel3d import validate_plans
    result = validate_plans.validate()            # calibrate on 4 ranks, run the grid, compare
    print(validate_plans.format_table(result))    # per plan: predicted and measured seconds per step
    result["median_rel_error"]

``planning.cost.step_time`` predicts a step from a handful of constants: achieved FLOP/s per device and the
α–β of an all-reduce (two here: gloo's, and shared memory's for tensor parallelism's all-reduces and
the pipeline's messages, ``calibrate``'s ``near``). ``calibrate`` measures those on this machine's
CPU ranks, the way a planner profiles a cluster before it searches: all-reduces timed between computations, as training
issues them, on groups of every size a plan uses with all groups at once; and ``workload_tflops``, this
model's own FLOP/s with every rank computing at once. ``train3d.train_rank`` runs the same plans for
real, in fp32, timing every step on the wall clock (the slowest rank, from a barrier). Lesson 16
shows the table; lesson 15 explains the model.

Four things differ from the GPU clusters the planner is written for, and are given to it as data,
not hidden in it:

- **4-byte values.** The planner counts 2-byte (bf16) activations and gradients; these runs send
  fp32, so the calibrated bandwidth is halved before it goes into ``Cluster``.
- **Fewer cores than ranks.** Simulated devices share the machine's cores (and the machine may be
  shared with other programs): ``calibrate`` measures how many ranks really compute at once
  (``effective_cores``). With more ranks than that, a step takes at least all ranks' compute
  divided by those cores, plus the communication; a rank idle in a pipeline bubble leaves its core
  to the others, so that bound has no bubble. The prediction is the larger of it and the planner's
  step time (a core per rank).
- **The model's own FLOP/s.** ``planning.calibration.calibrate`` times one square matmul; the GPT's matrices are
  smaller and come with per-operation overhead, and devices that share a machine slow each other
  down, so ``validate`` predicts with the FLOP/s this very model achieves on all ranks at once
  (``workload_tflops``) and also reports the matmul's.
- **Split layers keep their overhead.** The planner divides a layer's FLOPs by tp; a shard of this
  small GPT does not run tp times faster (every rank still runs every operation, on narrower
  matrices). ``tp_efficiency`` profiles one block split tp ways against the unsplit block, and a
  tensor-parallel plan is predicted with its shard's FLOP/s (predicted with the whole block's
  instead, the tensor-parallel plans came out too fast).

``validate_overlap`` holds the cost model's overlap term (``planning.cost.dp_communication``: the
DP/ZeRO communication exposed beyond ``overlap`` x the backward) against ZeRO runs with collectives
in flight (``zero.run``, ``overlap=True``): each run's step on the virtual clock (measured thread CPU
time per action, the link model per collective; never wall time) against the model fed the same
run's measured forward, backward and optimizer seconds.

Timing is noisy on a shared machine (other processes, the OS); the grid reports medians over steps
and the median relative error over plans. Tests check the machinery, never the accuracy.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.hardware import Cluster, Link
from parallel_lab.i18n import _, pad, width
from parallel_lab.parallel3d import train3d
from parallel_lab.pipeline.profile import one_thread
from parallel_lab.planning import calibration as calib
from parallel_lab.planning import memory
from parallel_lab.planning.cost import OVERLAP_SHARE, STEP_PARTS, dp_communication, step_time
from parallel_lab.runtime import commlog, launcher, shared_memory
from parallel_lab.tensor.plan import parallelize
from parallel_lab.zero import run as zero_run

GRID_4 = ((1, 2, 2), (2, 2, 1), (2, 1, 2), (1, 4, 1), (1, 1, 4), (4, 1, 1))
SIZES = {
    "hidden 128": dict(layers=4, hidden=128, heads=4, vocab=256, seq=32),
    "hidden 256": dict(layers=4, hidden=256, heads=4, vocab=256, seq=32),
}
RUN = dict(batch=16, microbatches=4, schedule="1f1b", optimizer="sgd", lr=0.01, dtype="float32")
CALIBRATION_SIZES = (2**10, 2**14, 2**18, 2**22)
NEAR_SIZES = (2**10, 2**14, 2**16, 2**18)  # what tensor parallelism's all-reduces send through shared memory


def cluster_from(calibration: dict, world_size: int, value_bytes: int = 4, tflops: float | None = None,
                 group: int | None = None, near: bool = False) -> Cluster:
    """A one-node ``Cluster`` of ``world_size`` devices with the calibrated constants; the
    bandwidth is scaled by ``2 / value_bytes`` because the planner counts 2-byte values. ``tflops``
    replaces the calibrated matmul throughput (e.g. by ``workload_tflops``); ``group`` takes the
    all-reduce α–β measured on groups of that size (``calibrate``'s ``groups``) where there is one.
    ``near``: the constants of what goes through shared memory (``calibrate``'s ``near``), where
    this machine has them."""
    if near and calibration.get("near"):
        return cluster_from(calibration["near"], world_size, value_bytes, tflops or calibration["tflops"], group)
    constants = calibration.get("groups", {}).get(group, calibration)
    gbps = constants["intra_gbps"] * 2 / value_bytes
    return Cluster(nodes=1, gpus_per_node=world_size, gpu_mem_gb=1e6, intra_gbps=gbps, inter_gbps=gbps,
                           tflops=tflops or calibration["tflops"], latency_us=constants["latency_us"])


def calibrate(world_size: int = 4, sizes_bytes=CALIBRATION_SIZES, timeout: float = 90.0) -> dict:
    """``planning.calibration.calibrate`` with ``groups`` on ``world_size`` ranks, messages up to 4 MB (so that
    the bandwidth is well determined even on a noisy machine): what ``validate`` predicts with.

    The ranks of one host send two ways here (``runtime.shared_memory``): tensor parallelism's
    all-reduces and the pipeline's messages through shared memory, data-parallel buckets larger
    than its slots through gloo. Where this machine can share memory, ``near`` holds the same
    calibration timed through shared memory (``transport.all_reduce``, ``NEAR_SIZES``)."""
    cal = calib.calibrate(world_size, sizes_bytes=sizes_bytes, groups=True, timeout=timeout)
    if shared_memory.why_not_here() is None:
        cal["near"] = calib.calibrate(world_size, sizes_bytes=NEAR_SIZES, groups=True, timeout=timeout,
                                      path="transport")
    return cal


def workload_tflops(cfg: train3d.Config, world_size: int | None = None, efficiency: float | None = None) -> float:
    """``planning.calibration.workload_tflops`` of ``cfg``'s GPT on one micro-batch (``batch / (dp · m)``
    rows), times ``tp_efficiency`` (measured unless given) where ``cfg`` splits its layers
    (``tp > 1``): the FLOP/s one rank's share of the work really runs at."""
    rows = cfg.batch // (cfg.dp * cfg.microbatches)
    dense = calib.workload_tflops(cfg.gpt, rows, cfg.torch_dtype, cfg.seed, world_size=world_size)
    return dense * (tp_efficiency(cfg, world_size) if efficiency is None else efficiency)


def block_seconds(gpt: models.GPTConfig, rows: int, tp: int, dtype=torch.float32, seed: int = 0,
                  repeats: int = 5) -> float:
    """Rank function: thread CPU seconds of one forward and backward of one transformer block of
    ``gpt`` on ``rows`` sequences, split ``tp`` ways over consecutive ranks (``tensor.plan.parallelize``;
    every group at once, so every rank computes, as in a run), without the time spun waiting for
    the group's other ranks; median of ``repeats`` after a warm-up."""
    with calib.consecutive_groups(tp) as group:
        block = models.Block(gpt, seed=seed).to(dtype)
        if tp > 1:
            block = parallelize(block, group=group)
        gen = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(rows, gpt.seq, gpt.hidden, generator=gen, dtype=dtype).requires_grad_()
        grad = torch.randn(rows, gpt.seq, gpt.hidden, generator=gen, dtype=dtype)
        samples = []
        with one_thread():
            for _ in range(repeats + 1):  # the first warms up
                for p in block.parameters():
                    p.grad = None
                dist.barrier()
                cpu, spun = time.thread_time(), shared_memory.waited_seconds()
                block(x).backward(grad)
                samples.append(time.thread_time() - cpu - (shared_memory.waited_seconds() - spun))
        return statistics.median(samples[1:])


def tp_efficiency(cfg: train3d.Config, world_size: int | None = None, repeats: int = 5) -> float:
    """How much of the ``1 / tp`` a tensor-parallel shard keeps: one block's seconds unsplit over
    ``tp`` times its shard's seconds (``block_seconds``, the slowest rank, both on the same
    ``world_size`` ranks, default ``cfg.world_size``), at the micro-batch of ``cfg``; 1.0 at tp 1.

    The FLOP count divides by tp, the time does not: every rank of a split layer still runs every
    operation, each with its fixed overhead, on matrices tp times narrower, and keeps the
    replicated ones (LayerNorms, residuals) whole. At hidden 128 and 4 rows on this machine a tp 4
    shard took about as long as the whole block (efficiency about 0.34). Planners that choose a
    TP degree profile each one for this reason (Alpa profiles every candidate stage on every
    submesh it could run on: Zheng et al. 2022)."""
    if cfg.tp == 1:
        return 1.0
    world = world_size or cfg.world_size
    rows = cfg.batch // (cfg.dp * cfg.microbatches)
    args = (cfg.gpt, rows)
    kwargs = {"dtype": cfg.torch_dtype, "seed": cfg.seed, "repeats": repeats}
    dense = max(launcher.run(block_seconds, world, args=(*args, 1), kwargs=kwargs, timeout=120))
    shard = max(launcher.run(block_seconds, world, args=(*args, cfg.tp), kwargs=kwargs, timeout=120))
    return dense / (cfg.tp * shard)


def predict(cfg: train3d.Config, cluster: Cluster, n_cores: float | None = None,
            near: Cluster | None = None) -> dict:
    """``planning.cost.step_time`` of ``cfg`` on ``cluster`` (a core per rank), and the bound of ranks that
    share ``n_cores`` cores: all ranks' compute divided by the cores, plus the communication (whose
    constants were measured on the same shared cores). ``step_s`` is the larger; also returned:
    the planner's parts, ``planner_s`` and ``shared_s`` (0 with a core per rank). ``near``: the
    cluster of what goes through shared memory (``cluster_from(..., near=True)``): everything but the
    data-parallel term is then priced by it."""
    n_cores = launcher.cores() if n_cores is None else n_cores
    model = memory.ModelConfig("tiny GPT", cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, cfg.seq)
    # train3d all-reduces its gradients after the backward (parallel3d.data_parallel): no overlap
    args = (model, cfg.batch, cfg.dp, cfg.pp, cfg.tp, cfg.microbatches, cfg.schedule, cfg.virtual)
    parts = step_time(args[0], cluster, *args[1:], overlap=0.0)
    if near is not None:
        parts = {**step_time(args[0], near, *args[1:], overlap=0.0), "dp_comm_s": parts["dp_comm_s"]}
        parts["step_s"] = sum(parts[k] for k in STEP_PARTS)
    ranks, shared = cfg.world_size, 0.0
    if ranks > n_cores:  # a rank idle in the bubble leaves its core to the others: no bubble term
        shared = parts["compute_s"] * ranks / n_cores + parts["tp_comm_s"] + parts["pp_comm_s"] + parts["dp_comm_s"]
    return {**parts, "planner_s": parts["step_s"], "shared_s": shared, "step_s": max(parts["step_s"], shared)}


def collective_counts(cfg: train3d.Config) -> dict:
    """Rank function: ``{op: {"count", "bytes"}}`` of every communication call this rank makes in
    ``cfg``'s training (``commlog``), to hold against what the planner counts."""
    with commlog.recording() as log:
        train3d.train_rank(cfg)
    return log.as_dict()


def measure(cfg: train3d.Config, timeout: float = 120.0) -> dict:
    """Run ``cfg`` on real ranks (no reference check: timing only). Per step the slowest rank's wall
    seconds; ``step_s`` is the median without the first (warm-up) step. ``cores_used``: the ranks'
    CPU seconds over the wall seconds (median over the same steps): how many cores they really got."""
    ranks = launcher.run(train3d.train_rank, cfg.world_size, kwargs=dict(cfg=cfg, timed=True), timeout=timeout)
    per_step = [max(r["step_s"][k] for r in ranks) for k in range(cfg.steps)]
    used = [sum(r["cpu_s"][k] for r in ranks) / per_step[k] for k in range(cfg.steps)]
    kept = slice(1, None) if cfg.steps > 1 else slice(None)
    return {"steps_s": per_step, "step_s": statistics.median(per_step[kept]),
            "cores_used": statistics.median(used[kept])}


def validate(grid=GRID_4, sizes=None, steps: int = 6, world_size: int = 4, calibration: dict | None = None,
             progress=print, run: dict | None = None) -> dict:
    """Calibrate (unless ``calibration`` is given), then for every model size and (dp, pp, tp) in
    ``grid`` predict and measure a step. Two predictions per plan: with the calibrated matmul
    throughput (``planning.calibration.calibrate`` as is) and with this model's own throughput
    (``workload_tflops``). Returns ``rows`` (``size, dp, pp, tp, predicted_s, measured_s,
    rel_error``, ``predicted_matmul_s``, ``rel_error_matmul``, ``rel_error_given_load`` -- the
    prediction told how many cores the ranks really got during the run -- and the prediction's
    parts), the three medians ``median_rel_error``, ``median_rel_error_matmul``,
    ``median_rel_error_given_load``, ``calibration``, ``cores``."""
    sizes = SIZES if sizes is None else sizes
    say = progress or (lambda line: None)
    if calibration is None:
        say(_("calibrating on {ranks} ranks ...").format(ranks=world_size))
        calibration = calibrate(world_size)
    n_cores = min(launcher.cores(), calibration.get("effective_cores", launcher.cores()))
    rows = []
    for size, shape in sizes.items():
        for dp, pp, tp in grid:
            if dp * pp * tp != world_size:
                raise ValueError(f"grid entry dp {dp} x pp {pp} x tp {tp} != world_size {world_size}")
            cfg = train3d.Config(dp=dp, pp=pp, tp=tp, steps=steps, **{**RUN, **(run or {}), **shape})
            train3d.check(cfg)
            say(_("{size}: dp {dp} x pp {pp} x tp {tp} ...").format(size=size, dp=dp, pp=pp, tp=tp))
            efficiency = tp_efficiency(cfg, world_size)
            tflops = workload_tflops(cfg, world_size=world_size, efficiency=efficiency)
            group = max(dp, tp)  # the all-reduce groups of these plans (where dp and tp are both > 1, equal)
            cluster = cluster_from(calibration, world_size, tflops=tflops, group=group)
            near = cluster_from(calibration, world_size, tflops=tflops, group=group, near=True)
            predicted = predict(cfg, cluster, n_cores, near)
            matmul = predict(cfg, cluster_from(calibration, world_size, group=group), n_cores,
                             cluster_from(calibration, world_size, group=group, near=True))
            measured = measure(cfg)
            given_load = predict(cfg, cluster, measured["cores_used"], near)
            rows.append({"size": size, "dp": dp, "pp": pp, "tp": tp, "predicted_s": predicted["step_s"],
                         "measured_s": measured["step_s"], "predicted_matmul_s": matmul["step_s"],
                         "rel_error": abs(predicted["step_s"] - measured["step_s"]) / measured["step_s"],
                         "rel_error_matmul": abs(matmul["step_s"] - measured["step_s"]) / measured["step_s"],
                         "rel_error_given_load": abs(given_load["step_s"] - measured["step_s"]) / measured["step_s"],
                         "cores_used": measured["cores_used"],
                         "workload_tflops": tflops, "tp_efficiency": efficiency, "prediction": predicted,
                         "steps_s": measured["steps_s"]})
    return {"rows": rows, "median_rel_error": statistics.median(r["rel_error"] for r in rows),
            "median_rel_error_matmul": statistics.median(r["rel_error_matmul"] for r in rows),
            "median_rel_error_given_load": statistics.median(r["rel_error_given_load"] for r in rows),
            "calibration": calibration, "cores": n_cores, "world_size": world_size}


# ----------------------------------------------------------------------------------------------
# The overlap term against ZeRO runs on the virtual clock.

# Links that make the course GPT's collectives cost from a fraction of its backward to more than it.
OVERLAP_LINKS = (Link("1 GB/s", 1e9, 20e-6), Link("200 MB/s", 2e8, 20e-6), Link("50 MB/s", 5e7, 20e-6))


def predict_zero(report: dict, overlap: float = OVERLAP_SHARE) -> dict:
    """The cost model's step for one ``zero.run`` report (one micro-batch per step): per rank its
    measured compute on the virtual clock, forward (``F ...``), backward (``B ...``) and the rest
    (the optimizer), plus ``dp_communication``'s exposed seconds for Ψ parameters of the run's
    value size on its link; the slowest rank's. Returns ``step_s``, ``exposed_s``, ``hidden_s``."""
    link = Link(**report["link"])
    value_bytes = zero_run.DTYPES[report["dtype"]].itemsize
    best = None
    for compute in report["timeline"]["virtual"]["compute"]:
        fwd = sum(end - start for label, start, end in compute if label.startswith("F "))
        bwd = sum(end - start for label, start, end in compute if label.startswith("B "))
        busy = sum(end - start for _, start, end in compute)
        comm = dp_communication(report["stage"], report["params"] * value_bytes, report["dp"], link, 1,
                                fwd, bwd, overlap)
        row = {"step_s": busy + comm["exposed_s"], "exposed_s": comm["exposed_s"], "hidden_s": comm["hidden_s"]}
        best = row if best is None or row["step_s"] > best["step_s"] else best
    return best


def validate_overlap(stages=(0, 1, 2, 3), dp: int = 2, links=OVERLAP_LINKS, steps: int = 3, batch: int = 8,
                     overlap: float = OVERLAP_SHARE, timeout: float = 180.0) -> dict:
    """Run every (stage, link) with ``overlap=True`` in one launch of ``dp`` ranks and compare the
    virtual-clock step (``run_zero``'s ``virtual.step_s``, the last step) with ``predict_zero``.
    Returns ``rows`` (``stage, link, measured_s, predicted_s, rel_error, exposed_s, hidden_s,
    serial_s``) and ``median_rel_error``."""
    runs = [zero_run.plan(stage, dp, steps=steps, batch=batch, overlap=True, link=link)
            for stage in stages for link in links]
    per_rank = launcher.run(zero_run.zero_jobs, dp, args=(runs,), timeout=timeout)
    rows = []
    for i, run in enumerate(runs):
        report = zero_run.report(run, [r[i] for r in per_rank])
        pred = predict_zero(report, overlap)
        measured = report["virtual"]["step_s"]
        rows.append({"stage": run.stage, "link": run.link.name, "measured_s": measured,
                     "predicted_s": pred["step_s"], "rel_error": abs(pred["step_s"] - measured) / measured,
                     "exposed_s": pred["exposed_s"], "hidden_s": pred["hidden_s"],
                     "serial_s": report["virtual"]["serial_step_s"]})
    return {"rows": rows, "median_rel_error": statistics.median(r["rel_error"] for r in rows), "dp": dp,
            "overlap": overlap}


def format_table(result: dict) -> str:
    """A text table of ``validate``'s rows and the median relative errors, in the language of the moment."""
    head = (f"{pad(_('model'), 11)} {'dp':>3} {'pp':>3} {'tp':>3} {pad(_('measured ms'), 12, '>')} "
            f"{pad(_('predicted ms'), 13, '>')} {pad(_('error'), 6, '>')} {pad(_('(matmul FLOP/s)'), 16, '>')} "
            f"{pad(_('error'), 6, '>')}")
    lines = [head, "-" * width(head)]
    for r in result["rows"]:
        lines.append(f"{r['size']:<11} {r['dp']:>3} {r['pp']:>3} {r['tp']:>3} {r['measured_s'] * 1e3:>12.1f} "
                     f"{r['predicted_s'] * 1e3:>13.1f} {r['rel_error']:>6.0%} {r['predicted_matmul_s'] * 1e3:>16.1f} "
                     f"{r['rel_error_matmul']:>6.0%}")
    cal, first = result["calibration"], result["rows"][0]
    shards = _(", its TP shards at {share:.2f} of 1/tp").format(share=first["tp_efficiency"]) if first["tp"] > 1 else ""
    lines.append(_("median relative error {error:.0%} with the model's own FLOP/s ({gflops:.1f} GFLOP/s for the first "
                   "plan{shards}), {matmul_error:.0%} with the matmul's ({matmul_gflops:.1f} GFLOP/s)").format(
        error=result["median_rel_error"], gflops=first["workload_tflops"] * 1e3, shards=shards,
        matmul_error=result["median_rel_error_matmul"], matmul_gflops=cal["tflops"] * 1e3))
    lines.append(_("{error:.0%} when told the cores the ranks really got during each run (a diagnostic: it "
                   "separates the model's error from the machine's other load)").format(
        error=result["median_rel_error_given_load"]))
    near = cal.get("near")
    through = "" if not near else _(" (gloo; through shared memory α {latency:.0f} us, {gbps:.2f} GB/s)").format(
        latency=near["latency_us"], gbps=near["intra_gbps"])
    lines.append(_("all-reduce α {latency:.0f} us, {gbps:.2f} GB/s{through}; {ranks} ranks on {cores:.1f} effective "
                   "cores").format(latency=cal["latency_us"], gbps=cal["intra_gbps"], through=through,
                                   ranks=result["world_size"], cores=result["cores"]))
    return "\n".join(lines)
