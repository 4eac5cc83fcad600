"""Choosing a 3D-parallel plan: search (dp, pp, tp, ZeRO stage, micro-batches, schedule, recomputation)
under the memory limit and rank the survivors by predicted step time.

    >>> from parallel_lab.planning import planner
    >>> result = planner.plan_from_args(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048,
    ...                                 batch=1536, nodes=64, gpus_per_node=8, gpu_mem_gb=80)
    >>> [(p["tp"], p["pp"], p["dp"], p["zero"], p["schedule"], p["recompute"]) for p in result["plans"][:3]]
    [(4, 4, 32, 2, 'interleaved-1f1b', 'selective'), (4, 4, 32, 1, 'interleaved-1f1b', 'selective'),
     (4, 4, 32, 1, 'zb-h1', 'selective')]
    >>> result = planner.plan_from_args(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048,
    ...                                 batch=1536, nodes=64, gpus_per_node=8, gpu_mem_gb=80, top=None)
    >>> best_tp8 = min(p["step_s"] for p in result["plans"] if p["tp"] == 8)
    >>> round(best_tp8 / result["plans"][0]["step_s"], 2)   # TP 8 (a whole node): 4% behind
    1.04
    >>> next(r["reason"] for r in result["rejected"] if r["plan"]["tp"] == 16)
    'tp 16 > devices_per_node 8: tensor parallel groups would cross nodes'

GPT-3 175B on 64 DGX H100 nodes (8 GPUs of 80 GB; the defaults, ``hardware.SYSTEMS``) with GPT-3's
batch (1536 sequences of 2048 tokens), every schedule with a closed form and the embedding and LM
head priced on the ranks that run them (the defaults, ``SCHEDULES`` and ``ENDS``): tensor parallelism
stays inside a node; a shallow pipeline (PP 4) with ZeRO over dp 32 and interleaving comes first,
the ten fastest within 1 %. ZeRO-3 makes even pure data parallelism fit (with full recomputation)
and loses by about 67 %: its 3Ψ per step crosses the network (Narayanan et al. 2021, §5.2 and
Table 2, measured PTD-P ahead of ZeRO-3 by 6 % at 384 GPUs and 3.2x at 1536 for GPT-3 175B, the 70 %
of their text being the lead after doubling the GPUs at the same batch). On 64 DGX A100 nodes with
1F1B (Megatron-LM's 2021 hardware and schedule, Narayanan et al.) TP 8 comes first, as in the paper:
an H100 computes 3.2x faster than an A100 but its NVLink is only 1.5x faster, so each all-reduce
costs more compute time and a deeper pipeline with less TP pays off.

Mixtures of experts and long sequences: a model with ``experts`` searches the expert-parallel
degree ``ep`` too (every divisor of E that divides dp: EP groups are carved out of the
data-parallel group, Rajbhandari et al. 2022, "DeepSpeed-MoE"), and ``cp`` (context parallelism,
ring attention) is searched when asked (``cp=(1, 2, 4, 8)``) or by default for sequences longer
than ``LONG_SEQ``; then dp·pp·cp·tp = the world. Plans carry ``ep`` and ``cp`` (1 when unused).

The time of each plan is ``parallel_lab.planning.cost.step_time`` (every term is printed in its
``breakdown``); memory comes from ``parallel_lab.planning.memory_model`` (Korthikanti et al.
activations, in-flight micro-batches from the simulator, model state sharded by the ZeRO stage).
"""

from __future__ import annotations

from dataclasses import asdict

from parallel_lab.checks import positive_int
from parallel_lab.hardware import Cluster
from parallel_lab.i18n import N_, _, pad
from parallel_lab.pipeline.schedules import MAX_STAGES
from parallel_lab.planning import memory, memory_model
from parallel_lab.planning.cost import CLOSED_FORMS, OVERLAP_SHARE, _step_base, with_dp
from parallel_lab.runtime import mesh
from parallel_lab.zero.memory import STAGES as ZERO_STAGES
from parallel_lab.zero.memory import check_stage

