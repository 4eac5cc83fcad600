"""Outputs that answer a prediction stay hidden in the student edition until the student runs the cell.

The lessons are committed executed (nbval's reference, and so that they read without a kernel). A
cell whose output answers a prediction -- the run after ``predict(...)``, a table or figure that
shows the answer -- would then show the answer before the student has written their number down.
So the lesson source tags such a cell ``reveals:<prediction id>`` (``course.tags``), and the build
(``tools/build_lessons.py``), after executing the notebook and rendering its figures, moves that
cell's outputs out of sight (``hide``):

- **what the student sees**: one output in their place, a collapsed ``<details>`` whose summary
  says that the output answers prediction ``<id>``, to predict first and then run the cell; it
  opens on a click, for a reader without a kernel (GitHub, nbviewer, a closed Binder), and shows
  the stored output's text and, for a figure, its static PNG. Running the cell replaces it with the
  real output, as for any cell.
- **what nbval compares**: the real outputs, kept in the cell's metadata (``hidden_outputs`` in
  its ``parallel_lab`` entry; without their PNGs, which nbval never compares).
  ``lessons/conftest.py`` puts them back as the cell's reference outputs when pytest collects a
  lesson (``restore``), so ``pytest lessons/NN_name.ipynb`` compares every cell as before. Run
  nbval from another folder and those cells differ: run it from the repository.

``reference_outputs(cell)`` gives a cell's real outputs (hidden or not), for tests that read what
a lesson printed; ``visible_text(output)`` what a reader sees of an output before running anything
(of a hidden cell: the summary line only). ``tests/test_predictions_hidden.py`` holds the rule that
nothing visible answers a prediction before its answer cell.
"""

from __future__ import annotations

import copy
import html

import nbformat

from parallel_lab.course import tags
from parallel_lab.i18n import _

KEY = "hidden_outputs"  # in cell.metadata["parallel_lab"]
PNG, PLOTLY = "image/png", "application/vnd.plotly.v1+json"


def _own(cell) -> dict:
    meta = cell.setdefault("metadata", {})
    if not isinstance(meta.get("parallel_lab"), dict):
        meta["parallel_lab"] = {}
    return meta["parallel_lab"]  # re-read: a notebook node stores a copy of the dict it is given


def is_hidden(cell) -> bool:
    """Whether the build hid this cell's outputs (its real ones are in the metadata)."""
    own = cell.get("metadata", {}).get("parallel_lab")
    return isinstance(own, dict) and KEY in own


def reference_outputs(cell) -> list:
    """The outputs the cell really produced: the stored ones, or those a hidden cell keeps aside."""
    if is_hidden(cell):
        return cell["metadata"]["parallel_lab"][KEY]
    return cell.get("outputs", [])


def _text_of(output) -> tuple[str, str | None]:
    """``(escaped HTML text, PNG or None)`` of one output, for the reveal."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>", None
    if kind == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>", None
    data = output.get("data", {})
    if PLOTLY in data:
        png = data.get(PNG)
        return ("" if png else f"<p>{html.escape(_('(a figure: run the cell to draw it)'))}</p>"), png
    if "text/html" in data:
        return "".join(data["text/html"]) if isinstance(data["text/html"], list) else data["text/html"], None
    if PNG in data:
        return "", data[PNG]
    if "text/plain" in data:
        text = "".join(data["text/plain"]) if isinstance(data["text/plain"], list) else data["text/plain"]
        return f"<pre>{html.escape(text)}</pre>", None
    return "", None


def summary(ids) -> str:
    """The line a student sees in place of a hidden output (in the process's language)."""
    return _("Output hidden: it answers prediction {ids}. Write your prediction first, then run this cell. "
             "(Reading without a kernel? Click to show the stored output.)").format(ids=", ".join(ids))


def placeholder(outputs: list, ids) -> dict:
    """The one output shown instead of ``outputs``: a collapsed reveal (HTML) and a plain line."""
    parts = []
    for output in outputs:
        text, png = _text_of(output)
        parts.append(text)
        if png:
            parts.append(f'<img alt="figure" src="data:image/png;base64,{"".join(png).strip()}">')
    body = "\n".join(p for p in parts if p)
    line = summary(ids)
    return nbformat.v4.new_output(
        "display_data",
        data={"text/html": f"<details><summary>{html.escape(line)}</summary>\n{body}\n</details>", "text/plain": line},
        metadata={"parallel_lab": {"hidden": list(ids)}})


def hide(nb) -> list:
    """Hide, in an executed student edition, the outputs of every cell tagged ``reveals:<id>``:
    the real outputs (without PNGs) go to the cell's metadata, a collapsed reveal takes their
    place. Returns the ids of the cells hidden."""
    hidden = []
    for cell in nb.cells:
        ids = tags.reveals(cell)
        if cell.get("cell_type") != "code" or not ids or is_hidden(cell):
            continue
        outputs = cell.get("outputs", [])
        kept = copy.deepcopy(outputs)
        for output in kept:  # nbval never compares PNGs; the reveal carries them
            output.get("data", {}).pop(PNG, None)
        _own(cell)[KEY] = kept
        cell["outputs"] = [placeholder(outputs, ids)]
        hidden.append(cell.get("id"))
    return hidden


def restore(cell) -> bool:
    """Put a hidden cell's real outputs back as its outputs (for nbval, on the collected copy)."""
    if not is_hidden(cell):
        return False
    cell["outputs"] = [nbformat.from_dict(o) for o in copy.deepcopy(cell["metadata"]["parallel_lab"][KEY])]
    return True


def visible_text(output) -> str:
    """What a reader sees of an output without running anything: all of its text (the stream, every
    text mime type, the strings of a plotly figure: titles, axes, legends, annotations, hovers), or,
    for a hidden cell's reveal, its summary line only."""
    own = output.get("metadata", {}).get("parallel_lab", {}) if isinstance(output.get("metadata"), dict) else {}
    data = output.get("data", {})
    if isinstance(own, dict) and own.get("hidden"):
        text = data.get("text/plain", "")
        return "".join(text) if isinstance(text, list) else text
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename', '')}: {output.get('evalue', '')}"
    texts = []
    for mime, value in data.items():
        if mime == PLOTLY:
            texts.extend(_strings(value))
        elif mime.startswith("text/"):
            texts.append("".join(value) if isinstance(value, list) else str(value))
        elif mime.endswith("+json") or mime == "application/json":
            texts.extend(_strings(value))
    return "\n".join(texts)


def _strings(value) -> list:
    """Every string inside a JSON value (a plotly figure's words; its number arrays are left out)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
