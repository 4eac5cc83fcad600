"""Lessons read without a kernel: every committed plotly figure also carries a PNG (GitHub, nbviewer).

The PNGs are added by tools/render_static.py (called by tools/build_lessons.py)."""

import base64
import struct
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")) + \
    sorted((ROOT / "lessons").glob("zh-Hant/[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: str(p.relative_to(ROOT / "lessons")))
def test_every_plotly_figure_has_a_small_png(path):
    notebook = nbformat.read(path, as_version=4)
    figures = [(cell.id, output.data) for cell in notebook.cells for output in cell.get("outputs", [])
               if PLOTLY in output.get("data", {})]
    missing = [cell_id for cell_id, data in figures if "image/png" not in data]
    assert not missing, (f"plotly outputs without image/png in cells {missing}: run "
                         f"tools/render_static.py {path.relative_to(ROOT)} (or rebuild the lesson)")
    for cell_id, data in figures:
        png = base64.b64decode(data["image/png"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n", cell_id
        width, height = struct.unpack(">II", png[16:24])
        assert 300 <= width <= 1600 and 150 <= height <= 1600, (cell_id, width, height)
        assert len(png) < 150_000, f"{cell_id}: {len(png) / 1e3:.0f} kB PNG"
    assert path.stat().st_size < 1_500_000
