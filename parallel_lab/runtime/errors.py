"""What a launch raises when its ranks fail: each error names the rank and says what happened there.

``launcher.run`` raises them (``pool.Pool`` builds them); lesson 01 shows each one on real ranks. In
every case the ranks have been stopped before the error reaches the caller.
"""

from __future__ import annotations

import signal

from parallel_lab.i18n import _


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
        self.message, self.others = message, others
        super().__init__(self.failed() + (("\n" + _("--- the other ranks were stopped ---") + f"\n{others}")
                                          if others else ""))

    def failed(self) -> str:
        """The report of the rank that failed (what it raised, its traceback), without the other ranks'."""
        return (_("rank {rank} raised {type}: {message}").format(rank=self.rank, type=self.exc_type,
                                                                message=self.message) + "\n\n"
                + _("--- traceback on rank {rank} ---").format(rank=self.rank) + f"\n{self.remote_traceback.rstrip()}")


class RankDied(_Report, RuntimeError):
    """A rank process ended without answering (killed, crashed): ``rank``, ``exitcode``."""

    def __init__(self, rank, exitcode, doing, others=""):
        self.rank, self.exitcode = rank, exitcode
        super().__init__(
            _("rank {rank} died with {exit} while {doing}").format(rank=rank, exit=describe_exit(exitcode), doing=doing)
            + (("\n" + _("--- the other ranks were stopped ---") + f"\n{others}") if others else "")
        )


class RanksHung(_Report, TimeoutError):
    """Ranks still running after the timeout; ``blocked`` maps rank -> what it was doing."""

    def __init__(self, timeout, blocked, report):
        self.timeout, self.blocked = timeout, blocked
        super().__init__(
            _("ranks {ranks} did not finish within {timeout:g} s (a send without a matching recv, or a collective "
              "some rank skipped?); all ranks were stopped.").format(ranks=sorted(blocked), timeout=timeout)
            + f"\n{report}"
        )


def describe_exit(code: int | None) -> str:
    """A process's exit status in words: ``exit status -9 (killed by SIGKILL)``."""
    if code is None:
        return _("no exit status")
    if code < 0:
        try:
            return _("exit status {code} (killed by {signal})").format(code=code, signal=signal.Signals(-code).name)
        except ValueError:
            return _("exit status {code} (killed by signal {number})").format(code=code, number=-code)
    return _("exit status {code}").format(code=code)
