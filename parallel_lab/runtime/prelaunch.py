"""Checks made before any rank process starts: a launch that cannot work fails at once, with a
message that says why and what to do instead.

- ``check_world_size``: an int in 1..``MAX_WORLD_SIZE`` (simulated ranks share this machine's cores);
- ``check_importable``: ranks import the function by module and name, so a lambda, a function
  defined in a notebook cell or inside another function cannot be run;
- ``check_timeout``: a positive number of seconds.

Arguments that cannot be pickled are refused when the task is encoded (``rank_process.encode_task``), also
before any process starts. ``launcher.run`` makes all of these checks.
"""

from __future__ import annotations

import importlib
import os

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
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size must be in 1..{MAX_WORLD_SIZE} (simulated ranks share this machine's "
            f"{os.cpu_count()} cores), got {world_size}"
        )


def check_timeout(timeout) -> None:
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


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
