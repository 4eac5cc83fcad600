"""The code's own rules, held by the suite: ruff's selection in pyproject.toml (pyflakes, import order,
syntax errors, and lines of at most 120 columns) over the package, tools, tests and lesson sources."""

import subprocess
import sys
import unicodedata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
LINE_LENGTH = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]


def test_ruff_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _width(line: str) -> int:
    """Columns as ruff counts them: East Asian wide and full-width characters take two."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in line)


def test_lesson_sources_keep_the_width_except_markdown_table_rows():
    """pyproject.toml exempts lessons/src from E501 because a markdown table row cannot be wrapped;
    every other line of a lesson source (code, prose) keeps the 120 columns."""
    long = [f"{path.relative_to(ROOT)}:{number}: {_width(line)} columns"
            for path in sorted((ROOT / "lessons" / "src").glob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if _width(line) > LINE_LENGTH and not line.startswith("# |")]
    assert not long, "lines longer than 120 columns:\n" + "\n".join(long)
