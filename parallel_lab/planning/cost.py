"""The time model of a training step under 3D parallelism, and of one tensor-parallel layer.

The cost model (per training step, on the slowest device; every term is printed in ``breakdown``):

- **compute**: ``6 · params · tokens`` FLOPs (Kaplan et al. 2020; forward 2, backward 4 per parameter
  and token), divided over all devices at ``flops`` each, times ``1 + overhead`` of recomputation
  (full: one more forward, +1/3; selective: the attention core's share of the forward,
  ``s/(6h + s)`` of it; Korthikanti et al. 2022). One micro-batch's forward is 1/3 of that, the
  backward 2/3.
- **tensor-parallel communication**: 2 all-reduces forward and 2 backward per layer of ``b·s·h``
  2-byte values (Megatron, Shoeybi et al. 2019; 2 more with full recomputation, none more with
  selective), ring α–β model (``ring_all_reduce_time``) over the intra-node links when
  the TP group is inside a node; at the ends of the model the vocab-parallel embedding (1 forward),
  LM head (1 backward) and cross-entropy (3 forward of one fp32 value per token). Added to each
  micro-batch's forward / backward: it is not overlapped, so it also lengthens the bubble. With sequence parallelism the
  all-reduces become an all-gather + a reduce-scatter of the same volume: same time.
- **pipeline bubble**: closed forms of the simulator's makespan (``parallel_lab.pipeline.simulate``; equal
  stage costs, free links -- tested equal): GPipe and 1F1B ``(m + p - 1)(F + B)``, interleaved 1F1B
  ``m(F + B) + (p - 1)(F + B)/v``, ZB-H1 ``m(F + B) + (p - 1)·max(F, B/2)`` (its W passes fill the
  cool-down), and for m >= 2p the V schedules (two stages per rank): DualPipeV ``m(F + B) +
  max((p - 1)·max(F - B/2, F/2), (p - 1)·B/4 - F/2)`` and ZB-V ``m(F + B) + (p - 1)·max(F/2, B/4) +
  (p - 2)·max(0, F/2 - B/4)`` (both fitted to the simulator and held against it). The planner
  searches all six by default (``planner.SCHEDULES``).
- **uneven end ranks** (``ends=True``; ``step_time``'s default is False, the planner's True): the
  first rank also runs the embedding, the LM head's rank (the last; rank 0 in the V schedules) the
  head and the loss, at 6 FLOPs per parameter and token like the rest (``rank_loads``), and a pp
  that does not divide the layers gives the end ranks fewer blocks
  (``memory_model.light_ends_split``). Unequal ranks are priced by ``uneven_makespan``: the closed
  form at the middle ranks' load, the slowest rank pacing the steady state, every rank's excess once
  (exact for GPipe and 1F1B, within 10 % of the simulator for the others). Off, the head's and
  embedding's work is spread over every rank (``planner.plan(..., ends=False)``, for comparison).
- **pipeline point-to-point**: every micro-batch chunk sends its activation forward and receives its
  gradient back, ``b·s·h/t`` 2-byte values (Megatron's scatter/gather optimisation), not overlapped;
  inter-node links when a pipeline group spans nodes.
- **data-parallel / ZeRO communication** of this device's shard (its pipeline stage's parameters on
  its TP rank, Ψ_d, 2-byte values) over ``dp``, on the inter-node links when a data-parallel group
  spans nodes (``dp_communication``). Per step, the volume of Rajbhandari et al. 2020 ("ZeRO",
  section 7, ``parallel_lab.zero.traffic``): stage 0 an all-reduce (2Ψ_d); stages 1-2 a
  reduce-scatter of the gradients and an all-gather of the updated parameters (2Ψ_d); stage 3 two
  all-gathers of the parameters (forward, backward) and a reduce-scatter (3Ψ_d, 1.5x). With m
  micro-batches of gradient accumulation the sharded stages pay per micro-batch what they shard:
  stage 2 reduce-scatters each micro-batch's gradient (it keeps no full gradient to accumulate in),
  stage 3 gathers and reduce-scatters in each micro-batch -- (m + 1)Ψ_d and 3mΨ_d; stages 0-1
  accumulate the full gradient and communicate once (DeepSpeed's reason for refusing ZeRO-2/3 with
  pipeline parallelism; here they are allowed and priced).
- **expert parallelism** (``ep``, a model with ``experts``): compute counts the ``top_k`` experts a
  token passes, not all E (``memory_model.active_param_count``; Fedus et al. 2021, "Switch
  Transformers", section 2). Every MoE layer pays 4 all-to-alls per micro-batch -- dispatch and
  combine forward, their conjugates backward (Lepikhin et al. 2020, "GShard", section 2.2) -- of
  ``tokens · top_k · h`` 2-byte values per rank, where a rank's tokens are its ``b·s/(cp·tp)``
  (sequence-parallel share), priced by ``moe.cost.moe_layer_time`` (pairwise-exchange α–β) over
  NVLink when the EP group is inside a node, the network when it spans nodes; 2 more with full
  recomputation. Not overlapped: they sit between the router and the experts on every micro-batch's
  critical path (DeepSeek-V3, DeepSeek-AI 2024, section 3.2.1, hides them behind another
  micro-batch's compute with DualPipe, which the planner does not search), so they are added to the
  forward and backward like TP's. The experts' gradients are reduced over their expert-data-parallel
  group (dp·cp/ep ranks, DeepSpeed-MoE, Rajbhandari et al. 2022), the rest over dp·cp.
- **context parallelism** (``cp``): each rank computes ``s/cp`` positions (compute / cp) and ring
  attention passes K/V blocks around the CP group each layer (``context.cost.context_cost``: cp - 1
  hops forward, 2cp - 1 backward, of ``2·b·(s/cp)·(h/tp)`` 2-byte values; Liu et al. 2023, "Ring
  Attention"). Each hop overlaps the block of attention computed meanwhile, so only
  ``context_cost(..., flops=...)``'s ``exposed_comm_s`` is charged (hidden unless a block computes
  faster than its hop), shared between forward and backward as the hops are; the forward's again
  with full recomputation. The rank order is (dp, pp, cp, tp), tp fastest: a CP group is tp ranks
  apart, inside a node while cp·tp fits one (Megatron-Core orders tp, cp, dp, pp). Activations, TP
  all-reduces and PP messages carry ``s/cp`` positions; the data-parallel gradients are reduced over
  dp·cp. Attention's own FLOPs (4bs²h a layer) stay out of ``compute_s``, as for dense models.
- **overlap** of that communication with the compute, as ``parallel_lab.zero.overlap`` runs it (DDP's
  buckets, Li et al. 2020, "PyTorch Distributed", section 3.2.3; ZeRO-3 prefetch, Zhao et al. 2023,
  "PyTorch FSDP", section 3.3): the gradient collectives issued during a backward travel while it
  computes, so only ``max(0, comm - overlap · window)`` is exposed, where ``window`` is that
  backward (one micro-batch's: stages 0-1 reduce in the last micro-batch's backward, as DDP under
  ``no_sync``) and ``overlap`` (``OVERLAP_SHARE``) the share of it communication can use. Stage 3's
  all-gathers are prefetched behind the forward and the backward; its reduce-scatter and stages
  1-2's all-gather of the updated parameters are exposed (the engine waits for them; FSDP can also
  overlap the reduce-scatter, so stage 3 is priced as an upper bound). TP all-reduces and PP
  sends stay exposed: they sit on the critical path of every micro-batch. ``dp_comm_s`` is the
  exposed part (in the step), ``dp_hidden_s`` the hidden part (not in it).

Deliberately simple: no kernel efficiency that depends on shapes, no congestion between groups
sharing a link, no slow-down of compute by the communication it hides. Good for ranking plans and
for seeing why; its constants come from ``parallel_lab.hardware.Cluster`` (or from this machine,
``parallel_lab.planning.calibration``); ``parallel_lab.parallel3d.validate_plans`` holds it against real 3D runs
(``validate``) and the overlap term against ZeRO runs on the virtual clock (``validate_overlap``).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from parallel_lab.context.cost import context_cost
from parallel_lab.hardware import Cluster, Link, ring_all_reduce_time
from parallel_lab.moe.cost import moe_layer_time
from parallel_lab.planning import memory, memory_model
from parallel_lab.runtime.mesh import ParallelDims
from parallel_lab.zero.memory import check_stage

# Lesson 15 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("pipeline_makespan",)
CLOSED_FORMS = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")
V_SCHEDULES = memory_model.V_SCHEDULES  # two stages per rank in V order: m >= 2p for their closed forms
# The share of a backward pass that gradient communication in flight can use (see the module doc).
# A modelling assumption, checked against ``zero.overlap``'s virtual clock by
# ``parallel3d.validate_plans.validate_overlap`` (median error under 20 %, tests/test_planner.py):
# DDP's buckets start as soon as the first is full, so communication travels for all of the backward
# but the first bucket's computation -- nearly all of it with GPT-3's hundreds of 25 MB buckets.
OVERLAP_SHARE = 0.9
# their sum is step_s; dp_comm_s stays last (``with_dp`` adds it)
STEP_PARTS = ("compute_s", "tp_comm_s", "ep_comm_s", "cp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s")


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
    if schedule == "dualpipe-v":  # per stage F = fwd/2, B = bwd/2, I = W = B/2; needs m >= 2p (tests/test_dualpipe.py)
        return work + max((p - 1) * max(fwd - bwd / 2, fwd / 2), (p - 1) * bwd / 4 - fwd / 2)
    if schedule == "zb-v":  # the same per-stage costs, m >= 2p; fitted to the simulator, held against it in tests
        return work + (p - 1) * max(fwd / 2, bwd / 4) + max(0, p - 2) * max(0.0, fwd / 2 - bwd / 4)
    raise ValueError(f"no closed form for schedule {schedule!r}; choose one of {', '.join(CLOSED_FORMS)}")


def uneven_makespan(schedule: str, pp: int, microbatches: int, virtual: int, fwd: list[float],
                    bwd: list[float]) -> float:
    """The makespan when pipeline ranks differ: ``fwd[r]``, ``bwd[r]`` are one micro-batch's forward and
    backward through rank r's layers (the ends hold more: the embedding, the LM head). The closed form
    at the middle ranks' load t (the median), plus (m - 1)(t_max - t) for the slowest rank pacing the
    steady state, plus every rank's excess once (the fill and drain pass through each). Exact for GPipe
    and 1F1B; for the others within 10 % of the simulator with ends up to half a rank heavier
    (tests/test_planner.py), above it for the zero-bubble schedules (their W's absorb part of it)."""
    loads = [f + b for f, b in zip(fwd, bwd)]
    # the middle ranks' load: the most common one (the lighter on a tie: two ranks, both ends)
    common = {}
    for r, t in enumerate(loads):
        common.setdefault(round(t, 12), []).append(r)
    mid = min(common.values(), key=lambda ranks: (-len(ranks), loads[ranks[0]]))[0]
    base = pipeline_makespan(schedule, pp, microbatches, virtual, fwd[mid], bwd[mid])
    excess = [t - loads[mid] for t in loads]
    return base + (microbatches - 1) * max(0.0, max(excess)) + sum(x for x in excess if x > 0)


def recompute_extra_forward(model: memory.ModelConfig, recompute: str, seq: int | None = None) -> float:
    """Extra forward work of recomputation as a fraction of one forward: 1 (full: the whole forward
    again), the attention core's share s/(6h + s) (selective, Korthikanti et al. 2022), 0 (none).
    ``recompute_overhead`` is the same work as a fraction of the whole step."""
    recompute = memory_model.check_recompute(recompute)
    s, h = (model.seq if seq is None else seq), model.hidden
    return {"none": 0.0, "full": 1.0, "selective": s / (6 * h + s)}[recompute]


@functools.lru_cache(maxsize=1024)
def _crossings(dp, pp, tp, nodes, gpus_per_node) -> dict:
    """Which dimensions' groups span nodes (validates the layout too)."""
    dims = ParallelDims(dp, pp, tp, nodes, gpus_per_node)
    return {dim: dims.crosses_nodes(dim) for dim in ("dp", "pp", "tp")}


@functools.lru_cache(maxsize=1024)
def _crossings_ep_cp(dp, pp, cp, tp, ep, nodes, gpus_per_node) -> dict:
    """Which groups span nodes on the (dp, pp, cp, tp) rank grid (tp fastest): ``tp``, ``cp``,
    ``pp``, ``dp`` (the gradients' dp·cp group), ``ep`` (ep consecutive dp replicas; DeepSpeed-MoE)
    and ``edp`` (the experts' gradient group, dp·cp/ep). With cp = ep = 1 the same as ``_crossings``."""
    ParallelDims(dp * cp, pp, tp, nodes, gpus_per_node)  # the world fills the nodes, TP stays inside one
    D, P, C, T, G, J = range(dp), range(pp), range(cp), range(tp), range(dp // ep), range(ep)

    def rank(d, p, c, t):
        return ((d * pp + p) * cp + c) * tp + t

    groups = {
        "tp": ([rank(d, p, c, t) for t in T] for d in D for p in P for c in C),
        "cp": ([rank(d, p, c, t) for c in C] for d in D for p in P for t in T),
        "pp": ([rank(d, p, c, t) for p in P] for d in D for c in C for t in T),
        "dp": ([rank(d, p, c, t) for d in D for c in C] for p in P for t in T),
        "ep": ([rank(g * ep + j, p, c, t) for j in J] for g in G for p in P for c in C for t in T),
        "edp": ([rank(g * ep + j, p, c, t) for g in G for c in C] for j in J for p in P for t in T),
    }
    return {dim: any(len({r // gpus_per_node for r in group}) > 1 for group in rows)
            for dim, rows in groups.items()}


def ep_communication(model: memory.ModelConfig, micro_batch: int, tp: int, ep: int, cp: int, link: Link) -> float:
    """Seconds of one MoE layer's 4 all-to-alls for one micro-batch on one rank: ``moe.cost.
    moe_layer_time`` of the rank's ``b·s/(cp·tp)`` tokens, each to ``top_k`` experts, over ``ep``
    ranks on ``link`` (GShard, Lepikhin et al. 2020, section 2.2; see the module doc); 0 for ep 1."""
    if ep == 1 or not model.experts:
        return 0.0
    tokens = max(1, micro_batch * (model.seq // cp) // tp)
    return moe_layer_time(tokens, model.hidden, model.top_k, ep, link)


def cp_communication(model: memory.ModelConfig, micro_batch: int, tp: int, cp: int, link: Link,
                     flops: float) -> tuple[float, float]:
    """``(forward, backward)`` seconds of one layer's ring-attention K/V passing left exposed for one
    micro-batch on one rank of ``cp`` (its ``heads/tp`` heads): ``context.cost.context_cost``'s
    ``exposed_comm_s`` at ``flops`` FLOP/s (each hop overlaps a block's compute; Liu et al. 2023),
    split between the passes as its messages are; (0, 0) for cp 1."""
    if cp == 1:
        return 0.0, 0.0
    c = context_cost("ring", batch=micro_batch, seq=model.seq, hidden=model.hidden // tp,
                     heads=model.heads // tp, cp=cp, link=link, dtype_bytes=2, causal=True, flops=flops)
    forward = c.exposed_comm_s * c.messages_forward / c.messages
    return forward, c.exposed_comm_s - forward


def _ring_half(n_bytes: float, p: int, link: Link) -> float:
    """A ring reduce-scatter or all-gather of a buffer of ``n_bytes`` (the reduce-scatter's input, the
    all-gather's output) over ``p`` ranks: half a ring all-reduce, (p - 1)α + (p - 1)/p · n / B."""
    return ring_all_reduce_time(n_bytes, p, link.latency, link.bandwidth) / 2


def dp_communication(stage: int, shard_bytes: float, dp: int, link: Link, microbatches: int = 1,
                     fwd: float = 0.0, bwd: float = 0.0, overlap: float = OVERLAP_SHARE) -> dict:
    """Seconds of one step's data-parallel / ZeRO communication of a device holding ``shard_bytes``
    (Ψ_d: its 2-byte parameters or gradients) over ``dp`` ranks on ``link``, with ``microbatches`` of
    forward ``fwd`` and backward ``bwd`` seconds each (this device, its TP communication included):
    ``total_s``, ``exposed_s`` (on the step's critical path) and ``hidden_s`` = total - exposed.

    Volumes: Rajbhandari et al. 2020, section 7 (2Ψ stages 0-2, 3Ψ stage 3; per micro-batch where
    the stage shards what accumulation needs, see the module doc). Exposure: ``max(0, comm -
    overlap · window)`` for what travels during a compute window (Li et al. 2020, section 3.2.3;
    ``overlap`` in [0, 1] is the modelling assumption ``OVERLAP_SHARE``), in full for the rest."""
    check_stage(stage)
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be a share of the backward in [0, 1], got overlap {overlap!r}")
    if dp == 1:
        return {"total_s": 0.0, "exposed_s": 0.0, "hidden_s": 0.0}
    m, rs = microbatches, _ring_half(shard_bytes, dp, link)
    ag = rs  # same buffer, same ring
    if stage == 0:    # one all-reduce in the last micro-batch's backward
        total, exposed = 2 * rs, max(0.0, 2 * rs - overlap * bwd)
    elif stage == 1:  # reduce-scatter in the last backward, all-gather after the step
        total, exposed = rs + ag, max(0.0, rs - overlap * bwd) + ag
    elif stage == 2:  # a reduce-scatter in every backward, one all-gather after the step
        total, exposed = m * rs + ag, m * max(0.0, rs - overlap * bwd) + ag
    else:             # per micro-batch: all-gathers prefetched behind forward and backward, blocking reduce-scatter
        total = m * (2 * ag + rs)
        exposed = m * (max(0.0, ag - overlap * fwd) + max(0.0, ag - overlap * bwd) + rs)
    return {"total_s": total, "exposed_s": exposed, "hidden_s": total - exposed}


def step_time(model: memory.ModelConfig, cluster: Cluster, batch: int, dp: int, pp: int, tp: int,
              microbatches: int, schedule: str = "1f1b", virtual: int = 1, recompute: str = "none",
              zero: int = 0, overlap: float = OVERLAP_SHARE, ep: int = 1, cp: int = 1,
              split: tuple[int, ...] | None = None, ends: bool = False) -> dict:
    """Predicted seconds per step and its parts: ``compute_s``, ``tp_comm_s``, ``ep_comm_s``,
    ``cp_comm_s`` (exposed), ``bubble_s``, ``pp_comm_s``, ``dp_comm_s`` (exposed) and their sum
    ``step_s``; ``dp_hidden_s``: the DP/ZeRO communication hidden behind the backward (not in the
    sum). ``zero``: ZeRO stage 0-3 over the dp group; ``overlap``: the share of a backward gradient
    communication can use (0: none); ``ep``, ``cp``: expert and context parallel degrees (the world
    is dp·pp·cp·tp; ep within dp); ``split``: blocks per pipeline rank when not equal; ``ends``: the
    first rank carries the embedding, the head's rank the LM head and the loss (``rank_loads``; off:
    spread over every rank, the lessons' model). With either, compute, TP, EP and CP parts are the
    average rank's, and ``bubble_s`` the rest of the pipeline's makespan (its bubble and the waiting
    for the heavier ranks)."""
    base = _step_base(model, cluster, batch, dp, pp, tp, microbatches, schedule, virtual, recompute, ep, cp,
                      split, ends)
    return with_dp(base, zero, overlap)


def with_dp(base: dict, zero: int = 0, overlap: float = OVERLAP_SHARE) -> dict:
    """``step_time``'s parts from ``_step_base``'s (everything but the DP term) for one ZeRO stage."""
    dp = dp_communication(zero, base["shard_bytes"], base["dp"], base["dp_link"], base["microbatches"],
                          base["fwd"], base["bwd"], overlap)
    if base.get("expert_shard_bytes"):  # the experts' gradients over their own group, each against the window
        more = dp_communication(zero, base["expert_shard_bytes"], base["edp"], base["edp_link"],
                                base["microbatches"], base["fwd"], base["bwd"], overlap)
        dp = {k: dp[k] + more[k] for k in dp}
    parts = {k: base.get(k, 0.0) for k in STEP_PARTS[:-1]} | {"dp_comm_s": dp["exposed_s"]}
    parts["step_s"] = sum(parts.values())
    parts["dp_hidden_s"] = dp["hidden_s"]
    return parts


def _per_micro_batch(model, cluster, batch, dp, pp, tp, microbatches, recompute, ep, cp) -> tuple:
    """What ``_even_base`` and ``_step_base`` both start from (after checking EP and CP against the
    model): which links cross nodes, the micro-batch's rows ``b`` and positions ``s`` on a rank, the
    forward and backward compute of one micro-batch through the average rank's layers, the link
    latency, and ``bandwidth(dim)`` in bytes per second."""
    memory_model.check_ep_cp(model, dp, ep, cp)
    if ep == cp == 1:
        crosses = _crossings(dp, pp, tp, cluster.nodes, cluster.gpus_per_node)
    else:
        crosses = _crossings_ep_cp(dp, pp, cp, tp, ep, cluster.nodes, cluster.gpus_per_node)
    b = batch // (dp * microbatches)
    s = model.seq // cp  # positions on this rank
    if model.experts:
        flops = 6 * memory_model.active_param_count(model) * batch * model.seq
    else:
        flops = 6 * memory_model.param_count(model.layers, model.hidden, model.vocab, model.seq) * batch * model.seq
    per_device = flops / (dp * pp * tp * cp) / (cluster.tflops * 1e12)
    fwd = per_device / 3 / microbatches
    bwd = 2 * fwd + fwd * recompute_extra_forward(model, recompute)
    alpha = cluster.latency_us * 1e-6

    def bandwidth(dim):
        return (cluster.inter_gbps if crosses[dim] else cluster.intra_gbps) * 1e9

    return crosses, b, s, fwd, bwd, alpha, bandwidth


def _even_base(model, cluster, batch, dp, pp, tp, microbatches, schedule, virtual, recompute,
               ep: int = 1, cp: int = 1) -> dict:
    """``_step_base`` with equal ranks: the head's and the embedding's work spread over them all."""
    crosses, b, s, fwd, bwd, alpha, bandwidth = _per_micro_batch(model, cluster, batch, dp, pp, tp, microbatches,
                                                                 recompute, ep, cp)
    tp_fwd = tp_bwd = 0.0
    if tp > 1:
        one = ring_all_reduce_time(2 * b * s * model.hidden, tp, alpha, bandwidth("tp"))
        layers = model.layers // pp
        tp_fwd = layers * 2 * one
        tp_bwd = layers * (4 if recompute == "full" else 2) * one
        # the ends of the model, on the last stage (with pp 1 also the first): the LM head's input
        # gradient (one backward) and the vocab-parallel loss's max, sum of exponentials and target
        # logit (three forward, one fp32 value per token); the first stage's embedding sums its
        # partial lookups (one forward), no more than that
        per_token = ring_all_reduce_time(4 * b * s, tp, alpha, bandwidth("tp"))
        tp_fwd += 3 * per_token + (one if pp == 1 else 0.0)
        tp_bwd += one
    ep_fwd = ep_bwd = cp_fwd = cp_bwd = 0.0
    if ep > 1:  # two all-to-alls forward, two backward (two more when the forward is recomputed)
        half = ep_communication(model, b, tp, ep, cp, Link("ep", bandwidth("ep"), alpha)) / 2
        ep_fwd = model.layers // pp * half
        ep_bwd = model.layers // pp * half * (2 if recompute == "full" else 1)
    if cp > 1:
        ring_fwd, ring_bwd = cp_communication(model, b, tp, cp, Link("cp", bandwidth("cp"), alpha),
                                              cluster.tflops * 1e12)
        cp_fwd = model.layers // pp * ring_fwd
        cp_bwd = model.layers // pp * (ring_bwd + (ring_fwd if recompute == "full" else 0.0))
    fwd_all, bwd_all = fwd + tp_fwd + ep_fwd + cp_fwd, bwd + tp_bwd + ep_bwd + cp_bwd
    makespan = pipeline_makespan(schedule, pp, microbatches, virtual, fwd_all, bwd_all)
    # summed in this order so that dense plans' floats are what they were before EP and CP
    work = microbatches * (fwd + bwd + tp_fwd + tp_bwd + ep_fwd + ep_bwd + cp_fwd + cp_bwd)
    pp_comm = 0.0
    if pp > 1:
        message = 2 * b * s * model.hidden / tp
        pp_comm = 2 * microbatches * virtual * (alpha + message / bandwidth("pp"))
    head = memory_model.head_rank(schedule, pp)  # the V schedules' rank 0 holds the embedding and the head
    splits = {st: memory_model.stage_param_split(model, pp, tp, st, ep, None, head) for st in {0, pp - 1}}
    shard = max(dense for dense, _ in splits.values()) * 2  # middle stages hold less
    base = {"compute_s": microbatches * (fwd + bwd), "tp_comm_s": microbatches * (tp_fwd + tp_bwd),
            "bubble_s": makespan - work, "pp_comm_s": pp_comm, "dp": dp * cp, "microbatches": microbatches,
            "fwd": fwd_all, "bwd": bwd_all, "shard_bytes": shard,
            "dp_link": Link("dp", bandwidth("dp"), alpha)}
    if ep > 1 or cp > 1:
        base |= {"ep_comm_s": microbatches * (ep_fwd + ep_bwd), "cp_comm_s": microbatches * (cp_fwd + cp_bwd)}
    if model.experts:
        base |= {"expert_shard_bytes": 2 * splits[0][1], "edp": dp * cp // ep,
                 "edp_link": Link("edp", bandwidth("edp" if "edp" in crosses else "dp"), alpha)}
    return base


def rank_loads(model: memory.ModelConfig, pp: int, schedule: str = "1f1b",
               split: tuple[int, ...] | None = None) -> list[float]:
    """Per pipeline rank, its share of the step's compute against the average rank's (1.0 each when
    equal): its blocks, plus the embedding on rank 0 and the LM head on the head's rank (the last,
    rank 0 in the V schedules), each at 6 FLOPs per parameter and token as the whole model (the
    active parameters of a mixture of experts). ``split``: blocks per rank (default layers / pp)."""
    total = (memory_model.active_param_count(model) if model.experts
             else memory_model.param_count(model.layers, model.hidden, model.vocab, model.seq))
    embedding = (model.vocab + model.seq) * model.hidden
    head = model.vocab * model.hidden + 2 * model.hidden
    block = (total - embedding - head) / model.layers
    split = split or memory_model.even_split(model.layers, pp)
    last = memory_model.head_rank(schedule, pp)
    loads = [split[r] * block + (embedding if r == 0 else 0) + (head if r == last else 0) for r in range(pp)]
    return [x * pp / total for x in loads]


def _step_base(model, cluster, batch, dp, pp, tp, microbatches, schedule, virtual, recompute,
               ep: int = 1, cp: int = 1, split: tuple[int, ...] | None = None, ends: bool = False) -> dict:
    """Every term of ``step_time`` but the DP one, and what that one needs (the planner computes this
    once per micro-batching and adds each ZeRO stage's DP term with ``with_dp``). ``split``: blocks
    per pipeline rank when they are not equal (``memory_model.light_ends_split``); ``ends``: the
    embedding's and the head's work on their own ranks (``rank_loads``) instead of spread evenly."""
    if split is None and not ends:
        return _even_base(model, cluster, batch, dp, pp, tp, microbatches, schedule, virtual, recompute, ep, cp)
    crosses, b, s, fwd, bwd, alpha, bandwidth = _per_micro_batch(model, cluster, batch, dp, pp, tp, microbatches,
                                                                 recompute, ep, cp)
    split = split or memory_model.even_split(model.layers, pp)
    head = memory_model.head_rank(schedule, pp)

    # per-block communication, forward and backward, then each rank's from its blocks
    block_fwd = block_bwd = 0.0
    extra = [[0.0, 0.0] for _ in range(pp)]  # forward and backward communication at the ends
    if tp > 1:
        one = ring_all_reduce_time(2 * b * s * model.hidden, tp, alpha, bandwidth("tp"))
        block_fwd, block_bwd = 2 * one, (4 if recompute == "full" else 2) * one
        # the ends of the model: on the head's rank the LM head's input gradient (one backward) and
        # the vocab-parallel loss's max, sum of exponentials and target logit (three forward, one fp32
        # value per token); on rank 0 the embedding sums its partial lookups (one forward)
        per_token = ring_all_reduce_time(4 * b * s, tp, alpha, bandwidth("tp"))
        for r in [head] if ends else range(pp):  # without ``ends``: on every rank, as ``_even_base``
            extra[r][0] += 3 * per_token + (one if pp == 1 or (ends and r == 0) else 0.0)
            extra[r][1] += one
        if ends and head != 0:
            extra[0][0] += one
    ep_block = cp_block = (0.0, 0.0)
    if ep > 1:  # two all-to-alls forward, two backward (two more when the forward is recomputed)
        half = ep_communication(model, b, tp, ep, cp, Link("ep", bandwidth("ep"), alpha)) / 2
        ep_block = (half, half * (2 if recompute == "full" else 1))
    if cp > 1:
        ring_fwd, ring_bwd = cp_communication(model, b, tp, cp, Link("cp", bandwidth("cp"), alpha),
                                              cluster.tflops * 1e12)
        cp_block = (ring_fwd, ring_bwd + (ring_fwd if recompute == "full" else 0.0))
    loads = rank_loads(model, pp, schedule, split) if ends else [x * pp / model.layers for x in split]
    parts = {"compute": [], "tp": [], "ep": [], "cp": []}  # per rank, forward + backward of one micro-batch
    fwds, bwds = [], []
    for r in range(pp):
        c_f, c_b = fwd * loads[r], bwd * loads[r]
        t_f, t_b = split[r] * block_fwd + extra[r][0], split[r] * block_bwd + extra[r][1]
        e_f, e_b = split[r] * ep_block[0], split[r] * ep_block[1]
        x_f, x_b = split[r] * cp_block[0], split[r] * cp_block[1]
        parts["compute"].append(c_f + c_b)
        parts["tp"].append(t_f + t_b)
        parts["ep"].append(e_f + e_b)
        parts["cp"].append(x_f + x_b)
        fwds.append(c_f + t_f + e_f + x_f)
        bwds.append(c_b + t_b + e_b + x_b)
    if pp == 1 or max(fwds) - min(fwds) + max(bwds) - min(bwds) <= 1e-12 * (fwds[0] + bwds[0]):
        makespan = pipeline_makespan(schedule, pp, microbatches, virtual, fwds[0], bwds[0])
    else:
        makespan = uneven_makespan(schedule, pp, microbatches, virtual, fwds, bwds)
    mean = {k: microbatches * sum(v) / pp for k, v in parts.items()}  # the average rank's, per step
    work = mean["compute"] + mean["tp"] + mean["ep"] + mean["cp"]
    pp_comm = 0.0
    if pp > 1:
        message = 2 * b * s * model.hidden / tp
        pp_comm = 2 * microbatches * virtual * (alpha + message / bandwidth("pp"))
    splits = {st: memory_model.stage_param_split(model, pp, tp, st, ep, split[st], head) for st in {0, head, pp - 1}}
    shard = max(dense for dense, _ in splits.values()) * 2  # middle stages hold less
    base = {"compute_s": mean["compute"], "tp_comm_s": mean["tp"],
            "bubble_s": makespan - work, "pp_comm_s": pp_comm, "dp": dp * cp, "microbatches": microbatches,
            "fwd": sum(fwds) / pp, "bwd": sum(bwds) / pp, "shard_bytes": shard,
            "dp_link": Link("dp", bandwidth("dp"), alpha)}
    if ep > 1 or cp > 1:
        base |= {"ep_comm_s": mean["ep"], "cp_comm_s": mean["cp"]}
    if model.experts:
        base |= {"expert_shard_bytes": 2 * splits[0][1], "edp": dp * cp // ep,
                 "edp_link": Link("edp", bandwidth("edp" if "edp" in crosses else "dp"), alpha)}
    return base


def recompute_overhead(model: memory.ModelConfig | str, recompute: str, seq: int | None = None) -> float:
    """Extra compute of a training step with ``recompute``, as a fraction of the step without it
    (FLOPs of the transformer layers; a backward costs two forwards).

    A layer's forward is 24bsh^2 + 4bs^2h FLOPs (Narayanan et al. 2021), the step three times that.
    "full" runs every forward again: 1/3. "selective" (Korthikanti et al. 2022) recomputes only the
    attention core, QK^T and the product with V (4bs^2h): s / (3(6h + s)) -- ``recompute_extra_forward``
    over the three forwards' worth of a step, 0.9 % for GPT-3 175B. Korthikanti et al.'s own 2.7 % (App. A,
    eq. 9: about s/6h of an iteration) counts the core's forward and backward, 12bs^2h, three times this.
    """
    m = memory.MODELS[model] if isinstance(model, str) else model
    return recompute_extra_forward(m, recompute, seq) / 3


# ----------------------------------------------------------------------------------------------
# One tensor-parallel layer: why TP stays inside a node (lessons 02, 11 and 15, FAQ 6).


def layer_flops(tokens: int, hidden: int) -> float:
    """FLOPs of one transformer layer's forward matmuls: ``24·tokens·h²`` (the q, k, v and output
    projections 8·tokens·h², the MLP 16·tokens·h²; Narayanan et al. 2021, eq. 2, without the
    attention-score term 4·b·s²·h). The planner's 2 FLOPs per parameter and token add only the
    biases' and norms' 26·tokens·h, 0.01 % at h = 12288."""
    return 24 * tokens * hidden**2


def tp_layer_step(tokens: int, hidden: int, tp: int, link: Link, flops: float,
                  bytes_per_value: int = 2) -> tuple[float, float]:
    """``(compute_s, comm_s)`` of one layer's forward and backward on each of ``tp`` devices: the
    layer's FLOPs three times (a backward costs two forwards) shared by the devices at ``flops``
    each, against Megatron's four all-reduces of the ``tokens x hidden`` activation over ``link``
    (forward: g after attention and after the MLP; backward: f's two; none on one device). Sequence
    parallelism's all-gathers and reduce-scatters move the same bytes. This is the one computation
    behind lessons 02, 11 and 15's "TP stays inside the NVLink domain" (Shoeybi et al. 2019, section 3).

    Bandwidth-bound, comm / compute = (t - 1) · bytes_per_value · flops / (9 · hidden · bandwidth):
    independent of the tokens, growing with t and with the GPU's speed against its link."""
    compute = 3 * layer_flops(tokens, hidden) / tp / flops
    return compute, 4 * link.all_reduce(tokens * hidden * bytes_per_value, tp)


def tp_per_device_ratio(tp_a: int, tp_b: int) -> float:
    """How many times more TP all-reduce bytes per device per step ``tp_b`` costs than ``tp_a`` on the
    same GPUs with the same data parallelism and micro-batches (bandwidth-bound). With dp fixed,
    pp x tp is fixed: ``tp_b``'s pipeline is ``tp_b / tp_a`` times shallower, so each device holds
    that many times more layers, each all-reducing the same tokens x hidden activation, of which a
    ring sends 2(t-1)/t per device. Together: (tp_b - 1) / (tp_a - 1), 7/3 for TP 8 against TP 4."""
    return (tp_b * (tp_b - 1) / tp_b) / (tp_a * (tp_a - 1) / tp_a)


def across_nodes(model, cluster: Cluster, batch: int, dp: int, pp: int, tp: int, microbatches: int,
                 schedule: str = "zb-h1", recompute: str = "none") -> dict:
    """``step_time`` of a layout whose TP groups span nodes, which the planner refuses: the same model
    on nodes of ``tp`` devices whose links are only as fast as the network. Returns the breakdown."""
    wide = replace(cluster, nodes=cluster.world_size // tp, gpus_per_node=tp, intra_gbps=cluster.inter_gbps)
    return step_time(model, wide, batch, dp, pp, tp, microbatches, schedule, 1, recompute)
