"""The messages a schedule implies: per rank, the receives each action needs and the sends it makes,
in program order (the op list an executor runs; PyTorch's ``_add_send_recv`` pass).

    communication(build("1f1b", 2, 2))[0]  # [0F0, 0SEND_F0, 0F1, 0SEND_F1, 0RECV_B0, 0B0, 0RECV_B1, 0B1]
    message_count("zb-v", 4, 8)            # point-to-point messages of one step
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from parallel_lab.pipeline.schedules import Action, Schedule, build
from parallel_lab.pipeline.validate import validate


class Comm(NamedTuple):
    """A point-to-point op: `op` "send"/"recv" of `tensor` "act" (activation) or "grad" (its gradient).

    stage is the local stage that sends or receives, peer_stage the other end, peer its rank.
    str() follows PyTorch's `_add_send_recv`: `0SEND_F3`, `1RECV_F3`, `1SEND_B3`, `0RECV_B3`.
    """

    op: str
    tensor: str
    stage: int
    peer: int
    peer_stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.upper()}_{'F' if self.tensor == 'act' else 'B'}{self.microbatch}"


def _recvs(a: Action, stage_to_rank: Sequence[int]) -> list[Comm]:
    rank, last = stage_to_rank[a.stage], len(stage_to_rank) - 1
    if a.kind == "F" and a.stage > 0 and stage_to_rank[a.stage - 1] != rank:
        return [Comm("recv", "act", a.stage, stage_to_rank[a.stage - 1], a.stage - 1, a.microbatch)]
    if a.kind in "BI" and a.stage < last and stage_to_rank[a.stage + 1] != rank:
        return [Comm("recv", "grad", a.stage, stage_to_rank[a.stage + 1], a.stage + 1, a.microbatch)]
    return []


def _sends(a: Action, stage_to_rank: Sequence[int]) -> list[Comm]:
    rank, last = stage_to_rank[a.stage], len(stage_to_rank) - 1
    if a.kind == "F" and a.stage < last and stage_to_rank[a.stage + 1] != rank:
        return [Comm("send", "act", a.stage, stage_to_rank[a.stage + 1], a.stage + 1, a.microbatch)]
    if a.kind in "BI" and a.stage > 0 and stage_to_rank[a.stage - 1] != rank:
        return [Comm("send", "grad", a.stage, stage_to_rank[a.stage - 1], a.stage - 1, a.microbatch)]
    return []


def communication(schedule: Schedule, check: bool = True) -> dict[int, list[Action | Comm]]:
    """Per rank, the ordered ops an executor runs: the recvs an action needs, the action, its sends.

    A stage hands its output to the next stage on the same rank in memory (no message). The
    schedule is validated first, so the result cannot deadlock with blocking recvs and async sends;
    ``check=False`` skips that, to run a broken schedule and show how it hangs.
    """
    if check:
        validate(schedule)
    stage_to_rank = schedule.stage_to_rank
    ops: dict[int, list[Action | Comm]] = {}
    for rank, actions in enumerate(schedule.ranks):
        ops[rank] = []
        for a in actions:
            if a is not None:
                ops[rank] += [*_recvs(a, stage_to_rank), a, *_sends(a, stage_to_rank)]
    return ops


def messages(schedule: Schedule) -> int:
    """Point-to-point messages of one step: every activation and gradient that crosses ranks.
    2(p-1)m for 1F1B, 2(pv-1)m interleaved, 2(2p-2)m ZB-V."""
    return sum(1 for ops in communication(schedule).values() for op in ops
               if isinstance(op, Comm) and op.op == "send")


def message_count(schedule: str, ranks: int, microbatches: int, virtual: int = 1) -> float:
    """``messages`` of the named schedule (a quiz answer: ``parallel_lab.course.quiz.bank`` calls it)."""
    return float(messages(build(schedule, ranks, microbatches, virtual)))
