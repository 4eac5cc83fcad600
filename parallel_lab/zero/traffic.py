"""Communication volume per rank and step under ZeRO stages 0-3: the textbook figure and the measured one.

    from parallel_lab.zero import traffic
    traffic.per_step(214_368, dp=4, stage=3, value_bytes=8)   # {"volume": 3Ψ bytes, "ring_sent": ...}
    traffic.volume(log.as_dict(), dp=4)                        # the same from commlog's counts

Rajbhandari et al. 2020 ("ZeRO"), section 7: a ring all-reduce is a reduce-scatter followed by an
all-gather, each moving Ψ values, so plain data parallelism moves 2Ψ per rank and step. Stages 1 and
2 replace the all-reduce by a reduce-scatter of the gradients and an all-gather of the updated
parameters: 2Ψ again. Stage 3 all-gathers the parameters before the forward and again before the
backward and reduce-scatters the gradients: 3Ψ, 1.5x plain data parallelism (section 7.2.2).

"Moves Ψ" counts the values a collective takes in or hands out on each rank: the input of a
reduce-scatter, the output of an all-gather, twice the buffer of an all-reduce. What a ring sends
on each link is (N - 1)/N of that (``ring_sent``).

``commlog`` records per call what a rank passes in (an all-gather: its own shard; a reduce-scatter:
its whole input), so ``volume`` scales each op to the paper's unit.
"""

from __future__ import annotations

from parallel_lab.checks import positive_int, positive_number
from parallel_lab.zero.memory import check_stage

# Collectives the engine issues, as commlog names them.
OPS = ("all_reduce", "reduce_scatter_single", "all_gather_single")


def per_step(params, dp: int, stage: int, value_bytes: int = 8) -> dict:
    """The textbook bytes per rank and step: ``volume`` (2Ψ stages 0-2, 3Ψ stage 3, times
    ``value_bytes``) and ``ring_sent`` (what a ring sends of it: (N - 1)/N)."""
    params = positive_number("params", params)
    dp = positive_int("dp", dp)
    check_stage(stage)
    volume = (3 if stage == 3 else 2) * params * positive_number("value_bytes", value_bytes)
    return {"volume": volume, "ring_sent": volume * (dp - 1) / dp}


def volume(collectives: dict, dp: int) -> float:
    """Bytes moved in the paper's sense, from commlog's ``{op: {"count", "bytes"}}`` of one rank:
    2x an all-reduce's buffer, a reduce-scatter's input, dp x an all-gather's shard (its output)."""
    dp = positive_int("dp", dp)
    factor = {"all_reduce": 2, "reduce_scatter_single": 1, "all_gather_single": dp}
    unknown = sorted(set(collectives) - set(factor))
    if unknown:
        raise ValueError(f"no volume rule for {unknown}; known ops: {', '.join(factor)}")
    return float(sum(row["bytes"] * factor[op] for op, row in collectives.items()))
