"""What a rank records of one pipeline step: both clocks, a record per action, the bytes it moved.

    rec = Recording(link, message_bytes)   # Executor(record=True) makes one per step
    rec.start()                            # a barrier: the common start of both clocks
    began = rec.begin(ready)               # before an action; ready: when its input arrived
    clock = rec.end(action, worker, began) # after it: its record; the virtual clock, for its message
    rec.records, rec.bytes_sent

See ARCHITECTURE.md, "Honest timelines on few cores":
    wall clock     time.perf_counter from a common start (a barrier): what this machine did, with
                   ranks sharing few cores
    virtual clock  an action lasts its thread CPU time (time.thread_time; less what it spun waiting
                   for tensor-parallel peers, ``runtime.shared_memory``) and starts no earlier than
                   its inputs arrived: every message carries the sender's virtual clock (a one-number
                   tensor sent beside it, or the slot's stamp in shared memory) plus a modelled link
                   cost (``Link``). This is the timeline p dedicated devices would show.

A record is ``{"action": "1F3", "wall": (start, end), "virtual": (start, end), "cpu": seconds,
"stashed": micro-batches stashed after it, "held": micro-batches waiting for their W, "bytes": what
they keep}``, the last three from the stage's worker (``StageWorker.memory``). ``NOT_RECORDED`` has
the same methods and does nothing, so that the executor walks a step in one loop either way.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from parallel_lab.hardware import Link
from parallel_lab.runtime import shared_memory


class Recording:
    """One step's records on this rank, kept as it runs."""

    def __init__(self, link: Link, message_bytes: int):
        self.hop = link.cost(message_bytes)  # a boundary tensor's trip on the modelled link
        self.message_bytes = message_bytes
        self.records: list[dict] = []
        self.bytes_sent = 0
        self.clock = 0.0  # this rank's virtual clock: when its last action ended
        self.origin = 0.0

    def start(self) -> None:
        """Collective: a barrier, then both clocks start at 0."""
        dist.barrier()
        self.origin, self.clock = time.perf_counter(), 0.0

    def arrival(self, stamp: float) -> float:
        """When a message the sender stamped ``stamp`` (its virtual clock) arrives here."""
        return stamp + self.hop

    def begin(self, ready: float | None) -> tuple:
        """Just before an action whose input is here at ``ready`` (None: nothing to wait for)."""
        start = self.clock if ready is None else max(self.clock, ready)
        return start, time.perf_counter(), time.thread_time(), shared_memory.waited_seconds()

    def end(self, action, worker, began: tuple) -> float:
        """Just after ``action`` ran on ``worker``: record it; returns the virtual clock now."""
        start, wall0, cpu0, spun0 = began
        cpu = time.thread_time() - cpu0 - (shared_memory.waited_seconds() - spun0)  # not spinning for TP peers
        wall1 = time.perf_counter()
        self.clock = start + cpu
        stashed, held, kept = worker.memory()
        self.records.append({
            "action": str(action), "wall": (wall0 - self.origin, wall1 - self.origin),
            "virtual": (start, self.clock), "cpu": cpu, "stashed": stashed, "held": held, "bytes": kept,
        })
        return self.clock

    def sent(self) -> None:
        """A boundary tensor left for another rank."""
        self.bytes_sent += self.message_bytes


class _NotRecorded:
    """A step without records: every method does nothing; clocks read 0."""

    records: tuple = ()
    bytes_sent = 0

    def start(self) -> None:
        pass

    def arrival(self, stamp) -> None:
        return None

    def begin(self, ready) -> None:
        return None

    def end(self, action, worker, began) -> float:
        return 0.0

    def sent(self) -> None:
        pass


NOT_RECORDED = _NotRecorded()
