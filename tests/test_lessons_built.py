"""A committed lesson is its source, built: no notebook drifts from ``lessons/src/``.

Every lesson's student edition is rebuilt here without executing it (``tools/build_lessons.py``'s
``notebook``: the source's cells, the stubs, the quiz) and compared with the committed, executed
notebook cell by cell: kind, source and tags. Outputs are nbval's to compare. An edited source
whose notebook was not rebuilt fails with the lesson and the first cell that differs; the build
refuses to write a lesson whose figures it cannot render."""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402
import render_static  # noqa: E402

from parallel_lab.course import editions  # noqa: E402

SOURCES = sorted(build_lessons.SOURCES.glob("*.py"))
TRANSLATED = [s for s in SOURCES if s.stem not in editions.NOT_YET_TRANSLATED]

# An edition of the lessons, one line each: its name, its folder, how a source becomes its notebook
# (not executed), and the sources it has.
EDITIONS = [
    ("en", build_lessons.LESSONS, build_lessons.notebook, SOURCES),
    ("zh-Hant", editions.EDITIONS["zh-Hant"], lambda s: build_lessons.notebook(s, lang="zh-Hant"), TRANSLATED),
]


def _shown(text: str, limit: int = 160) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def first_difference(built, committed) -> str | None:
    """Where ``committed``'s cells first differ from ``built``'s (kind, source, tags), or None."""
    for index, (want, have) in enumerate(zip(built.cells, committed.cells)):
        where = f"cell {index} ({want.cell_type}, id {want.get('id')})"
        if want.cell_type != have.cell_type:
            return f"{where}: the notebook has a {have.cell_type} cell there"
        if want.source != have.source:
            lines = list(zip(want.source.splitlines(), have.source.splitlines()))
            line = next((n for n, (a, b) in enumerate(lines) if a != b), len(lines))
            wanted = (want.source.splitlines() + [""])[line]
            found = (have.source.splitlines() + [""])[line]
            return (f"{where}, line {line + 1}: the source says {_shown(wanted)}, "
                    f"the notebook {_shown(found)}")
        if want.metadata.get("tags", []) != have.metadata.get("tags", []):
            return (f"{where}: tags {want.metadata.get('tags', [])} in the source, "
                    f"{have.metadata.get('tags', [])} in the notebook")
    if len(built.cells) != len(committed.cells):
        return f"the source builds {len(built.cells)} cells, the notebook has {len(committed.cells)}"
    return None


def drift(source: Path, notebook: Path, build=build_lessons.notebook) -> str | None:
    """None when the committed ``notebook`` holds the cells ``build(source)`` makes; else what
    differs, naming the lesson, the first differing cell and the command that rebuilds it."""
    if not notebook.exists():
        return f"{notebook.relative_to(ROOT)} is missing: build it with tools/build_lessons.py {source.stem[:2]}"
    difference = first_difference(build(source), nbformat.read(notebook, as_version=4))
    if difference is None:
        return None
    return (f"{source.stem}: {notebook.relative_to(ROOT)} is not its source built: {difference}. "
            f"Rebuild it: tools/build_lessons.py {source.stem[:2]}")


BUILT = [(f"{name}/{s.stem}", folder / f"{s.stem}.ipynb", s, build)
         for name, folder, build, chosen in EDITIONS for s in chosen]


@pytest.mark.parametrize("notebook, source, build", [b[1:] for b in BUILT], ids=[b[0] for b in BUILT])
def test_every_committed_lesson_is_its_source_built(notebook, source, build):
    difference = drift(source, notebook, build)
    assert difference is None, difference


def test_a_source_edited_without_a_rebuild_is_named_with_its_cell(tmp_path):
    """The check can fail: one markdown line of lesson 03's source changed, its notebook not rebuilt."""
    source = build_lessons.SOURCES / "03_pipeline_bubble.py"
    text = source.read_text(encoding="utf-8")
    marker = "# %% [markdown]\n# "
    at = text.index(marker, text.index(marker) + 1) + len(marker)  # the second markdown cell's first line
    edited = tmp_path / source.name
    word = text[at:].split()[0]  # replaced, not added: the lesson's word count (its stated time) stays
    edited.write_text(text[:at] + "Edited" + text[at + len(word):], encoding="utf-8")
    message = drift(edited, build_lessons.LESSONS / f"{source.stem}.ipynb")
    assert message is not None and message.startswith("03_pipeline_bubble: lessons/03_pipeline_bubble.ipynb")
    assert "(markdown, id 03-" in message and "Edited" in message and "id 03-000" not in message
    assert message.endswith("Rebuild it: tools/build_lessons.py 03")


def test_a_tag_changed_without_a_rebuild_is_named(tmp_path):
    source = build_lessons.SOURCES / "05_1f1b_memory.py"
    edited = tmp_path / source.name
    # (not a points: tag, which would also change the lesson's stated time in its first cell)
    edited.write_text(source.read_text(encoding="utf-8").replace('"nbval-ignore-output"', '"nbval-skip"', 1),
                      encoding="utf-8")
    message = drift(edited, build_lessons.LESSONS / f"{source.stem}.ipynb")
    assert message is not None and "tags [" in message and "nbval-skip" in message


# ----------------------------------------------------------------------------------------------
# The build writes a lesson only with its figures' static renderings.


def test_the_build_refuses_without_chromium_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium to be found
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert render_static.find_browser() is None
    out = tmp_path / "out"
    for build in (lambda: build_lessons.build(SOURCES[0], "student", out), lambda: build_lessons.main(["0"])):
        with pytest.raises(SystemExit) as refused:
            build()
        message = str(refused.value)
        assert message.startswith(f"cannot build {SOURCES[0].name}") and "no Chrome/Chromium on PATH" in message
        assert "nothing was written" in message
    assert not out.exists()


def test_the_build_writes_nothing_when_rendering_fails(tmp_path, monkeypatch):
    source = tmp_path / "99_probe.py"
    source.write_text("# %% [markdown]\n# A probe.\n\n# %%\nprint(1)\n", encoding="utf-8")

    def broken(notebook, timeout=120):
        raise RuntimeError("the browser closed")

    monkeypatch.setattr(render_static, "available", lambda: None)
    monkeypatch.setattr(render_static, "render", broken)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"cannot build 99_probe.py: the static renderings of its figures failed "
                                         r"\(RuntimeError: the browser closed\); nothing was written"):
        build_lessons.build(source, "student", out)
    assert not out.exists()
