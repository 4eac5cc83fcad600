"""Ranks of one host that share memory: whether they can, the files they map, the wait, and
point-to-point links.

gloo moves every message over loopback TCP, even between two processes of one machine (a send
wakes gloo's network thread on the other side, about 0.6 ms a step on the course's 2-core machine).
Ranks on one host can instead read each other's memory. This module holds what both uses of that
share: ``why_not`` (gloo, Linux with ``/dev/shm``, x86-64: the flags rely on x86's store order,
Intel SDM vol. 3A, 8.2.2), ``new_file`` (a zero-filled file in ``/dev/shm``, unlinked once every
end has it mapped, so nothing is left behind), and ``spin``, the wait: a spin that gives its core
away at every look (``os.sched_yield``), so a waiting rank holds no core another rank could compute
on (with more ranks than cores it is still the faster wait: ``bench tensor`` on 1 core with 2 and 4
ranks and on 2 cores with 8 ranks, ours within 1.05 x the machine's limit on 1 core, every row
faster than with gloo). The thread CPU time it spins is kept apart (``waited_seconds``), so the
pipeline's virtual clock and the benchmarks' compute do not count waiting as work.

The group all-reduce is ``runtime.shared_channel``. Point to point (``links``): the pipeline
executor's activations and gradients. A pair of ranks shares one file with a ring of ``depth`` slots
in each direction; the sender copies a message (and the float64 virtual-clock stamp beside it) into
the next slot and then counts it ``sent``; the receiver waits until ``sent`` passes what it has
taken, copies the slot out and then counts it ``taken``, which frees the slot (x86 also keeps a store
after the loads before it, SDM 8.2.2). A full ring does not block the sender: ``Link.send`` says no
and the executor keeps the message until there is room (it retries whenever it waits), so sends stay
asynchronous as the schedule validator assumes. On this machine a message then costs microseconds
instead of gloo's 0.6 ms (``parallel-lab bench pipeline``).
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import platform
import socket
import time
import uuid

import torch
import torch.distributed as dist

from parallel_lab.runtime import commlog

MAX_BYTES = 256 * 2**10  # per slot: tensor parallelism's activations (128 KB in the bench's MLP)
SHM_DIR = "/dev/shm"
FLAGS_BYTES = 64  # per rank: one int64 flag, the rest of a cache line unshared
_X86 = ("x86_64", "amd64")
TIMEOUT_S: float | None = None  # how long a rank waits for the others; None: the process group default

_waited = [0.0]  # thread CPU seconds this process has spent waiting for other ranks' flags


def why_not(machine: str, shm_dir: bool, backend: str = "gloo") -> str | None:
    """Why ranks cannot share memory for their all-reduces on this machine (``platform.machine()``,
    whether ``/dev/shm`` exists, the group's backend), or None when they can (every rank of a group
    also has to be on this host)."""
    if backend != "gloo":
        return f"the backend is {backend}, which has its own transports"
    if not shm_dir:
        return f"there is no {SHM_DIR} (not Linux)"
    if machine.lower() not in _X86:
        return f"the processor is {machine}, not x86-64 (the flags rely on x86's store order)"
    return None


def why_not_here(backend: str = "gloo") -> str | None:
    """``why_not`` on this machine (no process group needed; a channel or a link also needs every
    rank involved on this host)."""
    return why_not(platform.machine(), os.path.isdir(SHM_DIR), backend)


def waited_seconds() -> float:
    """Thread CPU seconds this process has spun waiting for other ranks (a running total)."""
    return _waited[0]


def host() -> str:
    """This host, as its ranks compare it: the host name and the kernel's boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


# ----------------------------------------------------------------------------------------------
# Point to point: a ring of slots per direction between two ranks.

LINK_DEPTH = 8  # slots per direction: messages a sender may be ahead of its receiver before it queues
_LINK_TAG = 2**30  # the gloo tags of the setup messages (the executor's own tags are far smaller)
_NAME_BYTES = 128


