#!/usr/bin/env python3
"""Give every plotly figure of an executed notebook a PNG, so lessons read well without a kernel.

    .venv/bin/python tools/render_static.py lessons/00_why_split_a_model.ipynb lessons/01_*.ipynb

GitHub and nbviewer cannot draw ``application/vnd.plotly.v1+json`` outputs (the lessons store figures
as JSON, without plotly.js, see ``parallel_lab.course.notebook.setup``). For each such output this adds an
``image/png`` rendering beside the JSON in the same output: JupyterLab still prefers the plotly
mimetype (interactive), static viewers show the picture, and nbval does not compare ``image/png``
(it skips images unless run with nbdime), so the notebook stays a valid nbval reference.

Rendering uses kaleido (>= 1), which drives a Chrome/Chromium found on PATH (Debian's ``chromium``)
or named by ``BROWSER_PATH``; plotly.js comes from the installed plotly package (no network). PNGs are
720 px wide unless the figure sets its width, at scale 1, re-compressed at zlib level 9.
Running it again replaces the PNGs (idempotent).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import nbformat

PLOTLY = "application/vnd.plotly.v1+json"
PNG = "image/png"
WIDTH, HEIGHT = 720, 450  # plotly's default height is 450 when a figure sets none
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str | None:
    """The Chrome/Chromium that kaleido will drive: BROWSER_PATH, else the first one on PATH."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def available() -> str | None:
    """Why static rendering cannot run here, or None when it can."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install 'kaleido>=1')"
    if find_browser() is None:
        return "no Chrome/Chromium on PATH (Debian: apt-get install chromium; or set BROWSER_PATH)"
    return None


def recompress(png: bytes) -> bytes:
    """The same image with its pixel data deflated at level 9 (Chrome writes fast, not small).
    Other chunks are kept as they are; the result is returned only when it is smaller."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    chunks, idat, position = [], b"", 8
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IDAT":
            if not idat:
                chunks.append((b"IDAT", None))  # where the pixel data goes
            idat += body
        else:
            chunks.append((kind, body))
    packed = zlib.compress(zlib.decompress(idat), 9)
    out = [png[:8]]
    for kind, body in chunks:
        body = packed if body is None else body
        out.append(struct.pack(">I", len(body)) + kind + body +
                   struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    smaller = b"".join(out)
    return smaller if len(smaller) < len(png) else png


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    return struct.unpack(">II", png[16:24])


def _figure(data: dict) -> tuple[dict, dict]:
    """The figure to draw and kaleido's options (size from the figure's layout, else the defaults)."""
    figure = {"data": data.get("data", []), "layout": data.get("layout", {})}
    layout = figure["layout"]
    return figure, {"format": "png", "scale": 1, "width": layout.get("width") or WIDTH,
                    "height": layout.get("height") or HEIGHT}


def targets(notebook) -> list[tuple[dict, dict]]:
    """(output data to receive a PNG, plotly figure JSON) for every figure of the notebook."""
    return [(output["data"], output["data"][PLOTLY]) for cell in notebook.cells
            for output in cell.get("outputs", []) if PLOTLY in output.get("data", {})]


async def _render(figures: list[dict], timeout: float) -> list[bytes]:
    """PNG bytes of each figure, in order, from one browser."""
    import kaleido

    pngs = []
    # mathjax=False: kaleido would load MathJax from a CDN; the lessons' figures use no LaTeX.
    async with kaleido.Kaleido(path=find_browser(), mathjax=False, timeout=timeout) as k:
        for figure in figures:
            spec, options = _figure(figure)
            pngs.append(await k.calc_fig(spec, opts=options))
    return pngs


def render(notebook, timeout: float = 120) -> list[int]:
    """Add a PNG to every plotly output of ``notebook`` (in memory); the PNG sizes in bytes."""
    found = targets(notebook)
    if not found:
        return []
    pngs = asyncio.run(_render([figure for _, figure in found], timeout))
    sizes = []
    for (data, _), png in zip(found, pngs):
        png = recompress(png)
        data[PNG] = base64.b64encode(png).decode("ascii")
        sizes.append(len(png))
    return sizes


def render_notebook(path: Path, timeout: float = 120) -> list[int]:
    """Add a PNG to every plotly output of ``path`` (rewritten in place); the PNG sizes in bytes."""
    notebook = nbformat.read(path, as_version=4)
    sizes = render(notebook, timeout)
    if sizes:
        nbformat.write(notebook, path)
    return sizes


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    why = available()
    if why:
        print(f"[render_static] cannot render: {why}", file=sys.stderr)
        return 1
    for name in paths:
        path = Path(name)
        sizes = render_notebook(path)
        print(f"[render_static] {path}: {len(sizes)} PNG(s), "
              f"{', '.join(f'{s / 1e3:.0f} kB' for s in sizes) or '-'}; notebook {path.stat().st_size / 1e3:.0f} kB",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