# The schedules the planner searches by default: every one whose closed form cost.py holds equal to
# the simulator, the V schedules ZB-V and DualPipeV (two stages per rank, m >= 2 pp) included: a
# planner that leaves them out cannot say when they win. ONE_STAGE_PER_RANK leaves them out.
ALL_SCHEDULES = CLOSED_FORMS
SCHEDULES = ALL_SCHEDULES
ONE_STAGE_PER_RANK = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
# The ends are priced where they run by default (ENDS): the course's stages (pipeline.stages.cut) and
# Megatron-LM put the embedding on the first stage and the LM head and loss on the last, so spreading
# their work over every rank (ends=False) predicts a step no real pipeline reaches -- for GPT-3 175B
# on 512 GPUs, TP 2 x PP 32 (the even model's best, 18.05 s) takes 19.86 s with its head on the last
# rank, slower than the best plan the ends-aware search finds (tests/test_planner_schedules.py).
ENDS = True
V_SCHEDULES = memory_model.V_SCHEDULES
RECOMPUTE = memory_model.RECOMPUTE
VIRTUAL = (2, 3, 4)  # model chunks per rank tried for interleaved 1F1B
GPT3_TOKENS = 300e9  # tokens GPT-3 was trained on (Brown et al. 2020), the default for costs
# Longer sequences search context parallelism by default (the powers of two up to a node that divide
# seq): 32k is where Llama 3 turned context parallelism on (Dubey et al. 2024, section 3.3.2).
LONG_SEQ = 32768
GB = memory.GB

# Why the planner rejects a candidate: a rejection row carries its ``kind`` (a key of REASONS) and the
# ``values`` of its message; REASONS gives the kind's group (what a summary counts) and its message,
# English here (the row's ``reason``) and translated where it is shown (``reason_text``).
REASONS = {
    "tp-over-node": (N_("TP group would cross nodes"), mesh.TP_OVER_NODE),
    "tp-splits-node": (N_("TP group would cross nodes"), mesh.TP_SPLITS_NODE),
    "heads-tp": (N_("heads or width do not split by tp"), N_("heads {heads} % tp {tp} != 0")),
    "hidden-tp": (N_("heads or width do not split by tp"), N_("hidden {hidden} % tp {tp} != 0")),
    "layers-pp": (N_("layers do not split into pp equal stages"), N_("layers {layers} % pp {pp} != 0")),
    "layers-pp-ends": (N_("layers do not split into pp equal stages"),
                       N_("layers {layers} % pp {pp} != 0 (and no split with lighter end ranks)")),
    "pp-cap": (N_("more stages than the simulator handles"), N_("pp {pp} > {cap}, the schedule simulator's cap")),
    "batch-dp": (N_("batch does not split into dp replicas"), N_("batch {batch} % dp {dp} != 0")),
    "ep-dp": (N_("ep does not divide dp"), N_("dp {dp} % ep {ep} != 0: expert parallel groups are carved out of "
                                              "the data-parallel group")),
    "interleaved-m": (N_("interleaving needs m % pp == 0"),
                      N_("{schedule} needs microbatches % pp {pp} == 0; batch / dp = {rows} has no such divisor")),
    "v-m": (N_("V schedules need m >= 2 pp"),
            N_("{schedule} needs microbatches >= 2 pp = {need}; batch / dp = {rows} has no such divisor")),
    "memory": (N_("does not fit in memory"),
               N_("needs {need_gb:.1f} GB > {limit_gb:g} GB (ZeRO-{zero}, stage {stage}; the lightest of every "
                  "micro-batching tried: {microbatches} x {micro_batch} sequences)")),
}


def rejection(plan: dict, kind: str, **values) -> dict:
    """A rejected candidate: ``{"plan", "kind", "values", "reason"}``, the reason in English (the
    command line's JSON); ``reason_text`` says it in the language of the moment."""
    return {"plan": plan, "kind": kind, "values": values, "reason": REASONS[kind][1].format(**values)}


