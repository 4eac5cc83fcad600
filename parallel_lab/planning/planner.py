"""Choosing a 3D-parallel plan: search (dp, pp, tp, micro-batches, schedule, recomputation) under the
memory limit and rank the survivors by predicted step time.

    >>> from parallel_lab.planning import planner
    >>> result = planner.plan_from_args(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048,
    ...                                 batch=1536, nodes=64, gpus_per_node=8, gpu_mem_gb=80)
    >>> [(p["tp"], p["pp"], p["dp"], p["schedule"], p["recompute"]) for p in result["plans"][:3]]
    [(4, 16, 8, 'zb-h1', 'selective'), (4, 32, 4, 'zb-h1', 'selective'), (4, 16, 8, 'interleaved-1f1b', 'selective')]
    >>> best_tp8 = min(p["step_s"] for p in result["plans"] if p["tp"] == 8)
    >>> round(best_tp8 / result["plans"][0]["step_s"], 2)   # TP 8 (a whole node): 2% behind
    1.02
    >>> next(r["reason"] for r in result["rejected"] if r["plan"]["tp"] == 16)
    'tp 16 > devices_per_node 8: tensor parallel groups would cross nodes'

GPT-3 175B on 64 nodes x 8 GPUs of 80 GB with GPT-3's batch (1536 sequences of 2048 tokens):
tensor parallelism stays inside a node. With only 1F1B (the schedule of Megatron-LM's 2021 paper)
TP 8 x PP 8 / TP 8 x PP 16 come first, as in the paper; with the zero-bubble ZB-H1 a deeper pipeline
is nearly free, and TP 4 (half the all-reduce time per device) edges ahead by 2%.

The cost model (per training step, on the slowest device; every term is printed in ``breakdown``):

- **compute**: ``6 · params · tokens`` FLOPs (Kaplan et al. 2020; forward 2, backward 4 per parameter
  and token), divided over all devices at ``flops`` each, times ``1 + overhead`` of recomputation
  (full: one more forward, +1/3; selective: the attention core's share of the forward,
  ``s/(6h + s)`` of it; Korthikanti et al. 2022). One micro-batch's forward is 1/3 of that, the
  backward 2/3.
- **tensor-parallel communication**: 2 all-reduces forward and 2 backward per layer of ``b·s·h``
  2-byte values (Megatron, Shoeybi et al. 2019; 2 more with full recomputation, none more with
  selective), ring α–β model (``collectives.predict_all_reduce``) over the intra-node links when
  the TP group is inside a node; at the ends of the model the vocab-parallel embedding (1 forward),
  LM head (1 backward) and cross-entropy (3 forward of one fp32 value per token). Added to each micro-batch's forward / backward: it is not
  overlapped, so it also lengthens the bubble. With sequence parallelism the all-reduces become an
  all-gather + a reduce-scatter of the same volume: same time.
- **pipeline bubble**: closed forms of the simulator's makespan (``parallel_lab.pipeline.simulate``; equal
  stage costs, free links -- tested equal): GPipe and 1F1B ``(m + p - 1)(F + B)``, interleaved 1F1B
  ``m(F + B) + (p - 1)(F + B)/v``, ZB-H1 ``m(F + B) + (p - 1)·max(F, B/2)`` (its W passes fill the
  cool-down).
- **pipeline point-to-point**: every micro-batch chunk sends its activation forward and receives its
  gradient back, ``b·s·h/t`` 2-byte values (Megatron's scatter/gather optimisation), not overlapped;
  inter-node links when a pipeline group spans nodes.
- **data-parallel gradient all-reduce** of this device's 2-byte gradients over ``dp`` (ZeRO-1:
  reduce-scatter + all-gather, the same volume), not overlapped with backward; inter-node links when
  a data-parallel group spans nodes.

Memory comes from ``parallel_lab.planning.memory_model`` (Korthikanti et al. activations, in-flight
micro-batches from the simulator, optional ZeRO-1). Deliberately simple: no kernel efficiency that
depends on shapes, no overlap, no congestion between groups sharing a link. Good for ranking plans and
for seeing why; check its constants against real runs with ``calibrate``.
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
import time
from dataclasses import asdict, dataclass

from parallel_lab.planning import memory, memory_model
from parallel_lab.runtime.collectives import predict_all_reduce
from parallel_lab.runtime.mesh import ParallelDims
from parallel_lab.pipeline.schedules import MAX_STAGES

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
RECOMPUTE = memory_model.RECOMPUTE
VIRTUAL = (2, 3, 4)  # model chunks per rank tried for interleaved 1F1B
GPT3_TOKENS = 300e9  # tokens GPT-3 was trained on (Brown et al. 2020), the default for costs
GB = memory.GB


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` devices with ``gpu_mem_gb`` GB each (10^9 bytes).

    Bandwidths are per device and per direction in GB/s (bytes, not bits): ``intra_gbps`` over the
    node's links (NVLink), ``inter_gbps`` over the network (one 200 Gb/s InfiniBand port per GPU is 25).
    ``tflops`` is the *achieved* dense throughput per device (not the datasheet peak; ~50% of an
    A100's 312). ``latency_us`` is the α of one message.
    """

    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    intra_gbps: float = 300.0
    inter_gbps: float = 25.0
    tflops: float = 150.0
    latency_us: float = 5.0

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {name} {value!r}")
        for name in ("gpu_mem_gb", "intra_gbps", "inter_gbps", "tflops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {name} {value!r}")
        if not 0 <= self.latency_us < math.inf:
            raise ValueError(f"latency_us must be >= 0, got latency_us {self.latency_us!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


# ----------------------------------------------------------------------------------------------
# The time model.


def pipeline_makespan(schedule: str, pp: int, microbatches: int, virtual: int, fwd: float, bwd: float) -> float:
    """Closed form of the simulated makespan for equal stages of one micro-batch forward ``fwd`` and
    backward ``bwd`` (whole rank, all its chunks) and free links (see the module doc)."""
    p, m, v = pp, microbatches, virtual
    work = m * (fwd + bwd)
    if schedule in ("gpipe", "1f1b"):
        return work + (p - 1) * (fwd + bwd)
    if schedule == "interleaved-1f1b":
        return work + (p - 1) * (fwd + bwd) / v
    if schedule == "zb-h1":
        return work + (p - 1) * max(fwd, bwd / 2)
    raise ValueError(f"no closed form for schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def _recompute_overhead(model: memory.ModelConfig, recompute: str) -> float:
    """Extra forward work as a fraction of the forward: 1 (full), the attention core (selective)."""
    if recompute == "full":
        return 1.0
    if recompute == "selective":
        return model.seq / (6 * model.hidden + model.seq)
    return 0.0


@functools.lru_cache(maxsize=1024)
def _crossings(dp, pp, tp, nodes, gpus_per_node) -> dict:
    """Which dimensions' groups span nodes (validates the layout too)."""
    dims = ParallelDims(dp, pp, tp, nodes, gpus_per_node)
    return {dim: dims.crosses_nodes(dim) for dim in ("dp", "pp", "tp")}


def step_time(model: memory.ModelConfig, cluster: Cluster, batch: int, dp: int, pp: int, tp: int,
              microbatches: int, schedule: str = "1f1b", virtual: int = 1, recompute: str = "none") -> dict:
    """Predicted seconds per step and its parts: ``compute_s``, ``tp_comm_s``, ``bubble_s``,
    ``pp_comm_s``, ``dp_comm_s`` and their sum ``step_s``."""
    crosses = _crossings(dp, pp, tp, cluster.nodes, cluster.gpus_per_node)
    b = batch // (dp * microbatches)
    flops = 6 * memory_model.param_count(model.layers, model.hidden, model.vocab, model.seq) * batch * model.seq
    per_device = flops / (dp * pp * tp) / (cluster.tflops * 1e12)
    fwd = per_device / 3 / microbatches  # one micro-batch through this rank's layers
    bwd = 2 * fwd + fwd * _recompute_overhead(model, recompute)
    alpha = cluster.latency_us * 1e-6

    def bandwidth(dim):
        return (cluster.inter_gbps if crosses[dim] else cluster.intra_gbps) * 1e9

    tp_fwd = tp_bwd = 0.0
    if tp > 1:
        one = predict_all_reduce(2 * b * model.seq * model.hidden, tp, alpha, bandwidth("tp"))
        layers = model.layers // pp
        tp_fwd = layers * 2 * one
        tp_bwd = layers * (4 if recompute == "full" else 2) * one
        # the ends of the model, on the last stage (with pp 1 also the first): the LM head's input
        # gradient (one backward) and the vocab-parallel loss's max, sum of exponentials and target
        # logit (three forward, one fp32 value per token); the first stage's embedding sums its
        # partial lookups (one forward), no more than that
        per_token = predict_all_reduce(4 * b * model.seq, tp, alpha, bandwidth("tp"))
        tp_fwd += 3 * per_token + (one if pp == 1 else 0.0)
        tp_bwd += one
    makespan = pipeline_makespan(schedule, pp, microbatches, virtual, fwd + tp_fwd, bwd + tp_bwd)
    work = microbatches * (fwd + bwd + tp_fwd + tp_bwd)
    pp_comm = 0.0
    if pp > 1:
        message = 2 * b * model.seq * model.hidden / tp
        pp_comm = 2 * microbatches * virtual * (alpha + message / bandwidth("pp"))
    dp_comm = 0.0
    if dp > 1:
        grads = max(memory_model.stage_params(model, pp, tp, s) for s in {0, pp - 1}) * 2  # middle stages hold less
        dp_comm = predict_all_reduce(grads, dp, alpha, bandwidth("dp"))
    parts = {"compute_s": microbatches * (fwd + bwd), "tp_comm_s": microbatches * (tp_fwd + tp_bwd),
             "bubble_s": makespan - work, "pp_comm_s": pp_comm, "dp_comm_s": dp_comm}
    parts["step_s"] = sum(parts.values())
    return parts


# ----------------------------------------------------------------------------------------------
# The search.


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _structural_reason(model, cluster, batch, dp, pp, tp) -> str | None:
    """Why (dp, pp, tp) cannot work at all, whatever the schedule (None if it can)."""
    try:
        ParallelDims(dp, pp, tp, cluster.nodes, cluster.gpus_per_node)
    except ValueError as exc:
        return str(exc)
    if model.heads % tp:
        return f"heads {model.heads} % tp {tp} != 0"
    if model.hidden % tp:
        return f"hidden {model.hidden} % tp {tp} != 0"
    if model.layers % pp:
        return f"layers {model.layers} % pp {pp} != 0"
    if pp > MAX_STAGES:
        return f"pp {pp} > {MAX_STAGES}, the schedule simulator's cap"
    if batch % dp:
        return f"batch {batch} % dp {dp} != 0"
    return None


def _variants(model, pp, schedules):
    """(schedule, virtual) pairs worth trying; with pp 1 every schedule is gradient accumulation,
    listed once as 1f1b."""
    if pp == 1:
        plain = [name for name in schedules if name != "interleaved-1f1b"] or ["1f1b"]
        return [("1f1b" if "1f1b" in plain else plain[0], 1)] if schedules else []
    out = []
    for name in schedules:
        if name == "interleaved-1f1b":
            out += [(name, v) for v in VIRTUAL if model.layers % (pp * v) == 0]
        else:
            out.append((name, 1))
    return out


def _choose_microbatches(model, cluster, batch, layout: dict, zero1: bool, sp: bool) -> dict:
    """For one layout (dp, pp, tp, schedule, virtual, recompute), the plan row with the number of
    micro-batches that is fastest and fits, or a rejection ``{"plan", "reason"}``."""
    dp, pp, tp = layout["dp"], layout["pp"], layout["tp"]
    schedule, virtual, rc = layout["schedule"], layout["virtual"], layout["recompute"]
    counts = [m for m in _divisors(batch // dp) if schedule != "interleaved-1f1b" or m % pp == 0]
    if not counts:
        return {"plan": layout, "reason": f"interleaved-1f1b needs microbatches % pp {pp} == 0; "
                                          f"batch / dp = {batch // dp} has no such divisor"}

    def times(m):
        return step_time(model, cluster, batch, dp, pp, tp, m, schedule, virtual, rc)

    lightest = None
    for m in sorted(counts, key=lambda m: (times(m)["step_s"], m)):  # fastest first; memory only as needed
        b = batch // (dp * m)
        mem = memory_model.max_device_memory(model, micro_batch=b, dp=dp, pp=pp, tp=tp, sequence_parallel=sp,
                                              schedule=schedule, microbatches=m, virtual=virtual,
                                              recompute=rc, zero1=zero1)
        if mem["total"] <= cluster.gpu_mem_gb * GB:
            t = times(m)
            return layout | {
                "microbatches": m, "micro_batch": b, "sequence_parallel": sp, "zero1": zero1,
                "step_s": t["step_s"], "memory_gb": mem["total"] / GB,
                "breakdown": {k: v for k, v in t.items() if k != "step_s"},
                "memory": {k: mem[k] / GB for k in ("weights", "gradients", "optimizer", "activations")}
                | {"stage": mem["stage"], "in_flight": mem["in_flight"]},
                "global_batch": batch, "seq": model.seq, "world_size": dp * pp * tp}
        if lightest is None or mem["total"] < lightest[0]["total"]:
            lightest = (mem, m, b)
    mem, m, b = lightest
    return {"plan": layout | {"microbatches": m, "micro_batch": b},
            "reason": f"needs {mem['total'] / GB:.1f} GB > {cluster.gpu_mem_gb:g} GB (stage {mem['stage']}; "
                      f"the lightest of every micro-batching tried: {m} x {b} sequences)"}


def plan(model: memory.ModelConfig, cluster: Cluster, batch: int, *, schedules=SCHEDULES,
         recompute=RECOMPUTE, zero1: bool = False, sequence_parallel: bool = True,
         top: int | None = None) -> dict:
    """Rank every plan that fits; say why the others do not.

    For each (dp, pp, tp) with ``dp * pp * tp`` = all devices, each schedule (and chunk count for
    interleaved 1F1B) and each recomputation, the number of micro-batches m (a divisor of
    ``batch / dp``) with the shortest predicted step that fits in memory is kept. Returns
    ``{"plans": [...fastest first...], "rejected": [{"plan": {...}, "reason": "..."}], "feasible",
    "considered"}``; a plan has ``dp, pp, tp, microbatches, micro_batch, schedule, virtual,
    recompute, sequence_parallel, zero1, step_s, memory_gb, breakdown, memory``. A layout that
    cannot work at all is rejected once, without schedule; a memory rejection quotes the lightest
    micro-batching tried. Sequence parallelism is used whenever tp > 1 (same traffic, less memory).
    """
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch must be a positive integer (sequences per step), got batch {batch!r}")
    for name in schedules:
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}; the planner knows {', '.join(SCHEDULES)}")
    for name in recompute:
        memory_model._check_recompute(name)
    world = cluster.world_size
    plans, rejected, considered = [], [], 0
    for tp in _divisors(world):
        for pp in _divisors(world // tp):
            dp = world // (tp * pp)
            considered += 1
            reason = _structural_reason(model, cluster, batch, dp, pp, tp)
            if reason:
                rejected.append({"plan": {"dp": dp, "pp": pp, "tp": tp}, "reason": reason})
                continue
            for schedule, virtual in _variants(model, pp, schedules):
                for rc in recompute:
                    considered += 1
                    layout = {"dp": dp, "pp": pp, "tp": tp, "schedule": schedule, "virtual": virtual, "recompute": rc}
                    row = _choose_microbatches(model, cluster, batch, layout, zero1, sequence_parallel and tp > 1)
                    (rejected if "reason" in row else plans).append(row)
    plans.sort(key=lambda p: (p["step_s"], p["memory_gb"]))
    return {"plans": plans if top is None else plans[:top], "feasible": len(plans),
            "rejected": rejected, "considered": considered}


def training_cost(plan: dict, tokens: float, price_per_gpu_hour: float) -> dict:
    """GPU-hours and price of training on ``tokens`` tokens with ``plan`` (a row of ``plan()``):
    steps = tokens / (global batch x seq), GPU-hours = steps x step_s x devices / 3600."""
    if not tokens > 0 or not price_per_gpu_hour >= 0:
        raise ValueError(f"need tokens > 0 and price >= 0, got tokens {tokens}, price {price_per_gpu_hour}")
    steps = tokens / (plan["global_batch"] * plan["seq"])
    seconds = steps * plan["step_s"]
    gpu_hours = seconds * plan["world_size"] / 3600
    return {"steps": steps, "days": seconds / 86400, "gpu_hours": gpu_hours,
            "cost": gpu_hours * price_per_gpu_hour}


def plan_from_args(layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int, nodes: int,
                   gpus_per_node: int, gpu_mem_gb: float, intra_gbps: float = 300.0, inter_gbps: float = 25.0,
                   tflops: float = 150.0, latency_us: float = 5.0, price: float | None = None,
                   tokens: float = GPT3_TOKENS, top: int = 10, zero1: bool = False) -> dict:
    """The ``parallel-lab plan --json`` object: ``plan()`` for these sizes, the ``top`` fastest plans,
    each with ``cost`` (``training_cost`` for ``tokens``) when ``price`` ($ per GPU-hour) is given."""
    model = memory.ModelConfig("custom", layers, hidden, heads, vocab, seq)
    cluster = Cluster(nodes, gpus_per_node, gpu_mem_gb, intra_gbps, inter_gbps, tflops, latency_us)
    result = plan(model, cluster, batch, zero1=zero1, top=top)
    if price is not None:
        for row in result["plans"]:
            row["cost"] = training_cost(row, tokens, price)
    result["model"] = {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq": seq,
                       "params": memory_model.param_count(layers, hidden, vocab, seq)}
    result["cluster"] = asdict(cluster)
    result["batch"] = batch
    return result


def format_plans(result: dict, top: int = 5, rejected: int = 5) -> str:
    """A text table of the fastest plans and a few rejections (the CLI's output without --json)."""
    lines = [f"{'dp':>4} {'pp':>3} {'tp':>3} {'m':>5} {'b':>3} {'schedule':<18} {'recompute':<9} "
             f"{'step s':>8} {'GB':>6}"]
    for p in result["plans"][:top]:
        name = p["schedule"] + (f" (v={p['virtual']})" if p["virtual"] > 1 else "")
        lines.append(f"{p['dp']:>4} {p['pp']:>3} {p['tp']:>3} {p['microbatches']:>5} {p['micro_batch']:>3} "
                     f"{name:<18} {p['recompute']:<9} {p['step_s']:>8.2f} {p['memory_gb']:>6.1f}")
    lines.append(f"{result['feasible']} plans fit; {len(result['rejected'])} rejected, e.g.:")
    for r in result["rejected"][:rejected]:
        lines.append(f"  {r['plan']}: {r['reason']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Calibration on this machine's ranks.


def all_reduce_in_situ(sizes_bytes, repeats: int = 5, calls: int = 10, group=None) -> list[float]:
    """Rank function: seconds of one all-reduce of each size over ``group`` (default: all ranks),
    measured as training issues them, between computations. A loop of ``calls`` (a little compute,
    then an all-reduce) is timed against the same loop without the all-reduces; the difference per
    call, median of ``repeats``. (A lone all-reduce after a barrier also pays for the ranks leaving
    the barrier apart; back-to-back ones find every communication thread already awake.)"""
    import torch
    import torch.distributed as dist

    small = torch.randn(64, 64)

    def loop(tensor) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            x = small
            for _ in range(4):  # about a millisecond of work
                x = torch.tanh(x @ small)
            if tensor is not None:
                dist.all_reduce(tensor, group=group)
        return (time.perf_counter() - start) / calls

    seconds = []
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4))
        dist.all_reduce(tensor, group=group)  # warm-up: the first use of a size sets up buffers
        seconds.append(statistics.median(max(loop(tensor) - loop(None), 1e-7) for _ in range(repeats)))
    return seconds


def measure_rank(sizes_bytes=(2**10, 2**14, 2**17, 2**20), matmul: int = 192, repeats: int = 5) -> dict:
    """Rank function: thread-CPU seconds of an ``n x n`` fp32 matmul (median of ``repeats``) and
    all-reduce seconds for each size (``all_reduce_in_situ``)."""
    import torch

    a, b = torch.randn(matmul, matmul), torch.randn(matmul, matmul)
    a @ b  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.thread_time()
        a @ b
        samples.append(time.thread_time() - start)
    return {"matmul_s": statistics.median(samples), "flops": 2 * matmul**3,
            "all_reduce_s": all_reduce_in_situ(sizes_bytes, repeats)}


def calibrate(world_size: int = 2, sizes_bytes=(2**10, 2**14, 2**17, 2**20), matmul: int = 192,
              repeats: int = 5, timeout: float = 60.0) -> dict:
    """Fit the planner's constants on ``world_size`` CPU ranks of this machine: achieved FLOP/s per
    rank (median over ranks of a timed matmul) and the α–β of all-reduce (``fit_alpha_beta``). Returns
    ``tflops``, ``latency_us``, ``intra_gbps`` (the ranks share one machine: that is the "node") and
    the raw measurements, ready for ``Cluster(nodes=1, gpus_per_node=world_size, ...)``."""
    from parallel_lab.runtime import launcher

    if world_size < 2:
        raise ValueError(f"calibration fits an all-reduce and needs world_size >= 2, got world_size {world_size}")
    per_rank = launcher.run(measure_rank, world_size, kwargs=dict(sizes_bytes=tuple(sizes_bytes), matmul=matmul,
                                                                   repeats=repeats), timeout=timeout)
    flops = statistics.median(r["flops"] / max(r["matmul_s"], 1e-9) for r in per_rank)
    seconds = [max(r["all_reduce_s"][i] for r in per_rank) for i in range(len(sizes_bytes))]
    return {"tflops": flops / 1e12, **all_reduce_constants(sizes_bytes, seconds, world_size),
            "world_size": world_size, "sizes_bytes": list(sizes_bytes)}


def all_reduce_constants(sizes_bytes, seconds, group_size: int) -> dict:
    """``latency_us`` and ``intra_gbps`` of the α–β fit (``collectives.fit_alpha_beta``) to all-reduce
    ``seconds`` on groups of ``group_size``, with the measurements (``all_reduce_s``) and the fitted
    times. Where the fit finds no positive β (a noisy machine), the bandwidth is the one the largest
    message achieved, so that the constants always make a valid ``Cluster``."""
    from parallel_lab.runtime.collectives import fit_alpha_beta

    fit = fit_alpha_beta(sizes_bytes, seconds, group_size)
    gbps = fit["bandwidth_bytes_per_s"] / 1e9
    if not 0 < gbps < math.inf:
        gbps = 2 * (group_size - 1) / group_size * sizes_bytes[-1] / seconds[-1] / 1e9
    return {"latency_us": max(fit["alpha_s"], 0.0) * 1e6, "intra_gbps": gbps, "all_reduce_s": list(seconds),
            "fitted_s": fit["fitted_s"]}
