"""Small functions to run on ranks: the launcher's hello world and its failure modes.

Lesson 01 runs them to show what a student sees when a rank fails or hangs; the launcher's tests
run them to check that every failure is reported by rank and that no process is left behind. What
they print or raise is in the lesson's language: a rank runs its task in the language of the process
that sent it (``rank_process``).
"""

import ctypes
import os
import resource
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from parallel_lab.i18n import N_, _
from parallel_lab.runtime import commlog, shared_memory, transport

# What lesson 00 has a rank raise (``fail_on``): in the catalog, so the rank shows it translated.
OUT_OF_MEMORY = N_("pretend this rank ran out of memory")
# Lesson 01 prints these functions (``i18n.source``): their docstrings are in the catalog too.
SHOWN_DOCSTRINGS = ("hello", "unmatched_send")


def hello():
    """Each rank contributes ``rank + 1``; all-reduce sums them: ``world * (world + 1) / 2``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return {"rank": rank, "world_size": world, "pid": os.getpid(), "sum": total.item()}


def rank_id():
    """The cheapest possible task: returns this rank's number (used to time warm re-runs)."""
    return dist.get_rank()


def echo(*args, **kwargs):
    """Returns its arguments, to show that tensors and plain objects travel both ways."""
    return {"rank": dist.get_rank(), "args": args, "kwargs": kwargs}


def fail_on(rank, message=N_("something went wrong")):
    """Raises ValueError on ``rank``; the other ranks then wait in a barrier that never completes.
    A ``message`` the catalog has (``OUT_OF_MEMORY``) is raised in the lesson's language."""
    if dist.get_rank() == rank:
        raise ValueError(_(message))
    dist.barrier()


def unmatched_send(shape=(4, 8)):
    """Rank 0 sends to rank 1, which never receives: rank 1 waits in a barrier rank 0 never joins
    (gloo buffers small sends, so rank 0 goes on to wait for a reply that never comes)."""
    if dist.get_rank() == 0:
        dist.send(torch.ones(shape), dst=1)
        dist.recv(torch.empty(shape), src=1)
    else:
        dist.barrier()


def skipped_collective():
    """Every rank but the last calls all_reduce; they wait forever for the one that skipped it."""
    if dist.get_rank() != dist.get_world_size() - 1:
        dist.all_reduce(torch.ones(3))
    else:
        time.sleep(3600)


def die_on(rank, how="kill"):
    """Rank ``rank`` ends abruptly: ``kill`` (SIGKILL), ``segfault`` (SIGSEGV) or ``exit`` (status 3)."""
    if dist.get_rank() == rank:
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSEGV)
    dist.barrier()


def die_after_peer_noticed(delay: float = 0.6):
    """Rank 0 fails at once as gloo does when a peer's process goes away ("Connection reset by
    peer"); rank 1 really dies ``delay`` seconds later (a process torn down slowly); the others
    return."""
    if dist.get_rank() == 0:
        raise RuntimeError("[gloo/transport/tcp/pair.cc] Read error [127.0.0.1]: Connection reset by peer")
    if dist.get_rank() == 1:
        time.sleep(delay)
        os._exit(3)
    return dist.get_rank()


def words(message: str) -> str:
    """``_(message)`` on this rank (the tests' proof that a rank speaks the language of its task)."""
    return _(message)


def sleep(seconds):
    """Sleeps on every rank (used to test interrupting a running call)."""
    time.sleep(seconds)
    return dist.get_rank()


