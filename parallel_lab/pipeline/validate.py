"""Validating a schedule before any process starts: every action once, in dependency order, and
free of deadlock under blocking receives and asynchronous sends.

    validate(build("1f1b", 4, 8))        # returns the schedule, or raises ScheduleError naming the
                                         # first offending action with the grid around it marked
"""

from __future__ import annotations

from typing import Mapping

from parallel_lab.i18n import _
from parallel_lab.pipeline.actions import KINDS, Action, Schedule, ScheduleError, format_grid


def _inputs(s: int, kind: str, j: int, n_stages: int) -> tuple[tuple[int, str, int], ...]:
    """Keys of what action (s, kind, j) consumes. Key kind "G" is the input-gradient pass of a
    (stage, microbatch): its B, or its I when the backward is split.

    F(s,j) needs F(s-1,j); B or I (s,j) needs F(s,j) and G(s+1,j); W(s,j) needs G(s,j) = I(s,j).
    """
    if kind == "F":
        return ((s - 1, "F", j),) if s > 0 else ()
    if kind == "W":
        return ((s, "G", j),)
    return ((s, "F", j), (s + 1, "G", j)) if s + 1 < n_stages else ((s, "F", j),)


def _describe(key: tuple[int, str, int], where: Mapping) -> str:
    s, kind, j = key
    if kind == "G":
        kind = "B" if (s, "B", j) in where else "I"
    return _("{action} (stage {stage}, microbatch {microbatch})").format(action=Action(s, kind, j), stage=s,
                                                                          microbatch=j)


def _error(schedule: Schedule, message: str, mark: tuple[int, int] | None = None) -> ScheduleError:
    """A ScheduleError whose message ends with the grid, the offending cell marked `>1B3<`."""
    rows = None if mark is None else (mark[1] - 8, mark[1] + 8)
    return ScheduleError(f"{schedule.name}: {message}\n{format_grid(schedule, mark=mark, rows=rows)}")


def _check_structure(schedule: Schedule) -> None:
    p, m, n_stages = schedule.n_ranks, schedule.n_microbatches, schedule.n_stages
    owner = schedule.stage_to_rank
    if len(schedule.ranks) != p:
        raise _error(schedule, _("has {n} rank lists, expected n_ranks {p}").format(n=len(schedule.ranks), p=p))
    bad = [s for s, r in enumerate(owner) if not 0 <= r < p]
    if bad:
        raise _error(schedule, _("stage {stage} maps to rank {rank}, not in 0..{last}").format(
            stage=bad[0], rank=owner[bad[0]], last=p - 1))
    for rank, step, a in schedule.actions():
        if not isinstance(a, Action) or a.kind not in KINDS:
            problem = _("is not an Action with kind in {kinds}").format(kinds=KINDS)
        elif not (0 <= a.stage < n_stages and 0 <= a.microbatch < m):
            problem = _("is out of range (stages 0..{stages}, microbatches 0..{microbatches})").format(
                stages=n_stages - 1, microbatches=m - 1)
        elif owner[a.stage] != rank:
            problem = _("is on rank {rank} but stage {stage} lives on rank {owner}").format(
                rank=rank, stage=a.stage, owner=owner[a.stage])
        else:
            continue
        raise _error(schedule, _("rank {rank}, step {step}: {action} {problem}").format(
            rank=rank, step=step, action=a, problem=problem), (rank, step))


def _index(schedule: Schedule) -> dict[tuple[int, str, int], tuple[int, int]]:
    """(stage, kind, microbatch) -> (rank, step), plus "G" keys for B/I; rejects duplicates and a
    full backward B mixed with split I/W for the same (stage, microbatch)."""
    where: dict[tuple[int, str, int], tuple[int, int]] = {}
    backward: dict[tuple[int, int], tuple[bool, int, int]] = {}  # (stage, mb) -> (is B, rank, step)
    for rank, step, a in schedule.actions():
        s, kind, j = a
        if a in where:
            r0, s0 = where[a]
            message = _("rank {rank}, step {step}: {action} appears twice (first at rank {rank0}, "
                        "step {step0})").format(rank=rank, step=step, action=a, rank0=r0, step0=s0)
            raise _error(schedule, message, (rank, step))
        if kind != "F":
            full, r0, s0 = backward.setdefault((s, j), (kind == "B", rank, step))
            if full != (kind == "B"):
                raise _error(
                    schedule,
                    _("rank {rank}, step {step}: {action} mixes full backward B with split I/W for stage {stage}, "
                      "microbatch {microbatch} ({other} is at rank {rank0}, step {step0})").format(
                        rank=rank, step=step, action=a, stage=s, microbatch=j, other=schedule.ranks[r0][s0],
                        rank0=r0, step0=s0),
                    (rank, step),
                )
        where[a] = (rank, step)
        if kind == "B" or kind == "I":
            where[s, "G", j] = (rank, step)
    return where


def _check_complete(schedule: Schedule, where: Mapping) -> None:
    for s in range(schedule.n_stages):
        for j in range(schedule.n_microbatches):
            if (s, "F", j) not in where:
                missing = "F"
            elif (s, "B", j) in where:
                continue
            elif (s, "I", j) in where or (s, "W", j) in where:
                missing = "I" if (s, "I", j) not in where else "W" if (s, "W", j) not in where else None
            else:
                missing = "B"
            if missing:
                raise _error(
                    schedule,
                    _("{action} is missing (expected on rank {rank}); every (stage, microbatch) needs one F and "
                      "either one B or one I and one W").format(action=_describe((s, missing, j), where),
                                                                 rank=schedule.stage_to_rank[s]),
                )


