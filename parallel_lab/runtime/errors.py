"""What a launch raises when its ranks fail: each error names the rank and says what happened there.

``launcher.run`` raises them (``pool.Pool`` builds them); lesson 01 shows each one on real ranks. In
every case the ranks have been stopped before the error reaches the caller.
"""

from __future__ import annotations

import signal


class _Report:
    """In a notebook, IPython shows ``_render_traceback_()`` instead of the kernel's own traceback: the
    report (which rank, its traceback, what the others were doing) without the launcher's frames,
    which say nothing about the code that failed."""

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return [f"{type(self).__name__}: {lines[0]}", *lines[1:]]


class RankError(_Report, RuntimeError):
    """An exception raised by the function on one rank (``rank``, ``exc_type``, ``remote_traceback``)."""

    def __init__(self, rank, exc_type, message, remote_traceback, others=""):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        super().__init__(
            f"rank {rank} raised {exc_type}: {message}\n\n"
            f"--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}"
            + (f"\n--- the other ranks were stopped ---\n{others}" if others else "")
        )


class RankDied(_Report, RuntimeError):
    """A rank process ended without answering (killed, crashed): ``rank``, ``exitcode``."""

    def __init__(self, rank, exitcode, doing, others=""):
        self.rank, self.exitcode = rank, exitcode
        super().__init__(
            f"rank {rank} died with {describe_exit(exitcode)} while {doing}"
            + (f"\n--- the other ranks were stopped ---\n{others}" if others else "")
        )


class RanksHung(_Report, TimeoutError):
    """Ranks still running after the timeout; ``blocked`` maps rank -> what it was doing."""

    def __init__(self, timeout, blocked, report):
        self.timeout, self.blocked = timeout, blocked
        super().__init__(
            f"ranks {sorted(blocked)} did not finish within {timeout:g} s "
            f"(a send without a matching recv, or a collective some rank skipped?); all ranks "
            f"were stopped.\n{report}"
        )


def describe_exit(code: int | None) -> str:
    """A process's exit status in words: ``exit status -9 (killed by SIGKILL)``."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"exit status {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit status {code} (killed by signal {-code})"
    return f"exit status {code}"
