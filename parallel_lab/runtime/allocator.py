"""How a rank's freed CPU memory is kept: glibc's malloc thresholds fixed for training steps.

Every CPU tensor comes from glibc's malloc (mallopt(3)): a block above ``M_MMAP_THRESHOLD`` is mapped
on its own and unmapped when freed; a smaller one comes from the heap, whose top glibc gives back to
the kernel once more than ``M_TRIM_THRESHOLD`` of it is free. Left alone, glibc starts the first at
128 KB, raises it to the largest mapped block freed so far (at most ``DEFAULT_MMAP_THRESHOLD_MAX``,
32 MB on 64-bit) and keeps the second at twice the first.

A training step frees its gradients and allocates them again (``zero_grad`` sets them to None). Under
the moving thresholds a rank's heap top can end a step above the trim threshold: glibc gives it back
and the next step takes it again, faulted in 4 KB at a time. ``keep_freed_memory`` fixes both
thresholds where glibc's own rule ends up, so the pages stay. Every rank the launcher starts calls it
(``rank_process.main``), and so does ``torchrun.init_from_env``. What it changed in the benchmarks is in
docs/benchmarks.md ("Freed memory stays with the rank"); ``demos.heap_refaults`` is the test's probe.
PyTorch's CPU performance tuning guide recommends jemalloc or TCMalloc for the same reuse; neither is
in the course's environment, mallopt is in glibc.
"""

from __future__ import annotations

import ctypes
import sys

MMAP_THRESHOLD = 32 * 2**20  # the ceiling of glibc's own rule
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what that rule sets beside it: at most 64 MB of freed heap kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def keep_freed_memory() -> bool:
    """Fix glibc's two thresholds at the ceiling its own rule moves toward (``MMAP_THRESHOLD``,
    ``TRIM_THRESHOLD``), so that a step's freed tensors stay in the heap for the next step. True
    where that was set (Linux with glibc); elsewhere nothing changes.

    The cost: a process keeps up to ``TRIM_THRESHOLD`` of freed heap instead of returning it, as
    glibc itself would once it had freed one 32 MB block. It changes the whole process's malloc
    for the rest of its life: call it in a rank, not in a notebook kernel or a test process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