class Link:
    """One direction of a pair's file, as seen by one end: ``send`` on the sender's, ``receive`` on
    the receiver's. ``counters[0]`` counts messages sent, ``counters[8]`` messages taken (a cache
    line apart); slot i holds a float64 stamp, then the message (a 64-byte header)."""

    def __init__(self, buffer, offset: int, nbytes: int, depth: int, peer: int):
        self.nbytes, self.depth, self.peer, self.count = nbytes, depth, peer, 0  # count: mine, sent or taken
        self.slot = FLAGS_BYTES + _round_up(nbytes)
        self.counters = memoryview(buffer)[offset: offset + 2 * FLAGS_BYTES].cast("q")
        start = offset + 2 * FLAGS_BYTES
        self.stamps = memoryview(buffer)[start: start + depth * self.slot].cast("d")
        self.bytes = torch.frombuffer(buffer, dtype=torch.uint8, offset=start,
                                      count=depth * self.slot).view(depth, self.slot)
        self._views: dict = {}

    def _view(self, i: int, shape, dtype) -> torch.Tensor:
        """Slot i's message bytes as a tensor of ``shape`` and ``dtype``."""
        key = (i, dtype, tuple(shape))
        if key not in self._views:
            n = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            if n > self.nbytes:
                raise ValueError(f"a message of {n} bytes does not fit this link's {self.nbytes}-byte slots")
            self._views[key] = self.bytes[i, FLAGS_BYTES: FLAGS_BYTES + n].view(dtype).view(shape)
        return self._views[key]

    def send(self, tensor: torch.Tensor, stamp: float = 0.0) -> bool:
        """Copy ``tensor`` (and ``stamp``) into the next slot, or return False when all ``depth`` are
        still unread (the caller keeps the message and tries again later)."""
        if not self.room():
            return False
        i = self.count % self.depth
        self._view(i, tensor.shape, tensor.dtype).copy_(tensor.detach())
        self.stamps[i * self.slot // 8] = stamp
        self.count += 1
        self.counters[0] = self.count  # after the data: x86 shows stores in order
        return True

    def ready(self) -> bool:
        """On the receiving end: a message is there."""
        return self.counters[0] > self.count

    def room(self) -> bool:
        """On the sending end: a slot is free."""
        return self.count - self.counters[8] < self.depth

    def wait_for_room(self, progress=None, text: str = "") -> None:
        """On the sending end: wait until a slot is free, as ``receive`` waits for a message."""
        if not self.room():
            self._wait(self.room, progress, text, "took nothing")

    def receive(self, shape, dtype, progress=None, text: str = "") -> tuple[torch.Tensor, float]:
        """The next message (a new tensor of ``shape``/``dtype``) and its stamp, waiting until it is
        there. While waiting, ``progress()`` runs at every look (the caller's queued sends) and
        the spun CPU time is counted (``waited_seconds``); a peer that sends nothing within the
        process group's timeout raises TimeoutError naming it."""
        if not self.ready():
            self._wait(self.ready, progress, text, "sent nothing")
        i = self.count % self.depth
        data = self._view(i, shape, dtype).clone()
        stamp = self.stamps[i * self.slot // 8]
        self.count += 1
        self.counters[8] = self.count  # after the loads: x86 keeps a store after earlier loads
        return data, stamp

    def _wait(self, done, progress, text: str, failed: str) -> None:
        with commlog.aside(f"wait({text} through shared memory)"):
            spin(done, progress, lambda limit: f"{text}: rank {self.peer} {failed} through shared memory "
                                                f"within {limit:g} s (it died, or waits for this rank)")


def spin(done, progress, timed_out) -> None:
    """Until ``done()``: run ``progress()`` (if any) and give the core away at every look; after
    ``TIMEOUT_S`` (default: the process group's timeout) raise TimeoutError(``timed_out(limit)``).
    The thread CPU time spun is counted in ``waited_seconds``."""
    limit = dist.default_pg_timeout.total_seconds() if TIMEOUT_S is None else TIMEOUT_S
    cpu, deadline, looks = time.thread_time(), time.monotonic() + limit, 0
    try:
        while not done():
            if progress is not None:
                progress()
            os.sched_yield()
            looks += 1
            if looks % 1024 == 0 and time.monotonic() > deadline:
                raise TimeoutError(timed_out(limit))
    finally:
        _waited[0] += time.thread_time() - cpu


def links(peers, nbytes: int, depth: int | None = None) -> dict:
    """global rank -> (sending Link, receiving Link) for every peer this rank can share memory with,
    else None; collective with each of ``peers`` (global ranks), which must call it with this rank
    among theirs and the same ``nbytes`` (the largest message) and ``depth``. Under another backend
    than gloo it exchanges nothing and returns None for all. ``depth``: slots per direction
    (default ``LINK_DEPTH``)."""
    me, peers, depth = dist.get_rank(), sorted(set(peers)), LINK_DEPTH if depth is None else depth
    if not peers or dist.get_backend() != "gloo":
        return {q: None for q in peers}
    with commlog.aside(f"opening shared-memory links to ranks {peers}"):
        return _open_links(me, peers, nbytes, depth)


def _open_links(me: int, peers: list, nbytes: int, depth: int) -> dict:
    ok = why_not_here() is None and nbytes <= MAX_BYTES
    mine = torch.tensor([int(ok), _host_id(), nbytes, depth], dtype=torch.int64)
    theirs = {q: torch.zeros(4, dtype=torch.int64) for q in peers}
    _exchange([(mine, q) for q in peers], [(theirs[q], q) for q in peers], _LINK_TAG)
    for q in peers:
        if theirs[q][2:].tolist() != [nbytes, depth]:
            raise ValueError(f"rank {me} opens links of {nbytes}-byte messages, {depth} slots deep, but rank {q} "
                             f"of {theirs[q][2]} bytes, {theirs[q][3]} deep: both ends must ask for the same")
    shared = [q for q in peers if ok and theirs[q][0] and theirs[q][1] == mine[1]]
    # the lower rank of a pair makes the file and sends its name (empty when /dev/shm is full) ...
    size = 2 * _direction_bytes(nbytes, depth)
    names = {q: _create(size) if me < q else torch.zeros(_NAME_BYTES, dtype=torch.uint8) for q in shared}
    _exchange([(names[q], q) for q in shared if me < q], [(names[q], q) for q in shared if me > q],
              _LINK_TAG + 1)
    paths = {q: bytes(names[q].tolist()).rstrip(b"\0").decode() for q in shared}
    opened = {q: _pair(path, size, nbytes, depth, q, first=me < q) for q, path in paths.items() if path}
    # ... and unlinks it once the other end has it mapped (nothing is left behind)
    done = {q: torch.zeros(1, dtype=torch.int64) for q in shared}
    _exchange([(done[q], q) for q in shared if me > q], [(done[q], q) for q in shared if me < q],
              _LINK_TAG + 2)
    for q, path in paths.items():
        if me < q and path:
            os.unlink(path)
    return {q: opened.get(q) for q in peers}


def _exchange(sends, recvs, tag: int) -> None:
    works = [dist.isend(t, q, tag=tag) for t, q in sends] + [dist.irecv(t, q, tag=tag) for t, q in recvs]
    for work in works:
        work.wait()


def new_file(size: int) -> str:
    """A new zero-filled file of ``size`` bytes in /dev/shm, its space reserved (so a full /dev/shm
    says so now, not with SIGBUS later): its path, or "" when there is no room."""
    path = os.path.join(SHM_DIR, f"parallel_lab-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.unlink(path)
        path = ""
    finally:
        os.close(fd)
    return path


def _create(size: int) -> torch.Tensor:
    """``_new_file``'s path as a fixed-size byte tensor (all zeros when there is no room)."""
    path = new_file(size)
    name = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
    name[: len(path)] = torch.tensor(list(path.encode()), dtype=torch.uint8)
    return name


def _pair(path: str, size: int, nbytes: int, depth: int, peer: int, first: bool) -> tuple[Link, Link]:
    fd = os.open(path, os.O_RDWR)
    try:
        buffer = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    half = _direction_bytes(nbytes, depth)  # the lower rank sends in the first half
    out, back = (0, half) if first else (half, 0)
    return Link(buffer, out, nbytes, depth, peer), Link(buffer, back, nbytes, depth, peer)


def _direction_bytes(nbytes: int, depth: int) -> int:
    return 2 * FLAGS_BYTES + depth * (FLAGS_BYTES + _round_up(nbytes))


def _round_up(n: int) -> int:
    return -(-n // FLAGS_BYTES) * FLAGS_BYTES


def _host_id() -> int:
    return int.from_bytes(hashlib.blake2b(host().encode(), digest_size=8).digest(), "little") >> 1
