"""Drive the lessons as students meet them: JupyterLab in a headless Chromium (tests/test_browser.py).

    with JupyterServer(ROOT) as server, Browser() as browser:
        lab = browser.open_notebook(server, "lessons/01_ranks_and_collectives.ipynb")
        lab.run_all()                      # Run menu -> Run All Cells, then wait until the kernel is idle
        lab.screenshot("01-after-run")     # artifacts/screenshots/01-after-run.png

Everything is isolated and torn down: the server gets its own token, port and Jupyter
config/data/runtime/settings/workspace directories in a temporary folder, autosave is off (a test run
must never write the committed lessons), and ``JupyterServer.stop`` reports any process of the
server's tree (kernel, forkserver, ranks) that outlived a clean shutdown.

Chromium is Debian's (``apt-get install chromium``), driven by Playwright's Python package; Playwright's
own browser downloads do not work on the course's machines.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
LOGS = ROOT / "artifacts" / "browser"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--disable-dev-shm-usage"]
# JupyterLab user settings for the test: never write the notebook, render every cell (no windowing,
# so off-screen outputs are in the DOM), no news or update checks.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}
# CSS classes that lesson widgets add for tests (``widget.add_class(...)``). A feature's browser test
# runs once its lesson notebook exists and the library uses its hook; before that it is skipped, and
# under CI it fails (``feature_lesson``), so a renamed hook cannot turn a test off unseen.
HOOKS = {
    "pipeline_controls": "pl-pipeline-controls",  # a box holding the schedule sliders, beside its chart
    "quiz": "pl-quiz",                            # one quiz question's box: options, Check button, feedback
    "quiz_feedback": "pl-quiz-feedback",          # the feedback HTML inside that box
    "run_real": "pl-run-real",                    # the button that runs the schedule on real ranks
}


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, interval: float = 0.25, what: str = "condition"):
    """Poll ``condition()`` until it returns something truthy (returned); TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g} s")
        time.sleep(interval)


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[str]:
    """'pid name' of those of ``processes`` still running (zombies count as gone)."""
    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            pass
    return left


def reap(processes: list[psutil.Process], grace: float = 15) -> list[str]:
    """Give ``processes`` ``grace`` seconds to end; kill and return ('pid name') those that did not."""
    try:
        wait_for(lambda: not alive(processes), grace, 0.2, "processes gone")
        return []
    except TimeoutError:
        left = alive(processes)
        for p in processes:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return left


class JupyterServer:
    """``jupyter lab`` on a free localhost port, token auth, every Jupyter directory temporary."""

    def __init__(self, root: Path = ROOT, startup_timeout: float = 120):
        self.root, self.startup_timeout = root, startup_timeout
        self.token, self.port = secrets.token_hex(16), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.seen: dict[int, psutil.Process] = {}  # every process of its tree we have observed
        self.leftovers: list[str] = []

    def __enter__(self) -> "JupyterServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _jupyter_home(self, prefix: str) -> dict:
        """A fresh temporary home for this server (kept in ``self._home``, removed by ``stop``) with
        the test settings written, and the environment that points every Jupyter directory into it."""
        self._home = tempfile.TemporaryDirectory(prefix=prefix)
        home = Path(self._home.name)
        for plugin, values in LAB_SETTINGS.items():
            target = home / "settings" / f"{plugin}.jupyterlab-settings"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))
        return {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
                "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
                "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "IPYTHONDIR": str(home / "ipython"),
                "JUPYTER_PLATFORM_DIRS": "1"}

    def start(self) -> None:
        env = self._jupyter_home("pl-jupyter-") | {"OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / "jupyter-server.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}",
             "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={self.root}",
             f"--IdentityProvider.token={self.token}", "--ServerApp.terminals_enabled=False",
             # a safety net should this process die without stopping the server
             "--ServerApp.shutdown_no_activity_timeout=600",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],  # CI: root
            cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.process.returncode}); log:\n{self.log()}")
            try:
                return self.api("GET", "/api/status") is not None
            except OSError:
                return False

        wait_for(ready, self.startup_timeout, 0.5, "JupyterLab server up")

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text()[-tail:] if self.log_path.exists() else ""

    def api(self, method: str, path: str, timeout: float = 10):
        """A call to the server's REST API; the decoded JSON (None for an empty body)."""
        request = urllib.request.Request(self.url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernels(self) -> list[dict]:
        return self.api("GET", "/api/kernels")

    def remember_processes(self) -> None:
        """Note every process of the server's tree now (kernels, forkservers, ranks) so that
        ``stop`` can check they all ended."""
        if self.process is not None:
            for p in tree(self.process.pid):
                self.seen.setdefault(p.pid, p)

    def stop(self, timeout: float = 60) -> None:
        """Shut down kernels, then the server (REST API first, signals only as a fallback). Whatever
        of its tree is still running after a clean shutdown is listed in ``leftovers`` (and killed)."""
        if self.process is None:
            return
        self.remember_processes()
        try:
            for kernel in self.kernels():
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)
            self.api("POST", "/api/shutdown")
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.leftovers.append(f"{self.process.pid} jupyter-lab (did not exit within {timeout:g} s)")
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.leftovers += reap(list(self.seen.values()))  # ranks exit when their parent does
        self._log.close()
        self._home.cleanup()
        self.process = None


