"""Simulated GPUs: run an importable function on N rank processes with torch.distributed ready.

    from parallel_lab.runtime import launcher, demos
    launcher.run(demos.hello, world_size=4)      # -> [rank 0's return value, ..., rank 3's]

Introduced in lessons/01_ranks_and_collectives.ipynb. What it guarantees, from a notebook kernel:

- **Safe start.** Ranks come from an explicit ``forkserver`` context with torch preloaded (``spawn``
  where forkserver does not exist), never ``fork``: forking a process whose OpenMP threads have run
  hangs the child.
- **A persistent pool.** Ranks stay up between calls with their gloo process group initialised, so a
  re-run costs a pipe round trip. A different world size replaces the pool; any failure discards it
  and the next call starts a fresh one.
- **No frozen cell.** An exception on a rank is raised here naming the rank, with its traceback; a
  rank that dies is reported with its exit status; ranks still running after ``timeout`` seconds are
  reported with the operation each one is blocked in (see ``commlog``); Ctrl-C / "interrupt kernel"
  stops them all. In every case no process is left behind.
- **Checked before start.** A bad world size, a function that is not importable (a lambda, a
  function defined in a notebook cell) or arguments that cannot be pickled fail at once.
  ``prepare`` makes the checks and ``start`` runs what it returns, for a caller that has work to do
  before its ranks start (``run`` is both, for everyone else).

This module is the entry point and holds the kernel's one pool; the parts are modules of their own:
``prelaunch`` (the checks), ``pool`` (the rank processes, seen from here), ``rank_process`` (a rank's loop,
its messages and the plain-data reader for untrusted ranks), ``errors`` (what a failure raises) and
``allocator`` (how a rank keeps its freed memory). The names a caller needs are importable from here.

The same functions run unchanged under torchrun (``parallel_lab.runtime.torchrun``), where NCCL and
CUDA are picked when every rank has a GPU.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import forkserver

from parallel_lab.runtime import pool as pools
from parallel_lab.runtime import rank_process
from parallel_lab.runtime.errors import RankDied, RankError, RanksHung
from parallel_lab.runtime.prelaunch import MAX_WORLD_SIZE, check_importable, check_timeout, check_world_size, cores

__all__ = ["run", "prepare", "start", "Launch", "warm", "shutdown", "pool_pids", "DEFAULT_TIMEOUT",
           "MAX_WORLD_SIZE", "cores", "RankError", "RankDied", "RanksHung"]

DEFAULT_TIMEOUT = 30.0

_pool: pools.Pool | None = None
_lock = threading.Lock()
# True when the forkserver and resource tracker were started for our ranks (and so are ours to stop).
_helpers_are_ours = False


def _note_helpers() -> None:
    global _helpers_are_ours
    if not pools.helpers_running():
        _helpers_are_ours = True


@dataclass(frozen=True)
class Launch:
    """A launch whose checks passed (``prepare``): ``start`` runs it without checking again."""
    fn: Callable
    world_size: int
    timeout: float
    untrusted: bool = False


def prepare(fn, world_size: int = 4, *, timeout: float = DEFAULT_TIMEOUT, untrusted: bool = False) -> Launch:
    """Check a launch before anything starts (world size, an importable ``fn``, the timeout; see
    ``prelaunch``) and return it for ``start``. A caller with work to do before its ranks start
    (a reference to compute, a schedule to build) prepares first, so that a launch that cannot work
    fails before that work, and the checks are made once."""
    check_world_size(world_size)
    check_importable(fn)
    check_timeout(timeout)
    return Launch(fn, world_size, timeout, untrusted)


def run(fn, world_size: int = 4, args: tuple = (), kwargs: dict | None = None, *,
        timeout: float = DEFAULT_TIMEOUT, untrusted: bool = False) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks with torch.distributed initialised (gloo);
    return the list of the ranks' return values, indexed by rank. ``prepare`` then ``start``.

    ``fn`` must be importable (defined in a module); arguments and results are pickled.
    Raises RankError / RankDied / RanksHung (see the module doc); the pool then restarts on the
    next call. ``timeout`` bounds the whole call, including starting the ranks.

    ``untrusted``: ``fn`` runs code this process must not trust (a student's answer). The call gets
    ranks of its own, stopped afterwards, so that no later call runs on ranks the code may have
    changed, and what they send back is read as plain data only (``rank_process.plain_loads``): results must
    be dicts, lists, tuples, strings, bytes, numbers and None. The kernel's pool is stopped first, so
    that only one set of ranks holds memory.
    """
    return start(prepare(fn, world_size, timeout=timeout, untrusted=untrusted), args, kwargs)


def start(launch: Launch, args: tuple = (), kwargs: dict | None = None) -> list:
    """Run a prepared launch with these arguments (``run``'s results and errors). Arguments that
    cannot be pickled are refused here, still before any rank starts."""
    global _pool
    if not isinstance(launch, Launch):
        raise TypeError(f"start takes a Launch from launcher.prepare, got {type(launch).__name__}")
    fn, world_size, timeout = launch.fn, launch.world_size, launch.timeout
    task = rank_process.encode_task(fn, tuple(args), dict(kwargs or {}))
    name = getattr(fn, "__qualname__", str(fn))
    if launch.untrusted:
        return _run_untrusted(name, world_size, task, timeout)
    with _lock:
        try:
            if _pool is not None and _pool.world_size != world_size:
                _pool.close()
                _pool = None
            if _pool is None:
                _note_helpers()
                _pool = pools.Pool(world_size, timeout)
            return _pool.run(task, name, timeout)
        except BaseException:  # an error, a hang or Ctrl-C: no rank may outlive it
            if _pool is not None:
                _pool.kill()
            _pool = None
            raise


def _run_untrusted(name: str, world_size: int, task: bytes, timeout: float) -> list:
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None
        _note_helpers()
        pool = None
        try:
            pool = pools.Pool(world_size, timeout, loads=rank_process.plain_loads)
            return pool.run(task, name, timeout)
        finally:
            if pool is not None:
                pool.kill()


def warm(wait: bool = False) -> None:
    """Start the forkserver now, in the background (``parallel_lab.course.notebook.setup`` does).

    Most of a pool's cold start is the forkserver importing torch, seconds on a small machine.
    Started early, it does that while the student reads (or while the kernel imports torch itself,
    on the other core); the first ``run`` then only forks ranks from it. ``wait=True`` returns once
    it is ready. Does nothing with the ``spawn`` start method. ``shutdown`` stops it."""
    ctx = pools.context()
    if ctx.get_start_method() != "forkserver":
        return
    with _lock, pools.main_not_rerun():
        _note_helpers()
        forkserver.ensure_running()  # returns at once; the server imports torch before it forks
        if wait:  # the first fork is served only after the preload
            probe = ctx.Process(target=os.getpid, name="parallel-lab forkserver probe", daemon=True)
            probe.start()
            probe.join()


def shutdown() -> None:
    """Stop the pool's ranks and the helper processes multiprocessing started for them (forkserver,
    resource tracker): afterwards no process of ours is left."""
    global _pool, _helpers_are_ours
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None
        if _helpers_are_ours:
            pools.stop_helpers()
            _helpers_are_ours = False


def pool_pids() -> list[int]:
    """Process ids of the current pool's ranks (empty when no pool is up)."""
    return _pool.pids() if _pool is not None else []


atexit.register(shutdown)
