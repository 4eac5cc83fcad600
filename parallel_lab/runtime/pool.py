"""The parent's side: a pool of rank processes with a gloo process group, kept between calls.

``Pool(world_size, timeout)`` starts ``world_size`` processes (each runs ``rank_process.main``), passes rank
0's store port on to the others, and waits until every rank has joined the process group.
``Pool.run`` sends one task to every rank and collects one answer from each, or raises an error
naming the rank (``runtime.errors``): the lowest rank that raised, a rank that died, or the ranks
still running after ``timeout`` with the operation each one is blocked in. The caller
(``launcher``) kills the pool after any failure.

Ranks start from an explicit ``forkserver`` context with torch preloaded (``spawn`` where forkserver
does not exist), never ``fork``: forking a process whose OpenMP threads have run hangs the child.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import sys
import time
from contextlib import contextmanager
from multiprocessing import forkserver, resource_tracker

from parallel_lab.i18n import _
from parallel_lab.runtime import rank_process
from parallel_lab.runtime.errors import RankDied, RankError, RanksHung, describe_exit

LOST_PEER_S = 3.0  # how long a failure report waits for a rank whose peers lost their connection to it


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


def context():
    """The multiprocessing context ranks start from; a forkserver imports torch once, up front, so
    that every rank it forks starts with torch already loaded."""
    ctx = mp.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "parallel_lab.runtime.rank_process"])
    return ctx


@contextmanager
def main_not_rerun():
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


# multiprocessing starts a forkserver and a resource tracker for the ranks, and has no public way to
# ask whether they run or to stop them (ensure_running only starts them). These two functions are the
# only places that read its private state; a tracker some other code started must keep running,
# since stopping it would clean up that code's resources.


def helpers_running() -> bool:
    """Whether this process's forkserver or resource tracker has been started."""
    return (getattr(forkserver._forkserver, "_forkserver_pid", None) is not None
            or getattr(resource_tracker._resource_tracker, "_fd", None) is not None)


def stop_helpers() -> None:
    """Stop the forkserver and the resource tracker (private ``_stop``: no public one exists)."""
    for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
        helper._stop()


def forward_output(answers: dict) -> None:
    """Print what the ranks printed, in rank order, each line prefixed with its rank."""
    for rank in sorted(answers):
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            text = answers[rank].get(key)
            if text:
                stream.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))


