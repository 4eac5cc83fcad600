#!/usr/bin/env python3
"""Build the lesson notebooks from their sources and execute them (outputs are nbval's reference).

    .venv/bin/python tools/build_lessons.py            # every lessons/src/*.py
    .venv/bin/python tools/build_lessons.py 01         # the lessons whose name starts with 01

A source is a Python file in jupytext's "percent" format, read with jupytext itself (so an
instructor can also open a source as a notebook in JupyterLab, where jupytext is installed):

    # %% [markdown]
    # # A title
    # Some *markdown*.

    # %%
    x = 1

    # %% tags=["nbval-ignore-output"]
    widget  # output not compared by nbval (widgets, timings)

The build appends each lesson's quiz from its bank (``parallel_lab.course.quiz.text.lesson_cells``:
the widget, the text form, the answer sheet and the graded check), so the twelve lessons' identical
tail is written once. Each notebook gets kernelspec metadata (JupyterLab otherwise asks for a kernel)
and is executed top to bottom in lessons/ with the course's settings (one thread per process).
Plotly figures then also get a PNG (tools/render_static.py, which needs kaleido and Chromium) so
the lessons read on GitHub and nbviewer; without Chromium the build warns and skips that step.
"""

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

import render_static  # tools/, beside this file
from parallel_lab.course.quiz import bank, text

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "lessons" / "src"
LESSONS = ROOT / "lessons"
METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python", "pygments_lexer": "ipython3"},
}


def parse(source: str) -> list:
    """The cells of a percent-format source (jupytext), keeping of each cell's metadata only its tags."""
    cells = []
    for cell in jupytext.reads(source, fmt="py:percent").cells:
        tags = cell.metadata.get("tags", [])
        cell.metadata = {"tags": list(tags)} if tags else {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    return cells


def quiz_cells(lesson: str) -> list:
    """The quiz that ends lesson ``lesson`` ("01"), built from its bank; none when it has no bank."""
    if not any(b.lesson == lesson for b in bank.load_all()):
        return []
    return parse(text.lesson_cells(lesson))


def notebook(source: Path):
    """The unexecuted notebook of a lesson source: its cells, its quiz, stable ids, the metadata."""
    cells = parse(source.read_text(encoding="utf-8")) + quiz_cells(source.stem[:2])
    nb = nbformat.v4.new_notebook(cells=cells, metadata=dict(METADATA))
    for index, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"{source.stem[:2]}-{index:03d}"
    return nb


def build(source: Path) -> Path:
    nb = notebook(source)
    os.environ["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    # No per-cell timestamps: every rebuild would change the file.
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(LESSONS)}}).execute()
    # No saved widget state either: a FigureWidget's state embeds plotly.js (megabytes), and widgets
    # come alive when the student runs the cell. (nbclient's store_widget_state=False breaks on
    # Output widgets, so the state is dropped here.)
    nb.metadata.pop("widgets", None)
    target = LESSONS / f"{source.stem}.ipynb"
    nbformat.write(nb, target)
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
