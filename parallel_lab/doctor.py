"""``parallel-lab doctor``: is this machine ready for the course? Each check says why when it is not.

Each check imports what it checks, so that a missing or broken package is a failed check with its
reason rather than an ImportError of the doctor itself."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import sys
import time

from parallel_lab.i18n import _


def _version(dist_name: str) -> str:
    return metadata.version(dist_name)


def check_python():
    ok = sys.version_info >= (3, 10)
    version = sys.version.split()[0]
    return ok, f"Python {version}" if ok else _("Python {version} (the course needs 3.10 or newer)").format(
        version=version)


def check_torch():
    import torch

    return True, f"torch {torch.__version__}"


def check_numpy():
    # torch warns on stderr at import when numpy is missing, and notebooks would then differ.
    return True, f"numpy {_version('numpy')}"


def check_gloo():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return False, _("this torch build has no gloo backend; install the CPU wheel from pytorch.org")
    return True, _("gloo backend available")


def check_start_method():
    from parallel_lab.runtime.pool import start_method

    method = start_method()
    return method in ("forkserver", "spawn"), _("ranks start with {method!r} (never fork: it hangs after torch ran)"
                                                ).format(method=method)


def check_cores():
    cores = os.cpu_count() or 1
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return True, _("{cores} cores (each rank uses 1 thread; OMP_NUM_THREADS={threads})").format(
        cores=cores, threads=threads)


def check_ranks():
    from parallel_lab.runtime import demos, launcher

    start = time.perf_counter()
    results = launcher.run(demos.hello, 2, timeout=60)
    elapsed = time.perf_counter() - start
    ok = [r["sum"] for r in results] == [3.0, 3.0]
    return ok, _("2 ranks started and all-reduced in {seconds:.1f} s").format(seconds=elapsed) if ok else \
        _("wrong all-reduce: {results}").format(results=results)


def check_widgets():
    ipywidgets = importlib.import_module("ipywidgets")
    major = int(ipywidgets.__version__.split(".")[0])
    if major < 8:
        return False, _("ipywidgets {version} is too old for JupyterLab 4 (need >= 8)").format(
            version=ipywidgets.__version__)
    try:
        lab = _version("jupyterlab_widgets")
    except metadata.PackageNotFoundError:
        return False, _("jupyterlab_widgets is missing: widgets will show as text in JupyterLab")
    return True, f"ipywidgets {ipywidgets.__version__}, jupyterlab_widgets {lab}"


def check_plotly():
    plotly = importlib.import_module("plotly")
    if int(plotly.__version__.split(".")[0]) < 6:
        return False, _("plotly {version}: the course needs plotly >= 6").format(version=plotly.__version__)
    import plotly.graph_objects as go

    go.FigureWidget()  # needs anywidget with plotly >= 6
    return True, _("plotly {version} with FigureWidget (anywidget {anywidget})").format(
        version=plotly.__version__, anywidget=_version("anywidget"))


CHECKS = {
    "python": check_python,
    "torch": check_torch,
    "numpy": check_numpy,
    "gloo": check_gloo,
    "start_method": check_start_method,
    "cores": check_cores,
    "ranks": check_ranks,
    "widgets": check_widgets,
    "plotly": check_plotly,
}


def doctor() -> dict:
    """Run every check; ``{"ok": all passed, "checks": {name: {"ok": bool, "why": str}}}``."""
    checks = {}
    for name, check in CHECKS.items():
        try:
            ok, why = check()
        except Exception as exc:  # a check that cannot even run is a failed check, with its reason
            ok, why = False, f"{type(exc).__name__}: {exc}"
        checks[name] = {"ok": bool(ok), "why": why}
    return {"ok": all(c["ok"] for c in checks.values()), "checks": checks}
