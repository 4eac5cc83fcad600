"""All-reduce through shared memory, for the ranks of a group on one host: the group's channel.

gloo moves every message over loopback TCP, even between two processes of one machine: a send
wakes gloo's network thread on the other side, which wakes the waiting rank. On the course's 2-core
machine one such step costs about 0.6 ms, so a 128 KB all-reduce of two ranks (a ring of 2 steps)
takes about 1.3 ms, where copying 128 KB takes microseconds; tensor parallelism pays it twice per
layer (``parallel-lab bench collectives`` measures both). Ranks on one host can instead read each
other's memory. DeepSpeed does this for tensor parallelism on CPUs ("if all ranks are on the same
physical machine, use an SHM based low latency allreduce": ``csrc/cpu/comm/shm.cpp``), and NCCL's
SHM transport does it between GPUs of one node without NVLink.

The algorithm is one shot (``transport.one_shot_all_reduce``) with memory in place of messages.
A group shares one file in ``/dev/shm``, mapped by every rank: a slot per rank and a flag per rank.
Call ``s`` on a group:

1. copy the tensor into this rank's slot (parity ``s % 2``), then set this rank's flag to ``s``;
2. wait until every rank's flag is at least ``s``;
3. add the p slots in group-rank order into the tensor -- the same order everywhere, so every rank
   ends with the same bits (for 2 ranks, the same bits as gloo's ring: a + b = b + a).

Two parities suffice: a rank can write parity ``s % 2`` again only at call ``s + 2``, which needs
every flag at ``s + 1``, which every rank sets only after it has read call ``s``. Ordering relies
on x86's memory model (stores become visible in program order, loads are not reordered with loads:
Intel SDM vol. 3A, 8.2.2), so the data is in a slot before its flag is seen; other processors
keep gloo. Waiting is ``shared_memory.spin`` (its core given away at every look, the spun time
kept apart).

``for_group(group)`` decides once per group, on all its ranks together (a collective the first
time): gloo, Linux with ``/dev/shm``, x86-64, every rank of the group on this host
(``shared_memory.why_not``). ``transport.all_reduce`` then sends tensors of at most
``shared_memory.MAX_BYTES`` through it; everything else goes to gloo as before.
"""

from __future__ import annotations

import mmap
import os

import torch
import torch.distributed as dist

from parallel_lab.runtime import commlog
from parallel_lab.runtime.shared_memory import FLAGS_BYTES, MAX_BYTES, host, new_file, spin, why_not_here

_channels: dict = {}  # ProcessGroup -> Channel | None (None: this group uses gloo)


class Channel:
    """One group's shared file: ``flags`` (an int64 per rank) and ``slots[parity, rank]``."""

    def __init__(self, group, path: str, p: int, rank: int):
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, _file_bytes(p))
        finally:
            os.close(fd)
        self.group, self.p, self.rank, self.calls = group, p, rank, 0
        self.flags = memoryview(self.map)[: FLAGS_BYTES * p].cast("q")
        self.stride = FLAGS_BYTES // 8  # rank q's flag is flags[q * stride]
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8, offset=FLAGS_BYTES * p,
                                      count=2 * p * MAX_BYTES).view(2, p, MAX_BYTES)
        self._views: dict = {}

    def slots(self, parity: int, tensor: torch.Tensor) -> list:
        key = (parity, tensor.dtype, tuple(tensor.shape))
        if key not in self._views:
            n = tensor.numel() * tensor.element_size()
            self._views[key] = [self.bytes[parity, q, :n].view(tensor.dtype).view(tensor.shape)
                                for q in range(self.p)]
        return self._views[key]

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum ``tensor`` over the group in place (steps 1-3 of the module doc); ``op="max"`` takes
        the elementwise maximum instead (exact in any order)."""
        s, slots = self.post(tensor)
        self.wait(s)
        return self.add(slots, tensor, op)

    def post(self, tensor: torch.Tensor) -> tuple[int, list]:
        """Step 1: this rank's part of its next call, in its slot, then its flag. Returns the call's
        number and its slots."""
        self.calls += 1
        s = self.calls
        slots = self.slots(s % 2, tensor)
        slots[self.rank].copy_(tensor)
        self.flags[self.rank * self.stride] = s  # after the copy: x86 shows stores in order
        return s, slots

    @staticmethod
    def add(slots: list, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Step 3: the slots summed in group-rank order (or their maximum), into ``tensor``."""
        combine = torch.maximum if op == "max" else torch.add
        combine(slots[0], slots[1], out=tensor)
        for slot in slots[2:]:
            combine(tensor, slot, out=tensor)
        return tensor

    def wait(self, s: int) -> None:
        """Step 2: until every rank's flag is at least ``s`` (spinning; the spun time is counted)."""
        flags, stride = self.flags, self.stride

        def missing() -> list:
            return [q for q in range(self.p) if flags[q * stride] < s]

        if missing():
            spin(lambda: not missing(), None, lambda limit: (
                f"shared-memory all_reduce call {s} of group {_name(self.group)}: group ranks {missing()} "
                f"did not arrive within {limit:g} s (a rank died, or called another collective or none)"))


def for_group(group=None) -> Channel | None:
    """This group's shared-memory channel, or None where it uses gloo (see ``why_not``). Collective
    on the group's ranks the first time it is asked for a group."""
    key = dist.group.WORLD if group is None else group
    if key in _channels:
        return _channels[key]
    _forget_destroyed()
    with commlog.aside(f"opening a shared-memory channel for group {_name(group)}"):
        _channels[key] = _open(group)
    return _channels[key]


def _open(group) -> Channel | None:
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    mine = (why_not_here(dist.get_backend(group)), host())
    every = [None] * p
    dist.all_gather_object(every, mine, group=group)
    if any(r is not None for r, _ in every) or len({h for _, h in every}) > 1:
        return None
    first = 0 if group is None else dist.get_global_rank(group, 0)
    path = [new_file(_file_bytes(p)) if rank == 0 else None]  # zero-filled: every flag at 0
    try:
        dist.broadcast_object_list(path, src=first, group=group)
        if not path[0]:  # /dev/shm is full: gloo, on every rank
            return None
        opened = Channel(group, path[0], p, rank)
        dist.barrier(group=group)  # everyone has it mapped: the name can go
    finally:
        if rank == 0 and path[0]:
            os.unlink(path[0])  # the memory lives on until the last rank unmaps it; nothing is left behind
    return opened


def _file_bytes(p: int) -> int:
    return FLAGS_BYTES * p + 2 * p * MAX_BYTES  # p flags, then slots[parity, rank]


def _name(group) -> str:
    return "world" if group is None else str(dist.get_process_group_ranks(group))


def _forget_destroyed() -> None:
    """Drop the channels of groups that ``destroy_process_group`` has removed (meshes make and
    destroy groups run after run in one rank process)."""
    live = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None)
    if live is None:
        return
    for key in [k for k in _channels if k not in live]:
        del _channels[key]
