"""Checks made before any rank process starts: a launch that cannot work fails at once, with a
message that says why and what to do instead.

- ``check_world_size``: an int in 1..``MAX_WORLD_SIZE`` (simulated ranks share this machine's cores);
- ``check_importable``: ranks import the function by module and name, so a lambda, a function
  defined in a notebook cell or inside another function cannot be run;
- ``check_timeout``: a positive number of seconds.

Arguments that cannot be pickled are refused when the task is encoded (``rank_process.encode_task``), also
before any process starts. ``launcher.run`` makes all of these checks. A student meets these messages
in a lesson (a function written in a cell, a world size chosen too large): they are in its language.
"""

from __future__ import annotations

import importlib
import os

from parallel_lab.i18n import _

MAX_WORLD_SIZE = 8


def cores() -> int:
    """CPU cores this process may run on (its affinity, which a container or ``taskset`` narrows
    below ``os.cpu_count()``): the cores its rank processes share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_world_size(world_size) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(_("world_size must be an int, got {value}").format(value=repr(world_size)))
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(_("world_size must be in 1..{most} (simulated ranks share this machine's {cores} cores), "
                           "got {value}").format(most=MAX_WORLD_SIZE, cores=os.cpu_count(), value=world_size))


def check_timeout(timeout) -> None:
    if not timeout or timeout <= 0:
        raise ValueError(_("timeout must be a positive number of seconds, got {value}").format(value=repr(timeout)))


def check_importable(fn) -> None:
    """Ranks receive ``fn`` by reference (module + name), so it must be importable from a module."""
    if not callable(fn):
        raise TypeError(_("fn must be a function, got {type}: {value}").format(type=type(fn).__name__,
                                                                                value=repr(fn)))
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    module = getattr(fn, "__module__", None)
    advice = _("Ranks are separate processes: they import the function by module and name. Define it in a "
               "module (a .py file, e.g. in parallel_lab) and import it; run a function written in a notebook "
               "cell with parallel_lab.runtime.cells.run(fn, N), or a whole cell with %%ranks N, which send "
               "its source.")
    if "<lambda>" in name:
        raise ValueError(_("cannot run a lambda on ranks.") + " " + advice)
    if module in (None, "__main__") or "<locals>" in name:
        where = _("a notebook cell or script (__main__)") if module in (None, "__main__") else _("another function")
        raise ValueError(_("cannot run {name} on ranks: it is defined in {where}.").format(name=repr(name), where=where)
                         + " " + advice)
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(_("cannot run {name} on ranks: it cannot be imported ({error}).").format(
            name=f"{module}.{name}", error=exc) + " " + advice) from None
    if found is not fn:
        raise ValueError(_("cannot run {name} on ranks: that name now refers to another object.").format(
            name=f"{module}.{name}") + " " + advice)