class Browser:
    """Headless Debian Chromium under Playwright (sync API)."""

    def __init__(self, viewport=(1280, 900)):
        self.viewport = viewport
        self.leftovers: list[str] = []  # processes of the browser that outlived a clean close

    def __enter__(self) -> "Browser":
        from playwright.sync_api import sync_playwright

        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self._playwright = sync_playwright().start()
        try:
            self.browser = self._playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                                            args=CHROMIUM_FLAGS, timeout=120_000)
        except BaseException:
            self._playwright.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        # Playwright's driver (node) and every Chromium process, to check they are gone at the end
        processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in self._before]
        try:
            self.browser.close()
        finally:
            self._playwright.stop()
        self.leftovers = reap(processes)

    def open_notebook(self, server: JupyterServer, notebook: str, timeout: float = 120) -> "Lab":
        """A new page with ``notebook`` (a path relative to the server's root) open in JupyterLab,
        its kernel started and idle."""
        context = self.browser.new_context(viewport={"width": self.viewport[0], "height": self.viewport[1]})
        page = context.new_page()
        page.set_default_timeout(60_000)
        lab = Lab(page, server, notebook)
        page.on("console", lambda m: lab.console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        # ?reset: a fresh workspace, or JupyterLab reopens the notebooks of earlier tests as hidden tabs
        page.goto(f"{server.url}/lab/tree/{notebook}?reset&token={server.token}", timeout=timeout * 1000)
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first.wait_for(
            timeout=timeout * 1000)
        lab.wait_kernel_ready(timeout)
        page.keyboard.press("Control+b")  # hide the file browser: more room for the notebook
        return lab


class Lab:
    """One notebook open in JupyterLab: run its cells, wait, look at outputs, take screenshots."""

    def __init__(self, page, server: JupyterServer, notebook: str):
        self.page, self.server, self.notebook = page, server, notebook
        self.console: list[str] = []

    # --- the notebook panel -------------------------------------------------------------------
    @property
    def panel(self):
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first

    def code_prompts(self) -> list[str]:
        """The input prompt of every code cell: '[3]:', '[*]:' (queued or running) or '[ ]:'."""
        return [t.strip() for t in self.panel.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()]

    def session(self) -> dict | None:
        """The server's session of this notebook (with its kernel), if any."""
        return next((s for s in self.server.api("GET", "/api/sessions") if s["path"] == self.notebook), None)

    def kernel_state(self) -> str | None:
        """'idle', 'busy', 'starting', ... of this notebook's kernel (None before it has one)."""
        session = self.session()
        return session["kernel"]["execution_state"] if session and session.get("kernel") else None

    def wait_kernel_ready(self, timeout: float = 120) -> None:
        """Until the notebook's kernel is started and idle (the toolbar says so too)."""
        wait_for(lambda: self.kernel_state() == "idle", timeout, 0.5, f"{self.notebook}: kernel idle")
        self.page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']"
                          ).first.wait_for(state="attached", timeout=timeout * 1000)

    # --- running ------------------------------------------------------------------------------
    def menu(self, menu: str, item: str) -> None:
        """Click a main-menu entry, e.g. ``menu("Run", "Run All Cells")``."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).first.click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()

    def clear_outputs(self) -> None:
        """Edit menu -> Clear Outputs of All Cells: what is shown after a run is then all fresh."""
        self.menu("Edit", "Clear Outputs of All Cells")
        wait_for(lambda: all(p == "[ ]:" for p in self.code_prompts()), 30, 0.2, "outputs cleared")

    def run_all(self, timeout: float = 180) -> None:
        """Run menu -> Run All Cells, then wait until every cell ran and the kernel is idle; raises
        (with the error outputs) when some cell did not run."""
        self.menu("Run", "Run All Cells")
        # it has started once a prompt shows '*' (queued or running) or the kernel is busy
        wait_for(lambda: any("*" in p for p in self.code_prompts()) or self.kernel_state() == "busy",
                 30, 0.1, f"{self.notebook}: Run All Cells started")
        self.wait_idle(timeout)
        prompts = self.code_prompts()
        if not all(re.fullmatch(r"\[\d+\]:", p) for p in prompts):
            raise AssertionError(f"{self.notebook}: not every cell ran: {prompts}\n" + "\n".join(self.errors()))

    def code_cell(self, text: str):
        """The first code cell whose text contains ``text`` (its source, as the editor shows it)."""
        cell = self.panel.locator(".jp-CodeCell", has_text=text).first
        cell.wait_for(state="attached", timeout=30_000)
        return cell

    def edit(self, cell) -> None:
        """Put the cursor in ``cell``'s editor (edit mode), as a student clicking into it."""
        cell.scroll_into_view_if_needed()
        cell.locator(".cm-content").first.click()

    def run_cell(self, cell, timeout: float = 180) -> None:
        """Run ``cell`` where it is (Ctrl+Enter in its editor) and wait until it ran and the kernel is
        idle again."""
        self.edit(cell)
        prompt = cell.locator(".jp-InputArea-prompt").first
        before = prompt.inner_text().strip()
        self.page.keyboard.press("Control+Enter")
        wait_for(lambda: prompt.inner_text().strip() != before, 30, 0.1, "the cell started")
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 180, settle: float = 1.0) -> None:
        """Until no cell is queued or running and the kernel is idle, stable for ``settle`` s."""
        def quiet():
            return self.kernel_state() == "idle" and not any("*" in p for p in self.code_prompts())

        deadline = time.monotonic() + timeout
        wait_for(quiet, timeout, 0.25, f"{self.notebook}: all cells done, kernel idle")
        time.sleep(settle)
        wait_for(quiet, max(1.0, deadline - time.monotonic()), 0.25, f"{self.notebook}: kernel idle")

    def errors(self) -> list[str]:
        """Text of the outputs on stderr (tracebacks and warnings) in the notebook."""
        return self.panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                                  ).all_inner_texts()

    # --- looking ------------------------------------------------------------------------------
    def outputs_text(self) -> str:
        return "\n".join(self.panel.locator(".jp-OutputArea-output").all_inner_texts())

    def output_of(self, cell) -> str:
        """The text of ``cell``'s outputs."""
        return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())

    def plotly_figures(self, within=None):
        """The plotly charts drawn by plotly.js (those with an SVG), in the notebook or ``within``."""
        return (within or self.panel).locator(".js-plotly-plot", has=self.page.locator("svg.main-svg"))

    def cell_with_output(self, pattern: str):
        """The first code cell whose output contains ``pattern`` (a regex)."""
        return self.panel.locator(".jp-CodeCell", has=self.page.locator(
            ".jp-OutputArea-output", has_text=re.compile(pattern))).first

    def screenshot(self, name: str, element=None) -> Path:
        """A PNG in artifacts/screenshots/: the viewport, or just ``element`` (scrolled into view)."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        if element is None:
            self.page.screenshot(path=str(path))
        else:
            element.scroll_into_view_if_needed()
            element.screenshot(path=str(path))
        return path

    def close(self) -> None:
        """Close the page without saving (autosave is off; the notebook on disk is untouched) and
        shut its kernel down (ranks and all), as a student closing the tab and the kernel would.
        The page's console errors are kept in artifacts/browser/ for debugging."""
        self.server.remember_processes()
        name = Path(self.notebook).stem
        (LOGS / f"console-{name}.log").write_text("\n".join(self.console) + "\n")
        self.page.context.close()
        session = self.session()
        if session:
            self.server.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)