def heap_refaults(blocks: int = 3, megabytes: int = 12, rounds: int = 3) -> list[int]:
    """This rank's minor page faults in each of ``rounds`` rounds of taking ``blocks`` blocks of
    ``megabytes`` MB from malloc, writing them and freeing them, as a training step does with its
    gradients (straight from libc, so that nothing else lands between the blocks). After the first
    round 0 when freed memory stays in the heap (``allocator.keep_freed_memory``); under glibc's own
    moving thresholds a fresh process gives the heap's top back at the end of every round."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, faults = megabytes * 2**20, []
    for _round in range(rounds):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        held = [libc.malloc(size) for _block in range(blocks)]
        for address in held:
            ctypes.memset(address, 1, size)
        for address in held:
            libc.free(address)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return faults


def exit_early():
    """Calls sys.exit on rank 0: reported as an error, not a silently missing rank."""
    if dist.get_rank() == 0:
        sys.exit(2)
    return dist.get_rank()


def unpicklable_result():
    """Returns a lock, which cannot be pickled back to the notebook."""
    return threading.Lock()


def say_hello():
    """Prints on every rank: the notebook shows each line prefixed with its rank, in rank order."""
    print(_("hello from rank {rank} of {world}").format(rank=dist.get_rank(), world=dist.get_world_size()))
    return dist.get_rank()


def count_collectives():
    """One all-reduce, one all-gather and a send/recv pair, recorded by commlog."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with commlog.recording() as log:
        dist.all_reduce(torch.ones(4))
        dist.all_gather_single(torch.empty(2 * world), torch.ones(2))
        if rank == 0:
            dist.send(torch.ones(3, dtype=torch.float64), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(3, dtype=torch.float64), src=0)
    return log.as_dict()


def one_shot_against_gloo(numel: int = 1000, groups_of: int | None = None):
    """``transport.all_reduce`` (one shot when small) beside ``dist.all_reduce`` on the same random
    fp64 tensor, in the world or in consecutive groups of ``groups_of`` ranks (each group its own
    data), plain and ``async_op``, and ``one_shot_all_reduce`` itself. Returns what the test compares:
    the sums (to check the ranks agree bit for bit), which algorithm ``all_reduce`` chose and the
    calls commlog recorded."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = None
    if groups_of:
        groups = [dist.new_group(list(range(s, s + groups_of))) for s in range(0, world, groups_of)]
        group = groups[rank // groups_of]
    x = torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    ours, peer, later, direct = x.clone(), x.clone(), x.clone(), x.clone()
    with commlog.recording() as log:
        transport.all_reduce(ours, group)
    dist.all_reduce(peer, group=group)
    pending = transport.all_reduce(later, group, async_op=True)
    transport.one_shot_all_reduce(direct, group)  # the algorithm itself, at any size
    return {"ours": ours, "gloo": peer, "async": pending.wait(), "one_shot": direct,
            "used_one_shot": transport.uses_one_shot(x, group),
            "used_shared_memory": transport.uses_shared_memory(x, group), "calls": log.as_dict()}


def shared_memory_sums(calls: int = 40, seed: int = 0):
    """``calls`` all-reduces of fresh integer-valued tensors (exact sums) through
    ``transport.all_reduce``, alternating between the world and a second group of the same ranks
    (two channels), each rank sleeping a random few milliseconds before some calls so that ranks
    run ahead of each other. Returns the sums, each rank's inputs' seed, whether shared memory was
    used and this rank's spun CPU seconds."""
    rank, world = dist.get_rank(), dist.get_world_size()
    other = dist.new_group(list(range(world)))
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    waited, sums = shared_memory.waited_seconds(), []
    for i in range(calls):
        group = None if i % 2 else other
        x = torch.randint(-1000, 1000, (1 + 97 * i % 4000,), generator=gen).double()
        if torch.rand((), generator=gen) < 0.3:
            time.sleep(0.004 * torch.rand((), generator=gen).item())
        sums.append(transport.all_reduce(x, group))
    if rank == 1:
        time.sleep(0.05)  # rank 0 waits 50 ms in the next call: spun time, kept apart
    transport.all_reduce(torch.ones(8))
    dist.destroy_process_group(other)
    return {"sums": sums, "used": transport.uses_shared_memory(torch.ones(8)),
            "waited": shared_memory.waited_seconds() - waited}


def shared_memory_missing_rank(timeout: float = 0.5):
    """Rank 0 all-reduces through shared memory, rank 1 never does: rank 0's wait ends in a
    TimeoutError after ``timeout`` seconds naming rank 1."""
    shared_memory.TIMEOUT_S = timeout
    try:
        transport.all_reduce(torch.ones(4))  # both: the channel opens
        if dist.get_rank() == 0:
            transport.all_reduce(torch.ones(4))
        else:
            time.sleep(timeout + 2)
    finally:
        shared_memory.TIMEOUT_S = None


def fail_on_all(message="the same bug on every rank"):
    """Raises on every rank at once (a bug in code all ranks run): rank 0 is the one reported."""
    time.sleep(0.01 * (dist.get_world_size() - dist.get_rank()))  # higher ranks fail first
    raise ValueError(message)
