"""The code's own rules, held by the suite: ruff's selection in pyproject.toml (pyflakes, import order,
syntax errors, and lines of at most 120 columns) over the package, tools, tests and lesson sources."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
