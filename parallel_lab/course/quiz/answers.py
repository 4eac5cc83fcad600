"""Answers that the course computes instead of writing down: parametrised quiz items name one of
these functions and its parameters (``answer: {function: "parallel_lab.course.quiz.answers:bubble_fraction",
params: {schedule: gpipe, ranks: 4, microbatches: 8}}``), so the quiz, the lessons and the library
can never disagree.

Every function takes the quantities in the units its question states and returns a float. Each one
is a thin call into the module that teaches the idea:

- pipeline bubbles and activation memory: ``parallel_lab.pipeline.schedules`` + ``parallel_lab.pipeline.simulate``
  (lessons on pipeline parallelism);
- all-reduce bytes and time: ``parallel_lab.hardware.ring_all_reduce_time`` (lesson 01);
- training memory: ``parallel_lab.planning.memory`` (lesson 00); a plan's memory and time: ``planning.memory_model``
  and ``planning.cost`` (lesson 15); GPU-hours: ``planning.planner`` (lesson 16).
"""

from __future__ import annotations

from parallel_lab.context.cost import context_cost
from parallel_lab.hardware import PCIE4, ring_all_reduce_time
from parallel_lab.pipeline.schedules import MAX_MICROBATCHES, build
from parallel_lab.pipeline.search.api import search
from parallel_lab.pipeline.simulate import M_W_SHARE, Costs, simulate
from parallel_lab.planning import memory
from parallel_lab.planning.planner import training_cost
from parallel_lab.zero import memory as zero_memory
from parallel_lab.zero import traffic as zero_traffic

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "s": 1, "ms": 1e-3, "us": 1e-6}


def _timeline(schedule: str, ranks: int, microbatches: int, virtual: int, F: float, B: float,
              W: float | None, w_share: float = M_W_SHARE):
    costs = Costs(F=F, B=B) if W is None else Costs(F=F, B=B, I=B - W, W=W)
    return simulate(build(schedule, ranks, microbatches, virtual), costs, w_share=w_share)


def bubble_fraction(schedule: str, ranks: int, microbatches: int, virtual: int = 1,
                    F: float = 1.0, B: float = 2.0, W: float | None = None) -> float:
    """Idle share of the device-time box, ``1 - busy / (p * makespan)``, of the simulated schedule
    (F, B, W: per-microbatch costs of one stage; links free). GPipe and 1F1B: (p-1)/(m+p-1)."""
    return _timeline(schedule, ranks, microbatches, virtual, F, B, W).bubble_fraction


def searched_bubble(ranks: int, microbatches: int, max_activations: float, synchronised: bool = True,
                    placement: str = "wave") -> float:
    """The steady-state bubble of back-to-back steps of the schedule ``pipeline.search`` finds under
    ``max_activations`` (F = I = W = 1, free links): with the optimizer's global synchronisation
    every step lasts its makespan, without it its longest span (``problem.Judged.step``)."""
    found = search(ranks, microbatches, max_activations, placement)
    return found.judged.steady_bubble(synchronised)


def bubble_ratio(schedule: str, ranks: int, microbatches: int, virtual: int = 1,
                 F: float = 1.0, B: float = 2.0, W: float | None = None) -> float:
    """Idle time over compute time, the papers' ``t_bubble / t_ideal``: (p-1)/m for GPipe and 1F1B,
    (p-1)/(v*m) for interleaved 1F1B (Narayanan et al. 2021)."""
    f = bubble_fraction(schedule, ranks, microbatches, virtual, F, B, W)
    return f / (1.0 - f)


def peak_activations(schedule: str, ranks: int, microbatches: int, stage: int, virtual: int = 1,
                     w_share: float = M_W_SHARE) -> float:
    """Most microbatches' activations model stage ``stage`` holds at once, counted until W
    (1F1B: min(m, p-r); ZB-H1: (p-r) + r * w_share once m >= p, w_share = M_W / M_B)."""
    return _timeline(schedule, ranks, microbatches, virtual, 1.0, 2.0, None, w_share).peak_activations[stage]


def peak_rank_activations(schedule: str, ranks: int, microbatches: int, rank: int, virtual: int = 1) -> float:
    """Most microbatch-stages of activations rank ``rank`` keeps at once, over all its model stages."""
    return _timeline(schedule, ranks, microbatches, virtual, 1.0, 2.0, None).peak_rank_activations[rank]


def stage_loads_makespan(loads, microbatches: int, schedule: str = "1f1b", backward: float = 2.0) -> float:
    """Simulated step time (makespan, in the loads' time units) of ``schedule`` on ``len(loads)``
    stages whose forward costs are ``loads`` (a tuple, or "5, 2, 2, 6"; backward ``backward`` x
    forward), free links: the slowest stage sets the pace (lesson 09)."""
    loads = [float(x) for x in (loads.split(",") if isinstance(loads, str) else loads)]
    costs = Costs(F=loads, B=[backward * x for x in loads])
    return simulate(build(schedule, len(loads), int(microbatches)), costs).makespan


