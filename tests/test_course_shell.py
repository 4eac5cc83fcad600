"""The course shell: README's two commands, the course map, notebooks, Binder files, doctor."""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0].lower()


def test_readme_gives_exactly_two_commands_and_ci_runs_the_test_one():
    section = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["python3 course.py start", "python3 course.py test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 course.py test" in ci


def _course_module():
    sys.path.insert(0, str(ROOT))
    try:
        import course
    finally:
        sys.path.remove(str(ROOT))
    return course


def test_course_py_knows_both_commands():
    course = _course_module()
    out = subprocess.run([sys.executable, str(ROOT / "course.py")], capture_output=True, text=True)
    assert out.returncode == 2 and "course.py start" in out.stderr and "course.py test" in out.stderr
    assert (ROOT / course.FIRST_LESSON).exists()


def test_course_py_setup_is_skipped_when_done_and_redone_when_pyproject_changes(tmp_path, monkeypatch):
    course = _course_module()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(course, "ROOT", tmp_path)
    monkeypatch.setattr(course, "VENV", venv)
    monkeypatch.setattr(course, "PYTHON", venv / "bin" / "python")
    assert not course.up_to_date("test")
    calls = []
    monkeypatch.setattr(course.subprocess, "run", lambda *a, **k: calls.append(a[0]))
    course.setup("test")  # installs once and writes the stamp ...
    assert len(calls) == 1 and "-e" in calls[0] and ".[test]" in calls[0]
    course.setup("test")  # ... and a re-run skips it
    assert len(calls) == 1 and course.up_to_date("test") and not course.up_to_date("course")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert not course.up_to_date("test")


def test_every_lesson_is_on_the_course_map_with_a_binder_link():
    assert [p.name for p in LESSONS][:2] == ["00_why_split_a_model.ipynb", "01_ranks_and_collectives.ipynb"]
    for lesson in LESSONS:
        assert f"](lessons/{lesson.name})" in README, lesson.name
        assert f"?urlpath=lab/tree/lessons/{lesson.name})" in README, lesson.name
    for target in re.findall(r"urlpath=lab/tree/(lessons/[^)\s]+\.ipynb)", README):
        assert (ROOT / target).exists(), target


def test_the_readme_is_a_front_door_in_both_languages():
    """README under about 250 lines, linking the Traditional Chinese one in its first lines; that one
    maps every lesson to its zh-Hant edition (the English one while it is not translated yet), opens
    the zh-Hant edition on Binder, and every file either links to exists."""
    from parallel_lab.course import editions

    chinese = (ROOT / "README.zh-Hant.md").read_text(encoding="utf-8")
    assert len(README.splitlines()) <= 250 and "](README.zh-Hant.md)" in "\n".join(README.splitlines()[:5])
    assert "](README.md)" in "\n".join(chinese.splitlines()[:5]) and "python3 course.py start --lang zh-Hant" in chinese
    assert "?urlpath=lab/tree/lessons/zh-Hant/00_why_split_a_model.ipynb)" in chinese
    for lesson in LESSONS:
        edition = "" if lesson.stem in editions.NOT_YET_TRANSLATED else "zh-Hant/"
        assert f"](lessons/{edition}{lesson.name})" in chinese, (
            f"{lesson.name}: README.zh-Hant.md's map should link lessons/{edition}{lesson.name} "
            "(tools/build_lessons.py --readme writes the links and the minutes)")
    for text, folder in ((README, ROOT), (chinese, ROOT)):
        for target in re.findall(r"\]\(((?:docs|lessons)/[^)#\s]+|[A-Z][\w.-]+\.md)(?:#[^)]*)?\)", text):
            assert (folder / target).exists(), target
    for doc in ("students.md", "students.zh-Hant.md", "instructors.md", "benchmarks.md", "developers.md"):
        assert f"](docs/{doc}" in README + chinese, doc


# Every edition: English, and each translated one (lessons/zh-Hant/), with its words for the two headings.
EDITIONS = [(p, "Learning goals", "## What to remember") for p in LESSONS] + \
    [(p, "學習目標", "## 記住這些") for p in sorted((ROOT / "lessons" / "zh-Hant").glob("[0-9][0-9]_*.ipynb"))]


@pytest.mark.parametrize("path,goals,remember", EDITIONS, ids=lambda p: str(p.relative_to(ROOT / "lessons"))
                         if isinstance(p, Path) else "")
def test_lessons_are_executed_with_kernelspec_and_no_errors(path, goals, remember):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "not executed"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not run top to bottom"
    for cell in code:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:80]
    assert path.stat().st_size < 2_000_000
    first = nb.cells[0].source
    assert goals in first or goals.lower() in first.lower()
    assert remember in "".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_environment_yml_pins_python_and_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "python=3.11" in conda
    torch_pin = next(r for r in PYPROJECT["project"]["dependencies"] if _name(r) == "torch")
    assert f"pytorch-cpu={torch_pin.split('==')[1]}" in conda
    wanted = {r for r in PYPROJECT["project"]["dependencies"] if _name(r) != "torch"}
    wanted |= set(PYPROJECT["project"]["optional-dependencies"]["course"])
    assert set(pip) == wanted


