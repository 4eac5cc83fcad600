"""The grader's probe: a pytest plugin loaded inside the nbval subprocess
(``-p parallel_lab.course.grading.plugin``). It does nothing unless ``$PARALLEL_LAB_GRADE_LOG`` names
the log file; then it logs each cell's result and actual outputs (JSON lines, flushed, so a killed
run keeps what it finished) and notices a dead kernel within a second, not at the cell timeout.

It imports nothing heavy: it runs in every graded notebook's process.
"""

from __future__ import annotations

import json
import os
import sys
import time

LOG_ENV = "PARALLEL_LAB_GRADE_LOG"
if os.environ.get(LOG_ENV) and "jsonschema" not in sys.modules:
    # Inside the nbval subprocess only: jsonschema imports rfc3987_syntax when it is installed (it
    # comes with JupyterLab) to check IRI formats, and that builds a parser at import -- about 5 s
    # per graded notebook. Neither nbformat nor nbval checks IRIs, so the probe hides the module.
    sys.modules.setdefault("rfc3987_syntax", None)


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "").strip()


def output_text(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
        else:
            parts.append(out.get("data", {}).get("text/plain", "") + "\n")
    return "".join(parts)


_died_seen = False


def pytest_configure(config):
    if not os.environ.get(LOG_ENV):
        return
    try:  # this plugin runs inside nbval's process; nbval itself is an optional (test) dependency
        from nbval.kernel import RunningKernel
    except ImportError:
        return
    original = RunningKernel.get_message

    def get_message(self, stream, timeout=None):
        """nbval waits the whole cell timeout for a reply, even from a dead kernel: poll in short
        slices and give up at once when the kernel process is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                return original(self, stream, timeout=left)
            except Exception as exc:  # queue.Empty
                if type(exc).__name__ != "Empty":
                    raise
                if not self.is_alive():
                    self._parallel_lab_died = True
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    RunningKernel.get_message = get_message


def pytest_runtest_makereport(item, call):
    """Log one line per cell: {"cell", "kind": passed|differ|exception|timeout|died|dead|skipped|
    error, "outputs_text", "ename", "evalue"}; setup errors (kernel did not start) too."""
    global _died_seen
    log = os.environ.get(LOG_ENV)
    if not log or not hasattr(item, "cell_num") or call.when == "teardown":
        return
    if call.when == "setup" and call.excinfo is None:
        return
    exc = call.excinfo.value if call.excinfo else None
    message = str(exc) if exc is not None else ""
    kernel = getattr(item.parent, "kernel", None)
    died = bool(getattr(kernel, "_parallel_lab_died", False))
    if exc is None:
        kind = "passed"
    elif type(exc).__name__ == "Skipped":
        kind = "skipped"
    elif died and not _died_seen:
        kind = "died"
    elif "Kernel dead" in message or (died and _died_seen):
        kind = "dead"
    elif "Timeout" in message:
        kind = "timeout"
    elif "Cell outputs differ" in message:
        kind = "differ"
    elif "caused an exception" in message:
        kind = "exception"
    else:
        kind = "error"
    _died_seen = _died_seen or died
    outputs = list(getattr(item, "test_outputs", None) or [])
    error = next((o for o in outputs if o.get("output_type") == "error"), {})
    record = {"cell": item.cell_num, "kind": kind, "outputs_text": output_text(outputs),
              "ename": error.get("ename", ""), "evalue": error.get("evalue", ""),
              "error": first_line(message)}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