def recompute_makespan(schedule: str, ranks: int, microbatches: int, F: float = 1.0, B: float = 2.0) -> float:
    """The simulated step time (makespan) of ``schedule`` with full activation recomputation, F and B
    being the costs without it (free links): recomputation runs each stage's forward again inside its
    backward, so every B becomes F + B and nothing else changes (lesson 08). For GPipe and 1F1B with
    equal stages that is (m + p - 1)(2F + B)."""
    return simulate(build(schedule, ranks, microbatches), Costs(F=F, B=F + B)).makespan


def microbatches_for_bubble(schedule: str, ranks: int, max_bubble: float) -> float:
    """The fewest microbatches whose simulated bubble fraction is at most ``max_bubble``."""
    step = ranks if schedule == "interleaved-1f1b" else 1  # interleaving needs m % p == 0
    for m in range(step, MAX_MICROBATCHES + 1, step):
        if bubble_fraction(schedule, ranks, m, 2 if schedule == "interleaved-1f1b" else 1) <= max_bubble + 1e-9:
            return float(m)
    raise ValueError(f"{schedule} on {ranks} ranks does not reach bubble {max_bubble} "
                     f"within {MAX_MICROBATCHES} microbatches")


def ring_all_reduce_sent(size: float, ranks: int) -> float:
    """Data each rank sends in a ring all-reduce of ``size`` (any unit; the same unit back):
    2(p-1)/p * size. It is the α–β model's time with α = 0 and a bandwidth of one unit per second."""
    return ring_all_reduce_time(size, ranks, alpha_s=0.0, bandwidth_bytes_per_s=1.0)


def all_reduce_time(megabytes: float, ranks: int, alpha_us: float, bandwidth_gb_s: float,
                    unit: str = "us") -> float:
    """α–β time of a ring all-reduce of ``megabytes`` MB on ``ranks`` ranks, in ``unit``."""
    seconds = ring_all_reduce_time(megabytes * 1e6, ranks, alpha_us * 1e-6, bandwidth_gb_s * 1e9)
    return seconds / UNITS[unit]


def tensor_megabytes(*shape: int, bytes_per_value: int = 2) -> float:
    """Size in MB (10^6 bytes) of a tensor of this shape."""
    n = bytes_per_value
    for d in shape:
        n *= d
    return n / 1e6


def tp_all_reduce_time(batch: int, seq: int, hidden: int, tp: int, bandwidth_gb_s: float,
                       bytes_per_value: int = 2, unit: str = "ms") -> float:
    """Time of one tensor-parallel all-reduce of the activations (batch, seq, hidden), no latency."""
    return all_reduce_time(tensor_megabytes(batch, seq, hidden, bytes_per_value=bytes_per_value),
                           tp, 0.0, bandwidth_gb_s, unit)


def model_state_gb(billions: float, precision: str = "mixed") -> float:
    """GB (10^9 bytes) of weights + gradients + Adam state for ``billions`` × 10^9 parameters."""
    return sum(memory.model_state(billions * 1e9, precision).values()) / memory.GB


def min_gpus(billions: float, gpu: str = "H100 80GB", precision: str = "mixed") -> float:
    """Fewest GPUs that can hold the model state of ``billions`` × 10^9 parameters, split evenly."""
    return float(memory.min_devices(billions * 1e9, gpu, precision))


def gpu_hours(step_s: float, gpus: int, tokens_billions: float, batch: int, seq: int) -> float:
    """GPU-hours of a training run: steps = tokens / (batch x seq), each ``step_s`` on ``gpus``
    devices (``planning.planner.training_cost``'s arithmetic)."""
    row = {"global_batch": batch, "seq": seq, "step_s": step_s, "world_size": gpus}
    return training_cost(row, tokens_billions * 1e9, 0.0)["gpu_hours"]


def run_gpu_hours(steps: int, step_s: float, gpus: int) -> float:
    """GPU-hours of ``steps`` steps of ``step_s`` seconds on ``gpus`` devices (every GPU is paid for
    the whole run; the capstone)."""
    return steps * step_s * gpus / 3600


def device_memory_gb(model: str, dp: int, pp: int, tp: int, microbatches: int, schedule: str = "1f1b",
                     recompute: str = "none", sequence_parallel: bool = True, micro_batch: int = 1) -> float:
    """GB (10^9 bytes) on the fullest GPU of a plan for ``memory.MODELS[model]``: weights, gradients,
    Adam state and activations (``planning.memory_model.max_device_memory``, lesson 15)."""
    from parallel_lab.planning import memory_model

    row = memory_model.max_device_memory(memory.MODELS[model], micro_batch=micro_batch, dp=dp, pp=pp, tp=tp,
                                         sequence_parallel=sequence_parallel, schedule=schedule,
                                         microbatches=microbatches, recompute=recompute)
    return row["total"] / 1e9


