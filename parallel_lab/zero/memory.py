"""Model-state memory per data-parallel rank under ZeRO stages 0-3: the formulas, pure arithmetic.

    from parallel_lab.zero import memory
    memory.per_rank(7.5e9, dp=64, stage=3, value_bytes=2, adam_bytes=12)["total"]   # 1.875e9 bytes
    memory.per_rank(214_368, dp=4, stage=2, value_bytes=8, unit=50_112)          # the course GPT, fp64

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
section 5 and Figure 1: Ψ parameters trained with Adam in mixed precision keep 2Ψ bytes of fp16
parameters, 2Ψ of fp16 gradients and KΨ of optimizer state (K = 12: fp32 master weights, momentum
and variance). Over N data-parallel ranks

    stage 0 (plain DP)            (2 + 2 + K) Ψ           every rank holds everything
    stage 1 (P_os)                 2Ψ + 2Ψ + KΨ/N         optimizer state sharded
    stage 2 (P_os+g)               2Ψ + (2 + K)Ψ/N        + gradients sharded (reduce-scatter)
    stage 3 (P_os+g+p)             (2 + 2 + K)Ψ/N          + parameters sharded (all-gather per use)

With Ψ = 7.5e9 and N = 64 that is 120 GB, 31.4 GB, 16.6 GB and 1.9 GB (the paper's Figure 1; a test
holds these numbers). The course trains in one precision (fp64 or fp32, ``value_bytes`` 8 or 4) with
no master copy, so Adam's state is its two moments: ``adam_bytes = 2 * value_bytes`` per parameter.

Sharding is not free of transient memory. Stage 2 holds one unit's full gradient until its
reduce-scatter; stage 3 gathers one unit's full parameters before its forward and again before its
backward, and keeps them with its full gradient until that unit's reduce-scatter: the peak adds the
largest unit's parameters and gradient (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel", section 3.2.1: peak memory is the sharded state plus the largest FSDP unit
materialized). ``unit`` is that unit's parameter count (0: leave the transients out, as the paper's
Figure 1 does). Activations are left out: they are the same for every stage (batch / N rows per rank).

The planner (``parallel_lab.planning``) imports this module; it needs no torch.
"""

from __future__ import annotations

from parallel_lab.checks import positive_int, positive_number

STAGES = (0, 1, 2, 3)
CATEGORIES = ("parameters", "gradients", "optimizer", "buffers")


def check_stage(stage) -> int:
    """``stage`` itself, or ValueError naming it."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage must be one of 0, 1, 2, 3 (ZeRO's stages; 0 is plain data parallelism), "
                         f"got stage {stage!r}")
    return stage


def per_rank(params, dp: int, stage: int, value_bytes: int = 8, unit=0, adam_bytes=None,
             overlap: bool = False) -> dict:
    """Predicted bytes per rank: ``parameters``, ``gradients``, ``optimizer`` (Adam's state),
    ``buffers`` (the peak of transient full units: stage 2 one unit's gradient, stage 3 one unit's
    parameters and gradient) and ``total``.

    params: Ψ, the model's parameter count; dp: N ranks; value_bytes: bytes of one parameter or
    gradient value; unit: the largest unit's parameter count; adam_bytes: K, bytes of optimizer state
    per parameter (default ``2 * value_bytes``: the two moments; 12 in mixed precision); overlap: one
    more unit in flight (``zero.overlap``: stage 2 the previous unit's gradient until its
    reduce-scatter ends, stage 3 the next unit's prefetched parameters)."""
    params = positive_number("params", params)
    dp = positive_int("dp", dp)
    check_stage(stage)
    value_bytes = positive_number("value_bytes", value_bytes)
    K = 2 * value_bytes if adam_bytes is None else positive_number("adam_bytes", adam_bytes)
    if unit < 0 or unit > params:
        raise ValueError(f"unit must be in 0..params, got unit {unit}, params {params}")
    shard = params / dp
    out = {
        "parameters": value_bytes * (params if stage < 3 else shard),
        "gradients": value_bytes * (params if stage < 2 else shard),
        "optimizer": K * (params if stage == 0 else shard),
        "buffers": value_bytes * unit * ({0: 0, 1: 0, 2: 1, 3: 2}[stage] + (stage >= 2 and bool(overlap))),
    }
    out["total"] = sum(out.values())
    return out


def within(measured: float, predicted: float, tolerance: float = 0.10) -> bool:
    """``measured`` within ``tolerance`` (relative) of ``predicted``; 0 only matches 0."""
    if predicted == 0:
        return measured == 0
    return abs(measured - predicted) <= tolerance * abs(predicted)