class Pool:
    """``world_size`` rank processes with a gloo process group, kept between calls. ``loads`` reads
    what the ranks send (``rank_process.plain_loads`` for ranks that run untrusted code)."""

    def __init__(self, world_size: int, timeout: float, loads=pickle.loads):
        ctx = context()
        self.world_size, self.loads = world_size, loads
        self.procs, self.conns, self.statuses = [], [], []
        try:
            with main_not_rerun():
                for rank in range(world_size):
                    self._start(ctx, rank, timeout)
            # Rendezvous: rank 0 opens the TCP store on a port the OS picks (so two kernels never
            # collide) and tells us; we pass it on.
            port = self._collect([0], timeout, _("starting the process group"))[0]
            for conn in self.conns[1:]:
                conn.send_bytes(pickle.dumps(port))
            self._collect(range(world_size), timeout, _("starting the process group"))
        except BaseException:
            self.kill()
            raise

    def _start(self, ctx, rank, timeout):
        parent_end, child_end = ctx.Pipe(duplex=True)
        status = ctx.Array("c", rank_process.STATUS_BYTES, lock=False)
        proc = ctx.Process(
            target=rank_process.main,
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
        """Send ``task`` (``rank_process.encode_task``) to every rank; their values, indexed by rank."""
        for conn in self.conns:
            conn.send_bytes(task)
        return self._collect(range(self.world_size), timeout, _("running {name}").format(name=name))

    def _collect(self, ranks, timeout, doing) -> list:
        """One answer from each of ``ranks``, or an error naming the rank (see the module doc)."""
        results = {}
        pending = set(ranks)
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._hung(pending, timeout)
            for rank in self._ready(pending, remaining):
                answer = self._answer(rank)
                pending.discard(rank)
                if answer is None:
                    raise self._failure(results, pending, doing, ended={rank})
                results[rank] = answer
                if answer["kind"] == "error":
                    raise self._failure(results, pending, doing, ended=set())
        forward_output(results)
        return [results[rank]["value"] for rank in sorted(results)]

    def _ready(self, pending, timeout) -> list:
        """Ranks among ``pending`` that answered or died within ``timeout`` seconds, in rank order."""
        handles = {self.conns[r]: r for r in pending} | {self.procs[r].sentinel: r for r in pending}
        return sorted({handles[h] for h in mp.connection.wait(list(handles), timeout=timeout)})

    def _answer(self, rank) -> dict | None:
        """The rank's answer, or None when it ended without one: its process is gone, or its end of
        the pipe closed, which a rank does only by ending."""
        if not self.conns[rank].poll():
            return None
        try:
            data = self.conns[rank].recv_bytes()
        except (EOFError, OSError):
            return None
        try:
            return self.loads(data)
        except Exception as exc:  # what an untrusted rank sent is not plain data: its failure
            return rank_process.unreadable(exc)

    def _take(self, ready, results, pending, ended) -> None:
        """Read the ranks in ``ready``: an answer goes to ``results``, an end without one to ``ended``."""
        for rank in ready:
            answer = self._answer(rank)
            if answer is None:
                ended.add(rank)
            else:
                results[rank] = answer
            pending.discard(rank)

    def _failure(self, results, pending, doing, ended, grace=0.3) -> Exception:
        """Ranks often fail together (the same bug on every rank, or the peers of a dead rank, who
        then see "connection closed by peer"): give the others a moment, then report the cause -- a
        rank that died first, else the lowest rank that raised -- so the report does not depend on
        which message happened to arrive first.

        ``ended``: ranks that ended without an answer. A rank's death shows first as the end of its
        pipe, and only later as its exit status (the forkserver, its parent, must reap it and pass
        the status on, which a loaded machine delays), so a rank counts as dead from the end of its
        pipe on; its exit status is then waited for, up to ``LOST_PEER_S``."""
        end = time.monotonic() + grace
        while pending and (ready := self._ready(pending, max(0.0, end - time.monotonic()))):
            self._take(ready, results, pending, ended)
        if not ended and pending and any(rank_process.lost_peer(a) for a in results.values()):
            # a peer's "connection reset" can arrive before the dead rank's end shows at all (a
            # loaded machine tears a process down slowly): wait for a pending rank's end a little longer
            end = time.monotonic() + LOST_PEER_S
            while pending and not ended and (ready := self._ready(pending, max(0.0, end - time.monotonic()))):
                self._take(ready, results, pending, ended)
        forward_output(results)
        dead = sorted(ended | set(self._dead(results)))
        if dead:
            self.procs[dead[0]].join(LOST_PEER_S)
            return RankDied(dead[0], self.procs[dead[0]].exitcode, doing, self._report(exclude={dead[0]}))
        rank = min(r for r, a in results.items() if a["kind"] == "error")
        answer = results[rank]
        return RankError(rank, answer["type"], answer["message"], answer["traceback"],
                         others=self._report(exclude={rank}))

    def _dead(self, results) -> list:
        """Ranks without an answer whose process has ended, in rank order."""
        return [r for r in range(self.world_size) if r not in results and not self.procs[r].is_alive()]

    def status(self, rank) -> tuple[str, float]:
        """What ``rank`` is doing now, in this process's language, and for how many seconds (from its
        shared status slot)."""
        text, seconds = rank_process.read_status(self.statuses[rank])
        return rank_process.shown(text), seconds

    def _report(self, exclude=()) -> str:
        lines = []
        for rank, proc in enumerate(self.procs):
            if rank in exclude:
                continue
            if not proc.is_alive():
                lines.append("  " + _("rank {rank}: exited, {exit}").format(rank=rank,
                                                                             exit=describe_exit(proc.exitcode)))
                continue
            text, seconds = self.status(rank)
            lines.append("  " + _("rank {rank}: {doing} (for {seconds:.1f} s)").format(rank=rank, doing=text,
                                                                                      seconds=seconds))
        return "\n".join(lines)

    def _hung(self, pending, timeout) -> RanksHung:
        blocked = {rank: self.status(rank)[0] for rank in sorted(pending)}
        return RanksHung(timeout, blocked, self._report())

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def close(self, grace: float = 5.0) -> None:
        """Stop the ranks politely (barrier, destroy the process group); kill what is left."""
        for conn in self.conns:
            try:
                conn.send_bytes(rank_process.STOP)
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