def layer_activation_mb(seq: int, hidden: int, heads: int, tp: int, micro_batch: int = 1,
                        sequence_parallel: bool = True, recompute: str = "selective") -> float:
    """MB (10^6 bytes) of activations one transformer layer keeps for one micro-batch on one GPU, 2-byte
    values with dropout (``planning.memory_model.activation_bytes_per_layer``, Korthikanti et al. 2022;
    lesson 15)."""
    from parallel_lab.planning import memory_model

    return memory_model.activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, sequence_parallel,
                                                   recompute) / 1e6


def exposed_dp_seconds(comm_s: float, backward_s: float) -> float:
    """Seconds a data-parallel all-reduce of ``comm_s`` adds to a step when it can travel only during the
    last micro-batch's backward of ``backward_s`` (no ZeRO; ``planning.cost.dp_communication``'s
    exposure, with the cost model's ``OVERLAP_SHARE``; lesson 15)."""
    from parallel_lab.planning import cost

    return max(0.0, comm_s - cost.OVERLAP_SHARE * backward_s)


def zero_model_state_gb(billions: float, dp: int, stage: int, value_bytes: float = 2,
                        adam_bytes: float = 12, part: str = "total") -> float:
    """GB (10^9 bytes) of model state on one of ``dp`` data-parallel ranks under ZeRO ``stage``
    (Rajbhandari et al. 2020, Figure 1: 2Ψ + 2Ψ + KΨ, K = 12 in mixed precision; lesson 12).
    ``part``: ``parameters``, ``gradients``, ``optimizer`` or ``total``."""
    row = zero_memory.per_rank(billions * 1e9, dp, stage, value_bytes=value_bytes, adam_bytes=adam_bytes)
    return row[part] / 1e9


def zero_traffic_per_step(stage: int, params: float = 1.0, dp: int = 8) -> float:
    """Values moved per rank and step under ZeRO ``stage``, in units of Ψ when ``params`` is 1
    (Rajbhandari et al. 2020, section 7: 2Ψ for stages 0-2, 3Ψ for stage 3; lesson 12)."""
    return zero_traffic.per_step(params, dp, stage, value_bytes=1)["volume"]


def context_score_bytes(variant: str, batch: int, seq: int, heads: int, cp: int, dtype_bytes: int = 2,
                        hidden: int | None = None) -> float:
    """Bytes of the largest attention-score tensor one rank of ``cp`` holds at once, ``variant``
    "ring" (one block, ``batch·heads·(seq/cp)²``) or "ulysses" (``batch·(heads/cp)·seq²``)
    (``context.cost.context_cost``, lesson 14)."""
    hidden = heads if hidden is None else hidden
    return float(context_cost(variant, batch=batch, seq=seq, hidden=hidden, heads=heads, cp=cp, link=PCIE4,
                              dtype_bytes=dtype_bytes).score_peak_bytes)


def context_bytes_sent(variant: str, batch: int, seq: int, hidden: int, heads: int, cp: int,
                       dtype_bytes: int = 2, unit: str = "B") -> float:
    """Bytes one rank sends in one forward and backward of an attention layer under ``variant``
    (``context.cost.context_cost``, lesson 14), in ``unit``."""
    c = context_cost(variant, batch=batch, seq=seq, hidden=hidden, heads=heads, cp=cp, link=PCIE4,
                     dtype_bytes=dtype_bytes)
    return c.bytes_sent / UNITS[unit]


def context_messages(variant: str, cp: int) -> float:
    """Messages one rank sends per forward and backward under ``variant`` (lesson 14): ring
    ``2(cp-1) + cp`` (K/V twice around, the dK/dV accumulators once), Ulysses ``4(cp-1)``."""
    return float(context_cost(variant, batch=1, seq=2 * cp, hidden=cp, heads=cp, cp=cp, link=PCIE4).messages)


def moe_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> float:
    """Assignments one expert takes: ceil(capacity_factor * tokens * top_k / experts)
    (``models.expert_capacity``, Switch's capacity factor; lesson 13)."""
    from parallel_lab import models

    return float(models.expert_capacity(tokens, experts, top_k, capacity_factor))


def moe_dropped(experts: int = 8, top_k: int = 2, capacity_factor: float = 1.0, batch: int = 8, seq: int = 8,
                seed: int = 0) -> float:
    """Assignments ``models.MoE`` drops on lesson 13's batch (``moe.run.Case``: batch x seq tokens,
    hidden 16, the seeded router), computed by running the dense layer on one process."""
    from parallel_lab.moe.run import Case, reference

    case = Case(experts=experts, top_k=top_k, capacity_factor=capacity_factor, batch=batch, seq=seq, seed=seed)
    return float(reference(case)["dropped"])


def all_to_all_sent(size: float, ranks: int) -> float:
    """What each rank sends in an all-to-all of ``size`` (any unit) per rank: (N-1)/N of it
    (``moe.cost.all_to_all_sent_bytes``, lesson 13)."""
    from parallel_lab.moe.cost import all_to_all_sent_bytes

    return all_to_all_sent_bytes(size, ranks)
