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

The same functions run unchanged under torchrun (``parallel_lab.runtime.torchrun``), where NCCL and
CUDA are picked when every rank has a GPU.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import io
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from datetime import timedelta
from multiprocessing import forkserver, resource_tracker

MAX_WORLD_SIZE = 8
DEFAULT_TIMEOUT = 30.0
LOST_PEER_S = 3.0  # how long a failure report waits for a rank whose peers lost their connection to it
_STATUS_BYTES = 240
_IDLE = "idle"


def cores() -> int:
    """CPU cores this process may run on (its affinity, which a container or ``taskset`` narrows
    below ``os.cpu_count()``): the cores its rank processes share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# glibc's malloc (mallopt(3)), which serves every CPU tensor: a block above M_MMAP_THRESHOLD is
# mapped on its own and unmapped when freed; a smaller one comes from the heap, whose top glibc gives
# back to the kernel once more than M_TRIM_THRESHOLD of it is free. Left alone, glibc starts the first
# at 128 KB, raises it to the largest mapped block freed so far (at most DEFAULT_MMAP_THRESHOLD_MAX,
# 32 MB on 64-bit) and keeps the second at twice the first.
MMAP_THRESHOLD = 32 * 2**20  # the ceiling of glibc's own rule
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what that rule sets beside it: at most 64 MB of freed heap kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def keep_freed_memory() -> bool:
    """Fix glibc's two thresholds at the ceiling its own rule moves toward (``MMAP_THRESHOLD``,
    ``TRIM_THRESHOLD``), so that a step's freed tensors stay in the heap for the next step. True
    where that was set (Linux with glibc); elsewhere nothing changes.

    Why: a training step frees its gradients and allocates them again (``zero_grad`` sets them to
    None). Under glibc's moving thresholds the heap's top of a rank could end a step above the trim
    threshold, so glibc gave it back and the next step took it again, faulted in 4 KB at a time: in
    ``bench tensor``'s hidden-1024 tp 2 MLP (two 8 MB weight gradients a rank and side) the top went
    down and up by 16 MB with about 4,096 minor faults an iteration, in 12 of 13 fresh pools, on
    whichever side the heap's layout hit (ours, the peer or the kernels floor), 4-6 ms more CPU time
    in a 13-15 ms iteration; with the thresholds fixed, none in 15 (2026-12-03; the README's
    benchmarks section has the ratios before and after). PyTorch's CPU performance tuning guide
    recommends jemalloc or TCMalloc for the same reuse; neither is in the course's environment,
    mallopt is in glibc. The cost: a rank keeps up to ``TRIM_THRESHOLD`` of freed heap instead of
    returning it, as glibc itself would once it had freed one 32 MB block (every lesson's peak
    memory stayed within 0.01 GB)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


# ----------------------------------------------------------------------------------------------
# Errors: each names the rank and says what happened there.


class RankError(RuntimeError):
    """An exception raised by the function on one rank (``rank``, ``exc_type``, ``remote_traceback``)."""

    def __init__(self, rank, exc_type, message, remote_traceback, others=""):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        super().__init__(
            f"rank {rank} raised {exc_type}: {message}\n\n"
            f"--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}"
            + (f"\n--- the other ranks were stopped ---\n{others}" if others else "")
        )


class RankDied(RuntimeError):
    """A rank process ended without answering (killed, crashed): ``rank``, ``exitcode``."""

    def __init__(self, rank, exitcode, doing, others=""):
        self.rank, self.exitcode = rank, exitcode
        super().__init__(
            f"rank {rank} died with {_describe_exit(exitcode)} while {doing}"
            + (f"\n--- the other ranks were stopped ---\n{others}" if others else "")
        )


class RanksHung(TimeoutError):
    """Ranks still running after the timeout; ``blocked`` maps rank -> what it was doing."""

    def __init__(self, timeout, blocked, report):
        self.timeout, self.blocked = timeout, blocked
        super().__init__(
            f"ranks {sorted(blocked)} did not finish within {timeout:g} s "
            f"(a send without a matching recv, or a collective some rank skipped?); all ranks "
            f"were stopped.\n{report}"
        )


