"""Communication in flight during the compute, and where it lands on a virtual clock.

    engine = Zero(model, group, stage=0, overlap=True, record=True)   # rank side
    ... a step ...
    engine.program                                  # this rank's events of the step
    place([program of rank 0, program of rank 1, ...], dp, link)      # parent side: the timeline

Overlap, as PyTorch does it (Li et al. 2020, "PyTorch Distributed", section 3.2.3; Zhao et al. 2023,
"PyTorch FSDP", section 3.3):

- **Stages 0 and 1, DDP's buckets**: a unit's gradient is all-reduced (stage 1: reduce-scattered)
  as soon as its last parameter's gradient is accumulated, asynchronously, while the backward of the
  units before it goes on; the step waits for all of them. Here a bucket is a unit (DDP's 25 MiB
  bucket would hold the course GPT whole and so overlap nothing).
- **Stage 2**: the same, one reduce-scatter in flight: a unit's full gradient is freed when the
  next unit's reduce-scatter has been issued and its own has finished.
- **Stage 3, prefetch**: after a unit's parameters have arrived, the all-gather of the next unit's
  (in forward order in the forward, in reverse in the backward) is issued at once, so it travels
  while this unit computes. Reduce-scatters stay blocking.

Stages 2 and 3 pay for it with one more unit alive (``zero.memory.per_rank(..., overlap=True)``).

The virtual clock (as the pipeline executor's, ARCHITECTURE.md "Honest timelines on few cores"):
each rank records its step as a program of events,

    ("compute", label, cpu_seconds)       thread CPU time of the work since the previous event
    ("issue", k, op, nbytes, unit)        the k-th collective of the step is handed to the network
    ("wait", k)                           the rank cannot go on before collective k has finished

and ``place`` lays the programs of all ranks out as p dedicated devices with one network queue each
would run them: compute back to back on the rank's compute lane; collective k starts when every
rank has issued it and every rank's queue is free (collectives run in issue order), and lasts its
α-β ring cost on ``link`` (``collective_seconds``); a wait holds the compute lane until the end of
its collective. ``serial`` moves every wait right after its issue: the same measured work without
overlap, placed by the same rules.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from parallel_lab.hardware import Link

PROGRAM_EVENTS = ("compute", "issue", "wait")


def collective_seconds(op: str, nbytes: float, dp: int, link: Link) -> float:
    """Ring cost on the α-β model of a collective on a buffer of ``nbytes`` (an all-reduce's buffer,
    a reduce-scatter's input, an all-gather's output) over ``dp`` ranks: an all-reduce is a
    reduce-scatter plus an all-gather, each (p - 1) messages of n/p bytes."""
    if dp == 1:
        return 0.0
    steps = {"all_reduce": 2, "reduce_scatter_single": 1, "all_gather_single": 1}[op] * (dp - 1)
    return steps * link.cost(nbytes / dp)


class Recorder:
    """This rank's program of one step (see the module doc); thread CPU time from ``time.thread_time``."""

    def __init__(self):
        self.events: list[tuple] = []
        self.activity = "start"
        self._cpu = time.thread_time()
        self._carry = 0.0  # compute of the current activity from before a pause
        self._issued = 0

    def _compute(self) -> None:
        now = time.thread_time()
        self.events.append(("compute", self.activity, self._carry + now - self._cpu))
        self._cpu, self._carry = now, 0.0

    @contextmanager
    def paused(self):
        """Work inside the block is not the step's (the engine's memory sampling, say)."""
        self._carry += time.thread_time() - self._cpu
        try:
            yield
        finally:
            self._cpu = time.thread_time()

    def doing(self, activity: str) -> None:
        """The work from here on is ``activity`` (``"F blocks.0"``, ``"B head"``, ``"adam"``...)."""
        self._compute()
        self.activity = activity

    def issue(self, op: str, nbytes: int, unit: str) -> int:
        self._compute()
        k, self._issued = self._issued, self._issued + 1
        self.events.append(("issue", k, op, nbytes, unit))
        return k

    def wait(self, k: int) -> None:
        """Call after the wait returned: the time blocked in it is not compute."""
        self.events.append(("wait", k))
        self._cpu = time.thread_time()

    def finish(self) -> list[tuple]:
        """The program, closed with the compute since the last event."""
        self._compute()
        return list(self.events)


