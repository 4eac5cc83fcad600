#!/usr/bin/env python3
"""The course's two commands, for a fresh machine that has only Python 3.10+:

    python3 course.py start    # set up .venv, then open JupyterLab at the first lesson
    python3 course.py test     # set up .venv, then run the whole test suite (unit, ranks, notebooks, browser)

Both are idempotent: the environment is rebuilt only when pyproject.toml changed since the last run.
Extra arguments after ``test`` go to pytest (e.g. ``python3 course.py test -k launcher``).
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
FIRST_LESSON = "lessons/00_why_split_a_model.ipynb"


def say(text):
    print(f"[course] {text}", file=sys.stderr, flush=True)


def _fingerprint(extra: str) -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extra.encode()).hexdigest()


def up_to_date(extra: str) -> bool:
    """True when .venv holds the package with ``extra`` for the current pyproject.toml."""
    stamp = VENV / f".installed-{extra}"
    return PYTHON.exists() and stamp.exists() and stamp.read_text() == _fingerprint(extra)


def setup(extra: str) -> None:
    """Create .venv and install the package with ``extra`` unless it is already done for this
    pyproject.toml (a stamp file records what was installed)."""
    if sys.version_info < (3, 10):
        sys.exit(f"[course] Python 3.10 or newer is needed, this is {sys.version.split()[0]}")
    if up_to_date(extra):
        say(f"environment up to date ({VENV.name}, [{extra}])")
        return
    if not PYTHON.exists():
        say(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    say(f"installing parallel-lab[{extra}] (first time: a few minutes)")
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-e", f".[{extra}]"], cwd=ROOT, check=True)
    (VENV / f".installed-{extra}").write_text(_fingerprint(extra))


def env() -> dict:
    """One thread per process: N ranks on few cores stay honest (the same as binder/start)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONNOUSERSITE": "1"}


def start(args) -> int:
    setup("course")
    say(f"opening JupyterLab at {FIRST_LESSON}")
    # Containers often run as root, which JupyterLab refuses unless told it is on purpose.
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    # Served from the repository (as on Binder), opened at the first lesson.
    where = [f"--ServerApp.root_dir={ROOT}", f"--LabApp.default_url=/lab/tree/{FIRST_LESSON}"]
    return subprocess.call([str(BIN / "jupyter"), "lab", *where, *root, *args], cwd=ROOT, env=env())


def test(args) -> int:
    setup("test")
    return subprocess.call([str(PYTHON), "-m", "pytest", *args], cwd=ROOT, env=env())


def main() -> int:
    commands = {"start": start, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