def reason_text(row: dict) -> str:
    """A rejection's reason in this process's language, made from its kind and values."""
    return _(REASONS[row["kind"]][1]).format(**row["values"])


def reason_group(row: dict) -> str:
    """The English name of a rejection's group (``_()`` translates it): the kinds a summary counts together."""
    return REASONS[row["kind"]][0]


# ----------------------------------------------------------------------------------------------
# The search.


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _structural_reason(model, cluster, batch, dp, pp, tp, cp=1, ends=False) -> tuple[str, dict] | None:
    """Why (dp, pp, tp, cp) cannot work at all, whatever the schedule: ``(kind, values)`` of a
    ``REASONS`` entry, or None if it can. dp x cp x pp x tp is the world, so of the mesh's checks
    (``mesh.ParallelDims``) only a TP group across nodes can fail."""
    crossing = mesh.tp_crossing(tp, cluster.gpus_per_node)
    if crossing:
        message, values = crossing
        return ("tp-over-node" if message == mesh.TP_OVER_NODE else "tp-splits-node"), values
    if model.heads % tp:
        return "heads-tp", {"heads": model.heads, "tp": tp}
    if model.hidden % tp:
        return "hidden-tp", {"hidden": model.hidden, "tp": tp}
    if model.layers % pp and not (ends and memory_model.light_ends_split(model.layers, pp)):
        return ("layers-pp-ends" if ends else "layers-pp"), {"layers": model.layers, "pp": pp}
    if pp > MAX_STAGES:
        return "pp-cap", {"pp": pp, "cap": MAX_STAGES}
    if batch % dp:
        return "batch-dp", {"batch": batch, "dp": dp}
    return None


def _variants(model, pp, schedules):
    """(schedule, virtual) pairs worth trying; with pp 1 every schedule is gradient accumulation,
    listed once as 1f1b. When pp does not divide the layers only the one-stage-per-rank schedules
    remain (with lighter end ranks: ``memory_model.light_ends_split``)."""
    if pp == 1:
        plain = [name for name in schedules if name not in ("interleaved-1f1b", *V_SCHEDULES)] or ["1f1b"]
        return [("1f1b" if "1f1b" in plain else plain[0], 1)] if schedules else []
    out = []
    for name in schedules:
        if name == "interleaved-1f1b":
            out += [(name, v) for v in VIRTUAL if model.layers % (pp * v) == 0]
        elif name in V_SCHEDULES:
            out += [(name, 2)] if model.layers % (2 * pp) == 0 else []
        elif model.layers % pp == 0 or name in ("gpipe", "1f1b", "zb-h1"):
            out.append((name, 1))
    return out