def test_binder_files():
    binder = ROOT / "binder"
    # repo2docker ignores top-level config when binder/ exists: the environment must be found there.
    assert (binder / "environment.yml").resolve() == (ROOT / "environment.yml").resolve()
    assert "pip install --no-deps -e ." in (binder / "postBuild").read_text()
    start = (binder / "start").read_text()
    assert "export OMP_NUM_THREADS=1" in start and 'exec "$@"' in start
    for script in ("postBuild", "start"):
        assert (binder / script).stat().st_mode & 0o111, f"binder/{script} is not executable"


@pytest.mark.ranks
def test_doctor_passes_here_and_prints_one_json_object():
    exe = Path(sys.executable).with_name("parallel-lab")
    out = subprocess.run([str(exe), "doctor", "--json"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert set(report["checks"]) >= {"torch", "gloo", "start_method", "cores", "widgets", "plotly"}
    assert all(set(c) == {"ok", "why"} for c in report["checks"].values())


def test_doctor_exits_non_zero_with_the_reason_when_a_check_fails(monkeypatch, capsys):
    from parallel_lab import cli, doctor

    monkeypatch.setitem(doctor.CHECKS, "gloo", lambda: (False, "this torch build has no gloo backend"))
    monkeypatch.setitem(doctor.CHECKS, "ranks", lambda: (True, "skipped in this test"))
    assert cli.main(["doctor", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["checks"]["gloo"] == {"ok": False, "why": "this torch build has no gloo backend"}
    assert captured.err.strip() == "doctor: failed checks: gloo"


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout, what):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:  # as a server binds (JupyterLab too): TIME_WAIT leftovers do not count
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return True
        except OSError:
            return False


RANKS_IN_A_KERNEL = """
from parallel_lab.course import notebook
notebook.setup()
from parallel_lab.runtime import launcher
from parallel_lab.runtime.demos import hello
print(launcher.run(hello, 2))
"""


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_course_py_start_serves_the_first_lesson_and_stopping_it_leaves_no_process(tmp_path, stop):
    """The README's first command, without a browser: the server answers at the first lesson with
    the course's settings (no news pop-up); then a kernel runs ranks, and stopping course.py (as a
    process manager or Ctrl-C would) ends JupyterLab, the kernel, its forkserver and its ranks, and
    frees the port."""
    import os
    import signal
    import urllib.request

    import psutil
    from jupyter_client import BlockingKernelClient

    port, token = _free_port(), "course-start-test"
    runtime = tmp_path / "runtime"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "course.py"), "start", "--no-browser",
                             f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[int, psutil.Process] = {}
    try:
        base = f"http://127.0.0.1:{port}"

        def get(path, method="GET"):
            request = urllib.request.Request(base + path, method=method, headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()

        def up():
            assert proc.poll() is None, f"course.py exited {proc.returncode}: {proc.stdout.read()[-3000:]}"
            try:
                return get(f"/lab/tree/{_course_module().FIRST_LESSON}")[0] == 200
            except OSError:
                return False

        _wait(up, 150, "JupyterLab at the first lesson")
        _, body = get("/api/contents/lessons/00_why_split_a_model.ipynb?content=0")
        assert json.loads(body)["type"] == "notebook"
        _, body = get("/lab/api/settings/@jupyterlab/apputils-extension:notification")
        schema = json.loads(body)["schema"]["properties"]  # the course's overrides are the defaults
        assert schema["fetchNews"]["default"] == "false", schema["fetchNews"]  # not JupyterLab's "ask"
        assert schema["checkForUpdates"]["default"] is False

        _, body = get("/api/kernels", "POST")
        kernel = json.loads(body)["id"]
        client = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel}.json"))
        client.load_connection_file()
        client.start_channels()
        outputs = []
        reply = client.execute_interactive(RANKS_IN_A_KERNEL, timeout=120,
                                           output_hook=lambda msg: outputs.append(msg["content"]))
        client.stop_channels()
        assert reply["content"]["status"] == "ok", (reply["content"], outputs)
        for p in psutil.Process(proc.pid).children(recursive=True):
            seen[p.pid] = p
        names = " ".join(p.name() for p in seen.values())
        assert len(seen) >= 5, names  # jupyter-lab, the kernel, its forkserver, two ranks (a pool)

        proc.send_signal(getattr(signal, stop))
        assert proc.wait(timeout=90) == 128 + getattr(signal, stop)
        left = [f"{p.pid} {p.name()}" for p in seen.values()
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"left behind after {stop}: {left}"
        assert _port_is_free(port), f"port {port} still held after {stop}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for p in seen.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


STOP_LEFTOVERS_WHEN_A_SCAN_MISSES_ONE = """
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import course
child = subprocess.Popen([sys.executable, "-c",  # ignores SIGTERM, as multiprocessing's resource tracker does
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"])
scans, real = [], course._children
course._children = lambda: scans.append(1) or ([] if len(scans) == 1 else real())
course.say = lambda *args: None
course._stop_leftovers(grace=0.5, limit=20)
try:
    os.kill(child.pid, 0)
    print("alive")
except ProcessLookupError:
    print("stopped")
"""


def test_stopping_leftovers_goes_by_the_kernels_count_of_children_not_one_scan_of_proc():
    """A scan of /proc is not atomic: a kernel that exits while it runs re-parents its forkserver
    to course.py after the scan passed it, and the scan finds no child. _stop_leftovers must not
    take one empty scan for "nothing left" (a forkserver was left behind after SIGINT that way)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("course.py stops leftovers on Linux only (it reads /proc)")
    out = subprocess.run([sys.executable, "-c", STOP_LEFTOVERS_WHEN_A_SCAN_MISSES_ONE, str(ROOT)],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "stopped", out.stdout + out.stderr


def test_course_settings_turn_the_news_pop_up_off_locally_and_on_binder(tmp_path):
    course = _course_module()
    settings = json.loads(course.LAB_OVERRIDES.read_text())["@jupyterlab/apputils-extension:notification"]
    assert settings == {"fetchNews": "false", "checkForUpdates": False}
    target = course.install_lab_settings(tmp_path)
    assert target == tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert json.loads(target.read_text()) == json.loads(course.LAB_OVERRIDES.read_text())
    post_build = (ROOT / "binder" / "postBuild").read_text()
    assert "binder/overrides.json" in post_build and "share/jupyter/lab/settings/overrides.json" in post_build


def test_diagrams_and_commands_in_the_lessons_fit_an_ordinary_width():
    """Fenced blocks (ASCII diagrams, commands) are monospace and do not reflow: a line wider than
    80 characters wraps in JupyterLab at ordinary widths and breaks the drawing."""
    too_wide = []
    for source in sorted((ROOT / "lessons" / "src").glob("[0-9][0-9]_*.py")):
        fenced = False
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if not line.startswith("#"):
                fenced = False
                continue
            body = line[2:] if line.startswith("# ") else line[1:]
            if body.strip().startswith("```"):
                fenced = not fenced
            elif fenced and len(body) > 80:
                too_wide.append(f"{source.name}:{number} ({len(body)} characters)")
    assert not too_wide, too_wide