def _forward_output(answers: dict) -> None:
    """Print what the ranks printed, in rank order, each line prefixed with its rank."""
    for rank in sorted(answers):
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            text = answers[rank].get(key)
            if text:
                stream.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))


def _describe_exit(code):
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"exit status {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit status {code} (killed by signal {-code})"
    return f"exit status {code}"


# ----------------------------------------------------------------------------------------------
# Checks made before any process starts.


def check_world_size(world_size) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size must be in 1..{MAX_WORLD_SIZE} (simulated ranks share this machine's "
            f"{os.cpu_count()} cores), got {world_size}"
        )


def check_importable(fn) -> None:
    """Ranks receive ``fn`` by reference (module + name), so it must be importable from a module."""
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}: {fn!r}")
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    module = getattr(fn, "__module__", None)
    advice = (
        "Ranks are separate processes: they import the function by module and name. Define it in "
        "a module (a .py file, e.g. in parallel_lab) and import it; code written in a notebook cell "
        "is checked with the exercise helpers in parallel_lab.exercises, which send its source."
    )
    if "<lambda>" in name:
        raise ValueError(f"cannot run a lambda on ranks. {advice}")
    if module in (None, "__main__") or "<locals>" in name:
        where = "a notebook cell or script (__main__)" if module in (None, "__main__") else "another function"
        raise ValueError(f"cannot run {name!r} on ranks: it is defined in {where}. {advice}")
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot run {module}.{name} on ranks: it cannot be imported ({exc}). {advice}") from None
    if found is not fn:
        raise ValueError(f"cannot run {module}.{name} on ranks: that name now refers to another object. {advice}")


def _pickle_task(fn, args, kwargs) -> bytes:
    try:
        return pickle.dumps(("run", fn, args, kwargs))
    except Exception as exc:  # pickle raises several types; all mean the same here
        raise TypeError(
            f"the arguments for {getattr(fn, '__name__', fn)} cannot be sent to ranks: {exc}. Pass "
            f"tensors, numbers, strings and containers of them (ranks are separate processes)."
        ) from None


# ----------------------------------------------------------------------------------------------
# The parent side: one pool of rank processes per kernel.


def start_method() -> str:
    """``forkserver`` where it exists (Linux, macOS), else ``spawn``; ``fork`` only when asked for
    with one thread per process. ``PARALLEL_LAB_START_METHOD`` overrides it.

    Forking hangs the child once torch's OpenMP threads have run in the parent; with
    ``OMP_NUM_THREADS=1`` there are none, and a process that only checks answers (the grader's
    checking process) saves the forkserver's own import of torch (~3 s of CPU per submission)."""
    wanted = os.environ.get("PARALLEL_LAB_START_METHOD")
    if wanted:
        if wanted == "fork" and os.environ.get("OMP_NUM_THREADS") != "1":
            raise ValueError("PARALLEL_LAB_START_METHOD=fork needs OMP_NUM_THREADS=1: a forked rank hangs once "
                             "torch's OpenMP threads have run in the parent")
        return wanted
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _context():
    """The multiprocessing context ranks start from; a forkserver imports torch once, up front, so
    that every rank it forks starts with torch already loaded."""
    ctx = mp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "parallel_lab.runtime.launcher"])
    return ctx


@contextmanager
def _main_not_rerun():
    """Ranks import ``fn`` by module name and never need ``__main__``, but multiprocessing re-runs the
    caller's script in every new process (and in the forkserver). For a script without an
    ``if __name__ == "__main__"`` guard that would start ranks from ranks; hide the script's path
    while ranks start so that nothing is re-run. (A notebook's ``__main__`` has no path anyway.)"""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if path is None or spec is not None:  # -m module runs are not re-run by multiprocessing
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only (dicts, lists, tuples, strings, bytes, numbers, None): an object that
    would name a class or a function -- and so could run code while it is read -- is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a rank sent {module}.{name}, which is not plain data")


def plain_loads(data: bytes):
    """``pickle.loads`` for what untrusted ranks send (``run(..., untrusted=True)``)."""
    return _PlainUnpickler(io.BytesIO(data)).load()


