#!/usr/bin/env python3
"""Build the lesson notebooks from their sources and execute them (outputs are nbval's reference).

    .venv/bin/python tools/build_lessons.py            # every lessons/src/*.py
    .venv/bin/python tools/build_lessons.py 01         # the lessons whose name starts with 01

A source is a Python file in the "percent" format (as jupytext writes it):

    # %% [markdown]
    # # A title
    # Some *markdown*.

    # %%
    x = 1

    # %% tags=["nbval-ignore-output"]
    widget  # output not compared by nbval (widgets, timings)

Each notebook gets kernelspec metadata (JupyterLab otherwise asks for a kernel) and is executed
top to bottom in lessons/ with the course's settings (one thread per process).
Plotly figures then also get a PNG (tools/render_static.py, which needs kaleido and Chromium) so
the lessons read on GitHub and nbviewer; without Chromium the build warns and skips that step.
"""

import ast
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

import render_static  # tools/, beside this file

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "lessons" / "src"
LESSONS = ROOT / "lessons"
MARKER = re.compile(r"^# %%(?P<markdown> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")
METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python", "pygments_lexer": "ipython3"},
}


def parse(text: str) -> list:
    """Cells of a percent-format source."""
    cells, kind, tags, lines = [], None, [], []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cell = nbformat.v4.new_code_cell(body)
            if tags:
                cell.metadata["tags"] = tags
            cells.append(cell)

    for line in text.split("\n"):
        match = MARKER.match(line)
        if match:
            flush()
            kind = "markdown" if match["markdown"] else "code"
            tags = ast.literal_eval(match["tags"]) if match["tags"] else []
            lines = []
        else:
            lines.append(line)
    flush()
    return cells


def build(source: Path) -> Path:
    notebook = nbformat.v4.new_notebook(cells=parse(source.read_text()), metadata=dict(METADATA))
    for index, cell in enumerate(notebook.cells):  # stable ids keep diffs small
        cell["id"] = f"{source.stem[:2]}-{index:03d}"
    os.environ["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    # No per-cell timestamps: every rebuild would change the file.
    NotebookClient(notebook, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(LESSONS)}}).execute()
    # No saved widget state either: a FigureWidget's state embeds plotly.js (megabytes), and widgets
    # come alive when the student runs the cell. (nbclient's store_widget_state=False breaks on
    # Output widgets, so the state is dropped here.)
    notebook.metadata.pop("widgets", None)
    target = LESSONS / f"{source.stem}.ipynb"
    nbformat.write(notebook, target)
    # Plotly figures also as PNGs, so the lesson reads on GitHub/nbviewer (tools/render_static.py).
    why = render_static.available()
    if why:
        print(f"WARNING: {target.name}: figures saved without static PNGs: {why}", file=sys.stderr)
    else:
        render_static.render_notebook(target)
    print(f"{target.relative_to(ROOT)}: executed in {time.perf_counter() - start:.1f} s, "
          f"{target.stat().st_size / 1e3:.0f} kB", file=sys.stderr)
    return target


def main(prefixes) -> None:
    for source in sorted(SOURCES.glob("*.py")):
        if not prefixes or any(source.stem.startswith(p) for p in prefixes):
            build(source)


if __name__ == "__main__":
    main(sys.argv[1:])
