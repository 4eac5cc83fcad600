"""The V-shape building blocks of Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"
(NeurIPS 2024, section 4): a schedule made of one repeated block, whose memory is set by the block.

In the V placement (rank r holds stage r and stage 2p-1-r), one micro-batch's block is four passes
on every rank: F of the down stage, F of the up stage, then the input gradients I of the up stage and
of the down stage, placed on a grid of unit slots; the next micro-batch's block is the same shifted
by 6 slots (each rank does 6 unit passes per micro-batch: two F, two I, two W). A rank holds a
micro-batch's activations from its down-stage F to its down-stage I, so the block's *lifespan* on
rank 0 divided by the 6-slot interval is how many micro-batches it holds at once: the paper's
"V-Min" block (offsets F_d = r, F_u = 2p-1-r, I_u = 2p+d+r, I_d = 4p+d-1-r, d = 2 when 3 | p, else 0)
lives about 4p slots, a third of 1F1B's 12p (1F1B holds p micro-batches of 6 slots each on rank 0),
"V-Half" (F_d = 2r, F_u = 3p-2-r, I_u = 3p+d+2r-1, I_d = 6p+d-2-r, d = 3 when p is even) about 6p,
a half; V-ZB is ZB-V (``schedules.zb_v``), 1F1B's memory. The W passes fill the empty slots in
time order (up stage first), as the paper places them, and the ranks' orders are then timed by list
scheduling with the real costs (the paper's "squeeze": every pass as early as its inputs allow).

Offsets as the paper's figures give them and its authors' scheduler (sail-sg's ``vhalf.py``) uses;
they collide on no rank and satisfy every dependency one slot apart, so the orders are valid.
"""

from __future__ import annotations

from parallel_lab.pipeline.actions import Action, Schedule
from parallel_lab.pipeline.search.problem import Problem, as_schedule

INTERVAL = 6  # slots per micro-batch and rank: F, F, I, I, W, W


def v_min_offsets(p: int) -> list[tuple[int, int, int, int]]:
    """Per rank r, the slots of micro-batch 0's (F down, F up, I up, I down) in the V-Min block."""
    d = 2 if p % 3 == 0 else 0
    return [(r, 2 * p - 1 - r, 2 * p + d + r, 4 * p + d - 1 - r) for r in range(p)]


def v_half_offsets(p: int) -> list[tuple[int, int, int, int]]:
    """Per rank r, the slots of micro-batch 0's (F down, F up, I up, I down) in the V-Half block."""
    d = 3 if p % 2 == 0 else 0
    return [(2 * r, 3 * p - 2 - r, 3 * p + d + 2 * r - 1, 6 * p + d - 2 - r) for r in range(p)]


BLOCKS = {"v-min": v_min_offsets, "v-half": v_half_offsets}


def block_orders(p: int, m: int, offsets, w_first: str = "up") -> list[list[Action]]:
    """Per rank, the order of the repeated block: its passes by slot, each W in the first free slot
    after its I (``w_first`` "up": a pending up-stage W before a down-stage one; "old": the W whose I
    came first), the W's still pending at the end after the rest."""
    orders = []
    for r, (f_d, f_u, i_u, i_d) in enumerate(offsets):
        down, up = r, 2 * p - 1 - r
        slots: dict[int, Action] = {}
        for k in range(m):
            for slot, action in ((f_d, Action(down, "F", k)), (f_u, Action(up, "F", k)),
                                 (i_u, Action(up, "I", k)), (i_d, Action(down, "I", k))):
                at = slot + INTERVAL * k
                if at in slots:
                    raise AssertionError(f"block collides on rank {r} at slot {at}: {slots[at]} and {action}")
                slots[at] = action
        order, pending, last = [], [], max(slots)
        for slot in range(last + 1):
            action = slots.get(slot)
            if action is not None:
                order.append(action)
                if action.kind == "I":
                    pending.append(Action(action.stage, "W", action.microbatch))
            elif pending:
                order.append(pending.pop(_pick(pending, up, w_first)))
        while pending:
            order.append(pending.pop(_pick(pending, up, w_first)))
        orders.append(order)
    return orders


def _pick(pending: list[Action], up: int, w_first: str) -> int:
    if w_first == "up":
        for i, w in enumerate(pending):
            if w.stage == up:
                return i
    return 0


def block_schedules(problem: Problem) -> list[tuple[str, Schedule]]:
    """The building blocks for a V-placement problem with a split backward, as named candidates (none
    for other problems)."""
    if problem.placement != "v" or not problem.split:
        return []
    out = []
    for name, offsets in BLOCKS.items():
        for w_first in ("up", "old"):
            orders = block_orders(problem.ranks, problem.microbatches, offsets(problem.ranks), w_first)
            out.append((f"{name} (W {w_first} first)", as_schedule(problem, name, orders)))
    return out
