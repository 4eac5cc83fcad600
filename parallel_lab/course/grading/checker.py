"""The checking process of one submission: ``python -m parallel_lab.course.grading.checker --result-fd N``.

The grader starts it inside the sandbox (``grading.sandbox``) and writes one job on its stdin:

    {"checks": [{"id": "ring-all-reduce", "source": "<the answer cell>"}, ...],
     "modules": ["extra.exercise.module", ...],       # exercises to register besides the course's
     "lang": "zh-Hant"}                               # the reference lesson's language (default en)

It runs each exercise's check (``parallel_lab.exercises``): the answer's source is reviewed here and
run only on rank processes; every comparison happens here. It executes none of the submission's
other cells. Each verdict is written, in the job's language, as one JSON line ``{"id", "passed",
"not_yet", "lines", "cases", "reason"}``, to the result pipe ``N``, which no rank inherits (it is made
non-inheritable before any rank starts, and this process is made non-dumpable, so that its descriptors
cannot be opened through /proc): a rank can print anything on stdout, but cannot write a verdict.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import multiprocessing.util
import os
import sys

import torch

from parallel_lab.exercises import REGISTRY
from parallel_lab.i18n import DEFAULT, _, set_language
from parallel_lab.runtime import launcher

PR_SET_DUMPABLE = 4


def _private(fd: int) -> None:
    os.set_inheritable(fd, False)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _private(args.result_fd)
    out = os.fdopen(args.result_fd, "w", encoding="utf-8")
    # Ranks forked from here (PARALLEL_LAB_START_METHOD=fork) would inherit the pipe: close it in
    # each child before any answer runs there.
    multiprocessing.util.register_after_fork(out, lambda f: os.close(args.result_fd))
    torch.set_num_threads(1)
    job = json.loads(sys.stdin.read())
    set_language(job.get("lang") or DEFAULT)
    for module in job.get("modules", []):
        importlib.import_module(module)
    launcher.warm()  # with a forkserver: it imports torch while the first answer is reviewed
    try:
        for check in job["checks"]:
            exercise = REGISTRY.get(check["id"])
            if exercise is None:
                line = _("{id}: FAILED: the grader knows no exercise {id!r}").format(id=check["id"])
                record = {"id": check["id"], "passed": False, "not_yet": False, "lines": [line], "reason": line}
            else:
                verdict = exercise.check(check["source"])
                record = {"id": check["id"], "passed": verdict.passed, "not_yet": verdict.not_yet,
                          "lines": list(verdict.lines), "cases": list(verdict.cases), "reason": verdict.reason}
            out.write(json.dumps(record) + "\n")
            out.flush()
    finally:
        launcher.shutdown()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