def lesson(prefix: str) -> Path | None:
    """The committed lesson notebook whose name starts with ``prefix`` (e.g. "03"), if any."""
    return next(iter(sorted((ROOT / "lessons").glob(f"{prefix}_*.ipynb"))), None)


def library_has(text: str) -> bool:
    """True when some module of parallel_lab contains ``text`` (e.g. a widget's hook class)."""
    return any(text in path.read_text() for path in (ROOT / "parallel_lab").rglob("*.py"))


def unavailable(reason: str):
    """A browser test cannot run: skipped here, failed under CI (``CI`` set), where the browser, the
    lessons and the hooks the tests look for must all be there."""
    (pytest.fail if in_ci() else pytest.skip)(reason)


def feature_lesson(prefix: str, hook: str) -> Path:
    """The lesson notebook of a feature whose widget carries the CSS class ``hook``; ``unavailable``
    until that notebook exists and some module of parallel_lab uses the class."""
    path = lesson(prefix)
    if path is None or not library_has(hook):
        unavailable(f"lesson not built yet: needs lessons/{prefix}_*.ipynb and a widget with class {hook!r} "
                    f"in parallel_lab")
    return path


class CourseServer(JupyterServer):
    """JupyterLab as ``python3 course.py start --lang LANG`` serves it (the README's command: its
    settings, its language, its first lesson), with the test's own token, port, Jupyter directories
    and settings (autosave off). Stopped as the server is: course.py exits with JupyterLab."""

    def __init__(self, lang: str, root: Path = ROOT, startup_timeout: float = 300):
        super().__init__(root, startup_timeout)
        self.lang = lang

    def start(self) -> None:
        env = self._jupyter_home("pl-course-")
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"course-start-{self.lang}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, str(self.root / "course.py"), "start", "--lang", self.lang, "--no-browser",
             f"--port={self.port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
             f"--IdentityProvider.token={self.token}", "--ServerApp.terminals_enabled=False",
             "--ServerApp.shutdown_no_activity_timeout=600"],
            cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"course.py start exited ({self.process.returncode}); log:\n{self.log()}")
            try:
                return self.api("GET", "/api/status") is not None
            except OSError:
                return False

        wait_for(ready, self.startup_timeout, 0.5, f"course.py start --lang {self.lang} up")