class Pool:
    """``world_size`` rank processes with a gloo process group, kept between calls. ``loads`` reads
    what the ranks send (``plain_loads`` for ranks that run untrusted code)."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT, loads=pickle.loads):
        ctx = _context()
        self.world_size, self.loads = world_size, loads
        self.procs, self.conns, self.statuses = [], [], []
        try:
            with _main_not_rerun():
                for rank in range(world_size):
                    self._start(ctx, rank, timeout)
            # Rendezvous: rank 0 opens the TCP store on a port the OS picks (so two kernels never
            # collide) and tells us; we pass it on.
            port = self._collect([0], timeout, "starting the process group")[0]
            for conn in self.conns[1:]:
                conn.send_bytes(pickle.dumps(port))
            self._collect(range(world_size), timeout, "starting the process group")
        except BaseException:
            self.kill()
            raise

    def _start(self, ctx, rank, timeout):
        parent_end, child_end = ctx.Pipe(duplex=True)
        status = ctx.Array("c", _STATUS_BYTES, lock=False)
        proc = ctx.Process(
            target=_rank_main,
            args=(rank, self.world_size, child_end, status, os.getpid(), timeout),
            name=f"parallel-lab rank {rank}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        self.procs.append(proc)
        self.conns.append(parent_end)
        self.statuses.append(status)

    def run(self, task: bytes, name: str, timeout: float) -> list:
        for conn in self.conns:
            conn.send_bytes(task)
        return self._collect(range(self.world_size), timeout, f"running {name}")

    def _collect(self, ranks, timeout, doing) -> list:
        """One answer from each of ``ranks``, or an error naming the rank (see module doc)."""
        results = {}
        pending = set(ranks)
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._hung(pending, timeout)
            for rank in self._ready(pending, remaining):
                answer = self._answer(rank)
                if answer is None or answer["kind"] == "error":
                    pending.discard(rank)
                    if answer is not None:
                        results[rank] = answer
                    raise self._failure(results, pending, doing)
                results[rank] = answer
                pending.discard(rank)
        _forward_output(results)
        return [results[rank]["value"] for rank in sorted(results)]

    def _ready(self, pending, timeout) -> list:
        """Ranks among ``pending`` that answered or died within ``timeout`` seconds, in rank order."""
        handles = {self.conns[r]: r for r in pending} | {self.procs[r].sentinel: r for r in pending}
        return sorted({handles[h] for h in mp.connection.wait(list(handles), timeout=timeout)})

    def _answer(self, rank) -> dict | None:
        """The rank's answer, or None when it died without one."""
        if not self.conns[rank].poll():
            return None
        try:
            data = self.conns[rank].recv_bytes()
        except (EOFError, OSError):
            return None
        try:
            return self.loads(data)
        except Exception as exc:  # what an untrusted rank sent is not plain data: its failure
            return {"kind": "error", "type": type(exc).__name__, "message": str(exc), "traceback": "",
                    "out": "", "err": ""}

    def _failure(self, results, pending, doing, grace=0.3) -> Exception:
        """Ranks often fail together (the same bug on every rank, or the peers of a dead rank, who
        then see "connection closed by peer"): give the others a moment, then report the cause — a
        rank that died first, else the lowest rank that raised — so the report does not depend on
        which message happened to arrive first."""
        end = time.monotonic() + grace
        while pending and (ready := self._ready(pending, max(0.0, end - time.monotonic()))):
            for rank in ready:
                answer = self._answer(rank)
                if answer is not None:
                    results[rank] = answer
                pending.discard(rank)
        _forward_output(results)
        dead = self._dead(results)
        if not dead and pending and any(_lost_peer(a) for a in results.values()):
            # a peer's "connection reset" can arrive before its own death shows (a loaded machine
            # tears a process down slowly): wait for a pending rank's end a little longer
            mp.connection.wait([self.procs[r].sentinel for r in pending], timeout=LOST_PEER_S)
            dead = self._dead(results)
        if dead:
            self.procs[dead[0]].join(1.0)
            return RankDied(dead[0], self.procs[dead[0]].exitcode, doing, self._report(exclude={dead[0]}))
        rank = min(r for r, a in results.items() if a["kind"] == "error")
        answer = results[rank]
        return RankError(rank, answer["type"], answer["message"], answer["traceback"],
                         others=self._report(exclude={rank}))

    def _dead(self, results) -> list:
        """Ranks without an answer whose process has ended, in rank order."""
        return [r for r in range(self.world_size) if r not in results and not self.procs[r].is_alive()]

    def status(self, rank) -> tuple[str, float]:
        """What ``rank`` is doing now and for how many seconds (from its shared status slot)."""
        raw = self.statuses[rank].value.decode(errors="replace")
        since, _, text = raw.partition("|")
        try:
            return text or _IDLE, max(0.0, time.time() - float(since))
        except ValueError:
            return _IDLE, 0.0

    def _report(self, exclude=()) -> str:
        lines = []
        for rank, proc in enumerate(self.procs):
            if rank in exclude:
                continue
            if not proc.is_alive():
                lines.append(f"  rank {rank}: exited, {_describe_exit(proc.exitcode)}")
                continue
            text, seconds = self.status(rank)
            lines.append(f"  rank {rank}: {text} (for {seconds:.1f} s)")
        return "\n".join(lines)

    def _hung(self, pending, timeout) -> RanksHung:
        blocked = {rank: self.status(rank)[0] for rank in sorted(pending)}
        return RanksHung(timeout, blocked, self._report())

    def close(self, grace: float = 5.0) -> None:
        """Stop the ranks politely (barrier, destroy the process group); kill what is left."""
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(("stop",)))
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(5.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.statuses = [], [], []


_pool: Pool | None = None
_lock = threading.Lock()
# True when the forkserver and resource tracker were started for our ranks (and so are ours to
# stop); a tracker some other code started keeps running, since stopping it would clean up its
# resources.
_helpers_are_ours = False


def _note_helpers() -> None:
    global _helpers_are_ours

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None and \
            getattr(resource_tracker._resource_tracker, "_fd", None) is None:
        _helpers_are_ours = True


def run(fn, world_size: int = 4, args: tuple = (), kwargs: dict | None = None, *,
        timeout: float = DEFAULT_TIMEOUT, untrusted: bool = False) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks with torch.distributed initialised (gloo);
    return the list of the ranks' return values, indexed by rank.

    ``fn`` must be importable (defined in a module); arguments and results are pickled.
    Raises RankError / RankDied / RanksHung (see the module doc); the pool then restarts on the
    next call. ``timeout`` bounds the whole call, including starting the ranks.

    ``untrusted``: ``fn`` runs code this process must not trust (a student's answer). The call gets
    ranks of its own, stopped afterwards, so that no later call runs on ranks the code may have
    changed, and what they send back is read as plain data only (``plain_loads``): results must be
    dicts, lists, tuples, strings, bytes, numbers and None. The kernel's pool is stopped first, so
    that only one set of ranks holds memory.
    """
    global _pool
    check_world_size(world_size)
    check_importable(fn)
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    task = _pickle_task(fn, tuple(args), dict(kwargs or {}))
    if untrusted:
        return _run_untrusted(fn, world_size, task, timeout)
    with _lock:
        try:
            if _pool is not None and _pool.world_size != world_size:
                _pool.close()
                _pool = None
            if _pool is None:
                _note_helpers()
                _pool = Pool(world_size, timeout)
            return _pool.run(task, getattr(fn, "__qualname__", str(fn)), timeout)
        except BaseException:  # an error, a hang or Ctrl-C: no rank may outlive it
            if _pool is not None:
                _pool.kill()
            _pool = None
            raise


def _run_untrusted(fn, world_size: int, task: bytes, timeout: float) -> list:
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None
        _note_helpers()
        pool = None
        try:
            pool = Pool(world_size, timeout, loads=plain_loads)
            return pool.run(task, getattr(fn, "__qualname__", str(fn)), timeout)
        finally:
            if pool is not None:
                pool.kill()


def warm(wait: bool = False) -> None:
    """Start the forkserver now, in the background (``parallel_lab.course.notebook.setup`` does).

    Most of a pool's cold start is the forkserver importing torch, seconds on a small machine.
    Started early, it does that while the student reads (or while the kernel imports torch itself,
    on the other core); the first ``run`` then only forks ranks from it. ``wait=True`` returns once
    it is ready. Does nothing with the ``spawn`` start method. ``shutdown`` stops it."""
    ctx = _context()
    if ctx.get_start_method() != "forkserver":
        return

    with _lock, _main_not_rerun():
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
            for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
                helper._stop()
            _helpers_are_ours = False


def pool_pids() -> list[int]:
    """Process ids of the current pool's ranks (empty when no pool is up)."""
    return [proc.pid for proc in _pool.procs] if _pool is not None else []


atexit.register(shutdown)


# ----------------------------------------------------------------------------------------------
# The rank side. torch is imported here, in the functions ranks run, not at the top of this module:
# the kernel imports the launcher first, and ``warm`` then starts the forkserver, which imports
# torch (~3 s on 2 cores) while the kernel imports it too (measured: the first 4-rank run after
# ``parallel_lab.course.notebook.setup`` takes ~0.1 s instead of ~2.4 s).


def backend_and_device(world_size: int, local_rank: int):
    """NCCL on ``cuda:local_rank`` when every local rank has its own GPU, else gloo on the CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def _rank_main(rank, world_size, conn, status, parent_pid, timeout):
    import torch
    import torch.distributed as dist

    from parallel_lab.runtime import commlog

    # Each rank is one simulated device: one thread, so that N ranks on few cores stay honest.
    torch.set_num_threads(1)
    keep_freed_memory()  # a step's freed tensors are there for the next one (see keep_freed_memory)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the kernel, which stops us
    _exit_when_parent_dies(parent_pid)
    current = [_IDLE]

    def set_status(text):
        line = f"{time.time():.3f}|{text or current[0]}"
        status.value = line.encode()[: _STATUS_BYTES - 1]

    try:
        set_status("starting the process group")
        backend, _ = backend_and_device(world_size, rank)
        # The store: rank 0 listens on a port chosen by the OS, the others learn it from the parent.
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                  timeout=timedelta(seconds=timeout), wait_for_workers=False)
            conn.send_bytes(pickle.dumps({"kind": "ok", "value": store.port}))
        else:
            port = pickle.loads(conn.recv_bytes())
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                                  timeout=timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=max(timeout, 60.0)))
        commlog.install(set_status)
        set_status(_IDLE)
        conn.send_bytes(pickle.dumps({"kind": "ok", "value": rank}))
    except BaseException as exc:
        _send_error(conn, exc)
        return
    _serve(conn, current, set_status)
    try:  # stop: leave together, or async work still in flight sees "connection reset by peer"
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _serve(conn, current, set_status):
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the kernel is gone: nobody to say goodbye to
        if message[0] == "stop":
            return
        _, fn, args, kwargs = message
        current[0] = f"running {getattr(fn, '__qualname__', fn)}"
        set_status(None)
        # What the function prints goes back with its result and is shown as "[rank r] ..." in the
        # notebook, in rank order (not interleaved on the kernel's terminal).
        out, err = io.StringIO(), io.StringIO()
        try:
            with redirect_stdout(out), redirect_stderr(err):
                result = fn(*args, **kwargs)
        except BaseException as exc:  # report everything, even SystemExit, instead of vanishing
            _send_error(conn, exc, out=out.getvalue(), err=err.getvalue())
        else:
            try:
                conn.send_bytes(pickle.dumps({"kind": "ok", "value": result,
                                              "out": out.getvalue(), "err": err.getvalue()}))
            except Exception as exc:
                _send_error(conn, exc, "the return value could not be sent back: ",
                            out=out.getvalue(), err=err.getvalue())
        current[0] = f"finished {getattr(fn, '__qualname__', fn)}"
        set_status(None)


def _lost_peer(answer: dict) -> bool:
    """Whether a rank's error says a peer's connection went away (that peer likely died)."""
    message = answer.get("message", "") if answer.get("kind") == "error" else ""
    return any(words in message for words in ("Connection reset by peer", "Connection closed by peer"))


def _send_error(conn, exc, prefix="", out="", err=""):
    conn.send_bytes(pickle.dumps({"kind": "error", "type": type(exc).__name__,
                                  "message": prefix + str(exc), "traceback": traceback.format_exc(),
                                  "out": out, "err": err}))


def _exit_when_parent_dies(parent_pid):
    """A daemon thread that ends this rank if the kernel that started it disappears."""

    def watch():
        while True:
            time.sleep(0.5)
            try:
                os.kill(parent_pid, 0)
            except OSError:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parallel-lab parent watch").start()