def serial(program: list[tuple]) -> list[tuple]:
    """``program`` with each wait moved right after its issue (no collective in flight during compute)."""
    out = [e for e in program if e[0] != "wait"]
    waited = {e[1] for e in program if e[0] == "wait"}
    result = []
    for e in out:
        result.append(e)
        if e[0] == "issue" and e[1] in waited:
            result.append(("wait", e[1]))
    return result


def place(programs: list[list[tuple]], dp: int, link: Link) -> dict:
    """The timeline of one step on the virtual clock: per rank ``compute`` ``[label, start, end]``
    and ``comm`` ``[op, unit, start, end]``, ``makespan`` (latest end), per rank ``busy`` (compute
    seconds) and ``waiting`` (makespan minus busy: communication the compute could not hide).

    Raises ValueError when the programs do not issue the same collectives in the same order or a
    wait names a collective not issued before it (a program that would hang)."""
    ranks = range(len(programs))
    signature = [[e[2:4] for e in prog if e[0] == "issue"] for prog in programs]
    if any(s != signature[0] for s in signature):
        raise ValueError("ranks issue different collectives (op, bytes) or in another order: "
                         f"{[len(s) for s in signature]} collectives per rank")
    n = len(signature[0])
    clock = [0.0] * len(programs)  # compute lane
    queue = [0.0] * len(programs)  # network queue: free from
    pos = [0] * len(programs)
    issued: list[dict] = [{} for _ in ranks]  # rank -> k -> virtual time of issue
    done: dict[int, tuple[float, float]] = {}  # k -> (start, end)
    meta: dict[int, tuple] = {}
    out = {"compute": [[] for _ in ranks], "comm": [[] for _ in ranks]}
    placed = 0
    while True:
        progressed = False
        for r in ranks:
            prog = programs[r]
            while pos[r] < len(prog):
                e = prog[pos[r]]
                if e[0] == "compute":
                    out["compute"][r].append([e[1], clock[r], clock[r] + e[2]])
                    clock[r] += e[2]
                elif e[0] == "issue":
                    issued[r][e[1]] = clock[r]
                    meta[e[1]] = e[2:]
                elif e[0] == "wait":
                    if e[1] not in issued[r]:
                        raise ValueError(f"rank {r} waits for collective {e[1]} before issuing it")
                    if e[1] not in done:
                        break
                    clock[r] = max(clock[r], done[e[1]][1])
                else:
                    raise ValueError(f"unknown event {e!r}; events are {PROGRAM_EVENTS}")
                pos[r] += 1
                progressed = True
        # Collectives start in issue order, once every rank has issued the next one.
        while placed < n and all(placed in issued[r] for r in ranks):
            op, nbytes, unit = meta[placed]
            start = max(max(issued[r][placed], queue[r]) for r in ranks)
            end = start + collective_seconds(op, nbytes, dp, link)
            done[placed] = (start, end)
            for r in ranks:
                queue[r] = end
                out["comm"][r].append([op, unit, start, end])
            placed += 1
            progressed = True
        if all(pos[r] == len(programs[r]) for r in ranks):
            break
        if not progressed:
            raise ValueError(f"the programs cannot finish: ranks stop at events {pos} waiting for "
                             f"collectives not every rank issues")
    ends = [max([c[2] for c in out["compute"][r]] + [c[3] for c in out["comm"][r]] + [0.0]) for r in ranks]
    makespan = max(ends)
    busy = [sum(c[2] - c[1] for c in out["compute"][r]) for r in ranks]
    return {**out, "makespan": makespan, "busy": busy, "waiting": [makespan - b for b in busy]}
