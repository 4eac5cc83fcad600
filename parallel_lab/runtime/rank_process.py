"""One rank process: its loop, and the messages it exchanges with the process that started it.

A rank (``main``, the target ``pool.Pool`` starts) joins the gloo process group, then serves tasks
from its pipe until it is told to stop, or until its parent is gone:

    parent -> rank   ``encode_task(fn, args, kwargs, lang)``: run ``fn(*args, **kwargs)`` speaking ``lang``;
                     ``STOP``: leave
    rank -> parent   an answer: ``{"kind": "ok", "value": ..., "out": ..., "err": ...}``, or
                     ``{"kind": "error", "type", "message", "traceback", "out", "err"}``

A task carries the parent's language (``i18n.language()`` where it was encoded: the lesson's, or a
grader's ``using`` block), and the rank runs it inside ``i18n.using(lang)``, so that what a rank
function shows through ``_()`` (what it prints, the text of what it raises) is in the lesson's
language. The language travels from parent to rank only, as a plain string; an answer stays plain
data. Messages are plain pickles (tensors travel as copies, never as shared-memory handles). What a rank
prints travels back with its answer, so the notebook shows it in rank order. A rank also writes what
it is doing into a small shared status slot (``write_status`` / ``read_status``), which the parent
reads when ranks hang, to say which operation each one is blocked in (``commlog`` keeps it current).

Ranks that run code this process must not trust (a student's answer, ``launcher.run(...,
untrusted=True)``) are read with ``plain_loads``: plain data only, since unpickling an object that
names a class or a function can run code.

torch is imported inside the functions ranks run, not at the top of this module: the kernel imports
the launcher (and so this module) first, and ``launcher.warm`` then starts the forkserver, which
imports torch while the kernel imports it too (on another core).
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import threading
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from datetime import timedelta

from parallel_lab.i18n import _, check_language, language, using
from parallel_lab.runtime.allocator import keep_freed_memory

STATUS_BYTES = 240
# What a rank's status slot says outside its communication calls. The rank writes these English
# keys (a task's language is not known before the first task); the parent words them (``shown``).
IDLE = "idle"
STARTING = "starting the process group"
RUNNING, FINISHED = "running ", "finished "
STOP = pickle.dumps(("stop",))


# ----------------------------------------------------------------------------------------------
# The messages.


def encode_task(fn, args: tuple, kwargs: dict, lang: str | None = None) -> bytes:
    """The message that runs ``fn(*args, **kwargs)`` on every rank in ``lang`` (default: this
    process's language now, ``i18n.language()``); a TypeError, before any process starts, when an
    argument cannot be sent."""
    lang = check_language(lang or language())
    try:
        return pickle.dumps(("run", fn, args, kwargs, lang))
    except Exception as exc:  # pickle raises several types; all mean the same here
        raise TypeError(_("the arguments for {name} cannot be sent to ranks: {error}. Pass tensors, numbers, "
                          "strings and containers of them (ranks are separate processes).").format(
                              name=getattr(fn, "__name__", fn), error=exc)) from None


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only (dicts, lists, tuples, strings, bytes, numbers, None): an object that
    would name a class or a function -- and so could run code while it is read -- is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a rank sent {module}.{name}, which is not plain data")


def plain_loads(data: bytes):
    """``pickle.loads`` for what untrusted ranks send (``launcher.run(..., untrusted=True)``)."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def unreadable(exc: Exception) -> dict:
    """The answer standing for one that could not be read (an untrusted rank sent no plain data)."""
    return {"kind": "error", "type": type(exc).__name__, "message": str(exc), "traceback": "", "out": "", "err": ""}


# How gloo words a peer's connection that went away (its pair.cc: a read that failed with ECONNRESET,
# a peer that closed its socket, a write that failed with EPIPE).
LOST_PEER_WORDS = ("connection reset by peer", "connection closed by peer", "broken pipe")


def lost_peer(answer: dict) -> bool:
    """Whether a rank's error says a peer's connection went away (that peer likely died)."""
    message = str(answer.get("message", "")).lower() if answer.get("kind") == "error" else ""
    return any(words in message for words in LOST_PEER_WORDS)


def write_status(slot, text: str) -> None:
    """Record in ``slot`` (a shared char array of ``STATUS_BYTES``) what this rank does from now on."""
    slot.value = f"{time.time():.3f}|{text}".encode()[: STATUS_BYTES - 1]


def shown(status: str) -> str:
    """A status as the parent shows it, in its language: the keys above translated, a communication
    call (``send(dst=1, ...)``, what commlog writes) as it is."""
    if status == IDLE:
        return _("idle")
    if status == STARTING:
        return _("starting the process group")
    for key, words in ((RUNNING, _("running {name}")), (FINISHED, _("finished {name}"))):
        if status.startswith(key):
            return words.format(name=status.removeprefix(key))
    return status


def read_status(slot) -> tuple[str, float]:
    """What the rank writing ``slot`` is doing, and for how many seconds."""
    since, _, text = slot.value.decode(errors="replace").partition("|")
    try:
        return text or IDLE, max(0.0, time.time() - float(since))
    except ValueError:
        return IDLE, 0.0


# ----------------------------------------------------------------------------------------------
# The rank's side.


def backend_and_device(world_size: int, local_rank: int):
    """NCCL on ``cuda:local_rank`` when every local rank has its own GPU, else gloo on the CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def main(rank, world_size, conn, status, parent_pid, timeout):
    """A rank's life: join the process group (rendezvous through the parent), serve, leave together."""
    import torch
    import torch.distributed as dist

    from parallel_lab.runtime import commlog

    # Each rank is one simulated device: one thread, so that N ranks on few cores stay honest.
    torch.set_num_threads(1)
    keep_freed_memory()  # a step's freed tensors are there for the next one (see runtime.allocator)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the kernel, which stops us
    _exit_when_parent_dies(parent_pid)
    current = [IDLE]

    def set_status(text):
        write_status(status, text or current[0])

    try:
        set_status(STARTING)
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
        set_status(IDLE)
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
        _, fn, args, kwargs, lang = message
        current[0] = RUNNING + getattr(fn, "__qualname__", str(fn))
        set_status(None)
        with using(lang):
            _run_task(conn, fn, args, kwargs)
        current[0] = FINISHED + getattr(fn, "__qualname__", str(fn))
        set_status(None)


def _run_task(conn, fn, args, kwargs):
    """Run one task and send its answer (what it printed travels with it)."""
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
            _send_error(conn, exc, _("the return value could not be sent back: "),
                        out=out.getvalue(), err=err.getvalue())


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