def _run_dataflow(schedule: Schedule, where: Mapping) -> dict[int, tuple[int, Action, tuple]]:
    """Execute the schedule symbolically; return {rank: (step, action, awaited key)} of stuck ranks.

    Each rank runs its actions in order and blocks on an action until every input exists (a
    blocking recv); results are sent asynchronously (isend, as in torch.distributed.pipelining), so
    sends never block. A blocked rank parks on the input it misses (key stage*m + microbatch for an
    activation, ~key for a gradient) and resumes when it is produced: O(actions). An input missing
    from the rank's own past is an order error, raised at once. Empty result = no deadlock.
    """
    n_stages, m, ranks = schedule.n_stages, schedule.n_microbatches, schedule.ranks
    owner = schedule.stage_to_rank
    fwd_done, grad_done = [False] * (n_stages * m), [False] * (n_stages * m)
    pos = [0] * len(ranks)
    parked: dict[int, list[int]] = {}
    ready = list(range(len(ranks)))
    while ready:
        rank = ready.pop()
        actions, i = ranks[rank], pos[rank]
        while i < len(actions):
            a = actions[i]
            if a is not None:
                s, kind, j = a
                key = s * m + j
                if kind == "F":
                    wait = key - m if s > 0 and not fwd_done[key - m] else None
                elif kind == "W":
                    wait = ~key if not grad_done[key] else None
                elif not fwd_done[key]:
                    wait = key
                else:
                    wait = ~(key + m) if s + 1 < n_stages and not grad_done[key + m] else None
                if wait is not None:
                    if owner[(wait if wait >= 0 else ~wait) // m] == rank:
                        _raise_order_error(schedule, where, rank, i, a)
                    parked.setdefault(wait, []).append(rank)
                    break
                if kind == "F":
                    fwd_done[key] = True
                    ready.extend(parked.pop(key, ()))
                elif kind != "W":
                    grad_done[key] = True
                    ready.extend(parked.pop(~key, ()))
            i += 1
        pos[rank] = i
    return {
        rank: (pos[rank], a, _first_missing(a, n_stages, fwd_done, grad_done, m))
        for rank, actions in enumerate(ranks)
        if pos[rank] < len(actions)
        for a in [actions[pos[rank]]]
    }


def _first_missing(a: Action, n_stages: int, fwd_done, grad_done, m: int) -> tuple[int, str, int]:
    for s, kind, j in _inputs(*a, n_stages):
        if not (fwd_done if kind == "F" else grad_done)[s * m + j]:
            return (s, kind, j)
    raise AssertionError(f"{a} is not waiting for anything")


def _raise_order_error(schedule: Schedule, where: Mapping, rank: int, step: int, a: Action) -> None:
    for need in _inputs(*a, schedule.n_stages):
        r0, s0 = where[need]
        if r0 == rank and s0 > step:
            raise _error(
                schedule,
                _("rank {rank}, step {step}: {action} runs before its input {need}, which comes later on the same "
                  "rank (step {step0})").format(rank=rank, step=step, action=a, need=_describe(need, where),
                                                step0=s0),
                (rank, step),
            )
    raise AssertionError(f"rank {rank}, step {step}: {a} blocked on its own rank without an order error")


def _deadlock_message(stuck: Mapping[int, tuple], where: Mapping) -> tuple[str, tuple[int, int]]:
    """Follow the chain of waits from the earliest stuck action until it closes into a cycle."""
    first = min(stuck, key=lambda r: (stuck[r][0], r))
    parts, seen, rank = [], set(), first
    while rank in stuck and rank not in seen:
        seen.add(rank)
        step, a, missing = stuck[rank]
        source = where[missing][0]
        need = _describe(missing, where)
        parts.append(_("rank {rank}, step {step}: {action} waits for its input {need} from rank {source}").format(
            rank=rank, step=step, action=a, need=need, source=source))
        rank = source
    cycle = _("; back to rank {rank}, a cycle").format(rank=rank) if rank in seen else ""
    return _("no rank can progress (deadlock): ") + "; ".join(parts) + cycle, (first, stuck[first][0])


def validate(schedule: Schedule) -> Schedule:
    """Check every invariant of a schedule; return it unchanged or raise ScheduleError.

    1. shape: one list per rank, actions in range, each action on the rank that owns its stage;
    2. completeness: per (stage, microbatch) exactly one F and either one B or one I and one W;
    3. order on one rank: an action never precedes one of its inputs on the same rank
       (F(s-1) before F(s), F before B/I, B/I of stage s+1 before B/I of s, I before W);
    4. deadlock freedom: executing with blocking receives (sends are asynchronous) finishes.
    The message names the first offending action (rank, step, action) and shows the grid around it
    with that cell marked `>1B3<`.
    """
    _check_structure(schedule)
    where = _index(schedule)
    _check_complete(schedule, where)
    stuck = _run_dataflow(schedule, where)
    if stuck:
        message, mark = _deadlock_message(stuck, where)
        raise _error(schedule, message, mark)
    return schedule
