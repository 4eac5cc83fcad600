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


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_are_executed_with_kernelspec_and_no_errors(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "not executed"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not run top to bottom"
    for cell in code:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:80]
    assert path.stat().st_size < 2_000_000
    first = nb.cells[0].source
    assert "Learning goals" in first or "learning goals" in first.lower()
    assert "## What to remember" in "".join(c.source for c in nb.cells if c.cell_type == "markdown")


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


@pytest.mark.timeout(180)
def test_course_py_start_serves_jupyterlab_at_the_first_lesson(tmp_path):
    """The README's first command, without opening a browser: the server answers at the first lesson."""
    import time
    import urllib.request

    port, token = _free_port(), "course-start-test"
    env = {**__import__("os").environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "course.py"), "start", "--no-browser",
                             f"--port={port}", f"--IdentityProvider.token={token}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/lab/tree/lessons/00_why_split_a_model.ipynb?token={token}"
        deadline, status = time.monotonic() + 150, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = urllib.request.urlopen(url, timeout=5).status
                break
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"JupyterLab did not answer (exit {proc.poll()})"
        api = f"http://127.0.0.1:{port}/api/contents/lessons/00_why_split_a_model.ipynb?token={token}&content=0"
        assert json.loads(urllib.request.urlopen(api, timeout=10).read())["type"] == "notebook"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