def _choose_microbatches(model, cluster, batch, layout: dict, zeros, sp: bool, overlap: float,
                         ends: bool = False) -> list[dict]:
    """For one layout (dp, pp, tp, schedule, virtual, recompute), per ZeRO stage in ``zeros`` the plan
    row with the number of micro-batches that is fastest and fits, or a rejection ``{"plan",
    "kind", "values", "reason"}`` (``rejection``). The terms that do not depend on the stage are computed
    once per micro-batching."""
    dp, pp, tp = layout["dp"], layout["pp"], layout["tp"]
    ep, cp = layout.get("ep", 1), layout.get("cp", 1)
    schedule, virtual, rc = layout["schedule"], layout["virtual"], layout["recompute"]
    split = tuple(layout["split"]) if layout.get("split") else None
    counts = [m for m in _divisors(batch // dp) if (schedule != "interleaved-1f1b" or m % pp == 0)
              and (schedule not in V_SCHEDULES or m >= 2 * pp)]
    if not counts:
        if schedule == "interleaved-1f1b":
            return [rejection(layout, "interleaved-m", schedule=schedule, pp=pp, rows=batch // dp)]
        return [rejection(layout, "v-m", schedule=schedule, need=2 * pp, rows=batch // dp)]
    bases = {m: _step_base(model, cluster, batch, dp, pp, tp, m, schedule, virtual, rc, ep, cp, split, ends)
             for m in counts}
    rows = []
    for zero in zeros:
        times = {m: with_dp(bases[m], zero, overlap) for m in counts}
        lightest = None
        for m in sorted(counts, key=lambda m: (times[m]["step_s"], m)):  # fastest first; memory only as needed
            b = batch // (dp * m)
            mem = memory_model.max_device_memory(model, micro_batch=b, dp=dp, pp=pp, tp=tp, sequence_parallel=sp,
                                                  schedule=schedule, microbatches=m, virtual=virtual,
                                                  recompute=rc, zero=zero, ep=ep, cp=cp, split=split)
            if mem["total"] <= cluster.gpu_mem_gb * GB:
                t = times[m]
                parts = ("weights", "gradients", "optimizer", "buffers", "activations") + ("scores",) * (cp > 1)
                rows.append(layout | {
                    "zero": zero, "microbatches": m, "micro_batch": b, "sequence_parallel": sp,
                    "step_s": t["step_s"], "memory_gb": mem["total"] / GB,
                    "breakdown": {k: v for k, v in t.items() if k != "step_s"},
                    "memory": {k: mem[k] / GB for k in parts} | {"stage": mem["stage"], "in_flight": mem["in_flight"]},
                    "global_batch": batch, "seq": model.seq, "world_size": dp * pp * tp * cp, "ep": ep, "cp": cp})
                break
            if lightest is None or mem["total"] < lightest[0]["total"]:
                lightest = (mem, m, b)
        else:
            mem, m, b = lightest
            rows.append(rejection(layout | {"zero": zero, "microbatches": m, "micro_batch": b}, "memory",
                                  need_gb=mem["total"] / GB, limit_gb=cluster.gpu_mem_gb, zero=zero,
                                  stage=mem["stage"], microbatches=m, micro_batch=b))
    return rows


def _degrees(model, cluster, ep, cp) -> tuple[tuple, tuple]:
    """The ep and cp degrees to search (defaults: every divisor of E that divides the world; cp 1,
    or the powers of two up to a node that divide seq for sequences over ``LONG_SEQ``), each checked
    against the model and the world: a ValueError naming the broken invariant, before any search."""
    world = cluster.world_size
    if ep is None:
        ep = tuple(e for e in _divisors(model.experts) if world % e == 0) if model.experts else (1,)
    if cp is None:
        cp = (1,) if model.seq <= LONG_SEQ else tuple(
            c for c in (2**i for i in range(world.bit_length())) if c <= cluster.gpus_per_node
            and world % c == 0 and model.seq % c == 0)
    eps, cps = tuple(positive_int("ep", e) for e in ep), tuple(positive_int("cp", c) for c in cp)
    if not eps or not cps:
        raise ValueError(f"ep and cp must each name at least one degree, got ep {eps}, cp {cps}")
    for e in eps:
        memory_model.check_ep_cp(model, e, e, 1)  # ep | E, and a dense model only ep 1
        if world % e:
            raise ValueError(f"world_size {world} % ep {e} != 0: expert parallel groups are carved out "
                             f"of the data-parallel group, so ep must divide dp")
    for c in cps:
        memory_model.check_ep_cp(model, 1, 1, c)  # cp | seq
        if world % c:
            raise ValueError(f"world_size {world} % cp {c} != 0: dp x pp x cp x tp must be the world")
    return eps, cps


def plan(model: memory.ModelConfig, cluster: Cluster, batch: int, *, schedules=SCHEDULES,
         recompute=RECOMPUTE, zero=ZERO_STAGES, zero1: bool = False, overlap: float = OVERLAP_SHARE,
         sequence_parallel: bool = True, top: int | None = None, ep=None, cp=None, ends: bool = ENDS) -> dict:
    """Rank every plan that fits; say why the others do not.

    For each (dp, pp, tp) with ``dp * pp * tp`` = all devices, each schedule (and chunk count for
    interleaved 1F1B), each recomputation and each ZeRO stage in ``zero`` (only 0 where dp is 1:
    there is nothing to shard over; ``zero1=True`` is the older spelling of ``zero=(1,)``), the
    number of micro-batches m (a divisor of ``batch / dp``) with the shortest predicted step that
    fits in memory is kept. ``overlap``: the share of a backward that DP/ZeRO communication can hide
    behind (``cost.OVERLAP_SHARE``; 0: none). Returns ``{"plans": [...fastest first...],
    "rejected": [{"plan": {...}, "kind", "values", "reason": "..."}], "feasible", "considered"}`` (a
    rejection's reason in English, ``reason_text`` in the language of the moment); a plan has ``dp,
    pp, tp, ep, cp, zero, microbatches, micro_batch, schedule, virtual, recompute, sequence_parallel,
    step_s, memory_gb, breakdown, memory``. A layout that cannot work at all is rejected once,
    without schedule; a memory rejection (per ZeRO stage) quotes the lightest micro-batching tried.
    Sequence parallelism is used whenever tp > 1 (same traffic, less memory).

    ``ep``: expert-parallel degrees to try (default: every divisor of ``model.experts`` that divides
    the world; 1 for a dense model), each within dp; ``cp``: context-parallel degrees (default 1, or powers of two up to
    a node for ``model.seq`` > ``LONG_SEQ``), with dp·pp·cp·tp the world. Layouts then carry ``ep``
    and ``cp`` in their rejections too.

    ``schedules``: every closed form by default (``SCHEDULES``: GPipe, 1F1B, interleaved 1F1B, ZB-H1,
    ZB-V, DualPipeV); ``ONE_STAGE_PER_RANK`` leaves out the V schedules. ``ends`` (default ``ENDS``,
    True): the cost model puts the embedding on the first rank and the LM head on its own rank (the
    last, or rank 0 in the V schedules; ``cost.rank_loads``), where the runtime runs them, and a pp
    that does not divide the layers is planned with lighter end ranks (``split``: blocks per rank,
    ``memory_model.light_ends_split``); ``ends=False`` spreads their work evenly over every rank, for
    comparison.
    """
    positive_int("batch", batch)  # sequences per step
    for name in schedules:
        if name not in ALL_SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}; the planner knows {', '.join(ALL_SCHEDULES)}")
    for name in recompute:
        memory_model.check_recompute(name)
    zeros = (1,) if zero1 else tuple(check_stage(z) for z in zero)
    if not zeros:
        raise ValueError("zero must name at least one ZeRO stage (0-3)")
    eps, cps = _degrees(model, cluster, ep, cp)
    tagged = bool(model.experts) or cps != (1,)  # layouts name ep and cp when either is searched
    world = cluster.world_size
    plans, rejected, considered = [], [], 0
    for c in cps:
        for tp in _divisors(world // c):
            for pp in _divisors(world // (c * tp)):
                dp = world // (c * tp * pp)
                considered += 1
                shape = {"dp": dp, "pp": pp, "tp": tp} | ({"ep": 1, "cp": c} if tagged else {})
                reason = _structural_reason(model, cluster, batch, dp, pp, tp, c, ends)
                if reason:
                    rejected.append(rejection(shape, reason[0], **reason[1]))
                    continue
                stages = zeros if dp * c > 1 else (min(zeros),)
                for e in eps:
                    if dp % e:
                        rejected.append(rejection(shape | {"ep": e}, "ep-dp", dp=dp, ep=e))
                        continue
                    for schedule, virtual in _variants(model, pp, schedules):
                        for rc in recompute:
                            considered += len(stages)
                            layout = {"dp": dp, "pp": pp, "tp": tp} | ({"ep": e, "cp": c} if tagged else {}) | {
                                "schedule": schedule, "virtual": virtual, "recompute": rc}
                            if model.layers % pp:  # (with ``ends``) blocks per rank, the first and last lighter
                                layout["split"] = list(memory_model.light_ends_split(model.layers, pp))
                            for row in _choose_microbatches(model, cluster, batch, layout, stages,
                                                            sequence_parallel and tp > 1, overlap, ends):
                                (rejected if "kind" in row else plans).append(row)
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
                   gpus_per_node: int, gpu_mem_gb: float, intra_gbps: float = 450.0, inter_gbps: float = 50.0,
                   tflops: float = 395.6, latency_us: float = 5.0, price: float | None = None,
                   tokens: float = GPT3_TOKENS, top: int = 10, zero1: bool = False, zero=ZERO_STAGES,
                   overlap: float = OVERLAP_SHARE, experts: int = 0, top_k: int = 2, ep=None,
                   cp=None, schedules=SCHEDULES, ends: bool = ENDS) -> dict:
    """The ``parallel-lab plan --json`` object: ``plan()`` for these sizes, the ``top`` fastest plans,
    each with ``cost`` (``training_cost`` for ``tokens``) when ``price`` ($ per GPU-hour) is given.
    ``experts`` E > 0 with ``top_k``: a mixture of experts in every block; ``ep``, ``cp``: the
    degrees to search (``plan``'s defaults when None); ``schedules``, ``ends``: as ``plan``."""
    model = memory.ModelConfig("custom", layers, hidden, heads, vocab, seq, experts, top_k)
    cluster = Cluster(nodes, gpus_per_node, gpu_mem_gb, intra_gbps, inter_gbps, tflops, latency_us)
    result = plan(model, cluster, batch, zero=zero, zero1=zero1, overlap=overlap, top=top, ep=ep, cp=cp,
                  schedules=tuple(schedules), ends=ends)
    if price is not None:
        for row in result["plans"]:
            row["cost"] = training_cost(row, tokens, price)
    result["model"] = {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq": seq,
                       "params": memory_model.param_count(layers, hidden, vocab, seq, experts)}
    if experts:
        result["model"] |= {"experts": experts, "top_k": top_k,
                            "active_params": memory_model.active_param_count(model)}
    result["cluster"] = asdict(cluster)
    result["batch"] = batch
    return result


def format_plans(result: dict, top: int = 5, rejected: int = 5) -> str:
    """A text table of the fastest plans and a few rejections (the CLI's output without --json), in
    the language of the moment."""
    wide = any(p.get("ep", 1) > 1 or p.get("cp", 1) > 1 for p in result["plans"][:top])  # EP/CP columns
    lines = [f"{'dp':>4} {'pp':>3} {'tp':>3} {'zero':>4} {'m':>5} {'b':>3} {pad(_('schedule'), 18)} "
             f"{pad(_('recompute'), 9)} {pad(_('step s'), 8, '>')} {pad(_('DP exp.'), 8, '>')} "
             f"{pad(_('hidden'), 7, '>')} {'GB':>6}" + (f" {'ep':>3} {'cp':>3}" if wide else "")]
    for p in result["plans"][:top]:
        name = p["schedule"] + (f" (v={p['virtual']})" if p["virtual"] > 1 else "")
        lines.append(f"{p['dp']:>4} {p['pp']:>3} {p['tp']:>3} {p['zero']:>4} {p['microbatches']:>5} "
                     f"{p['micro_batch']:>3} {name:<18} {p['recompute']:<9} {p['step_s']:>8.2f} "
                     f"{p['breakdown']['dp_comm_s']:>8.2f} {p['breakdown']['dp_hidden_s']:>7.2f} {p['memory_gb']:>6.1f}"
                     + (f" {p['ep']:>3} {p['cp']:>3}" if wide else ""))
    lines.append(_("{feasible} plans fit; {rejected} rejected, e.g.:").format(feasible=result["feasible"],
                                                                         rejected=len(result["rejected"])))
    for r in result["rejected"][:rejected]:
        lines.append(f"  {r['plan']}: {reason_text(r)}")
    return "\n".join(lines)
