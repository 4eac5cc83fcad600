#!/usr/bin/env python3
"""Build the lesson notebooks from their sources and execute them (outputs are nbval's reference).

    .venv/bin/python tools/build_lessons.py                      # the student edition of every lesson
    .venv/bin/python tools/build_lessons.py 01                   # the lessons whose name starts with 01
    .venv/bin/python tools/build_lessons.py --solutions DIR      # the instructor's solution edition
    .venv/bin/python tools/build_lessons.py --lang zh-Hant 03    # one language only (default: both)
    .venv/bin/python tools/build_lessons.py --markdown-only 05   # only the text changed: no re-execution

**Two editions.** A source holds each exercise's solution between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` in its answer cell (tagged ``answer:<check id>``). The **student edition**,
``lessons/*.ipynb`` (what Binder and ``course.py start`` open), replaces every such region by the stub
``# YOUR CODE HERE`` / ``raise NotImplementedError`` (nbgrader's convention), keeping the signature,
docstring and hints around it; executed, its check cells show the "not yet" verdict. The
**solution edition** (``--solutions DIR``, for instructors; never committed) keeps the solutions
without the markers, and its check cells pass. A prediction's answer cell (``answer:predict:<id>``,
``parallel_lab.course.predictions``) gets no stub: its solution region comes after
``my_prediction = None``, which is what the student edition keeps.

A source is a Python file in jupytext's "percent" format, read with jupytext itself (so an
instructor can also open a source as a notebook in JupyterLab, where jupytext is installed):

    # %% [markdown]
    # # A title
    # Some *markdown*.

    # %%
    x = 1

    # %% tags=["nbval-ignore-output"]
    widget  # output not compared by nbval (widgets, timings)

**Two languages.** Every lesson is built in English (``lessons/``) and, unless it is listed in
``parallel_lab.course.editions.NOT_YET_TRANSLATED``, in Traditional Chinese (``lessons/zh-Hant/``):
the same cells, its markdown and the comments and docstrings of its code cells from the lesson's
catalog (``lessons/locale/zh_Hant/<lesson>.po``; ``parallel_lab.i18n.codetext``), its first ``setup()``
given the language, its quiz text in that language; the build refuses a lesson
whose catalog lacks a cell or holds a fuzzy one (``tools/catalogs.py check`` says which).

**What a student sees first.** Under each lesson's title the build writes how long it takes, by the
rule of ``parallel_lab.course.load`` (words, code cells, predictions, exercise points, quiz
questions), and in lesson 00's course map every lesson's minutes, in the edition's language, so that
the numbers cannot drift from the sources (``--readme`` writes them into the README's map). After
executing, it hides the outputs of the cells tagged ``reveals:<prediction id>`` behind a reveal
(``parallel_lab.course.hidden``): nothing visible answers a prediction before the student runs the
cell. ``--markdown-only`` rewrites the markdown of committed lessons from their sources without
executing anything, when only text changed: markdown, and the comments and docstrings of code cells
where the outputs cannot show them (it refuses when a code cell's program differs).

The build appends each lesson's quiz from its bank (``parallel_lab.course.quiz.text.lesson_cells``:
the practice widget, the student id with the graded quiz drawn for it, the answer sheet and the
graded check), so the lessons' identical tail is written once. Each notebook gets kernelspec
metadata (JupyterLab otherwise asks for a kernel) and is executed top to bottom in lessons/ with the
course's settings (one thread per process).
Plotly figures then also get a PNG (tools/render_static.py, which needs kaleido and Chromium) so
the lessons read on GitHub and nbviewer. Where the student edition's renderings cannot be made (no
Chromium, kaleido missing or failing) the build refuses, before it executes anything where it can
tell, and writes nothing: a lesson without its PNGs would only fail tests/test_static_render.py. The
solution edition (never committed, never checked for them) is written without PNGs, with a warning.
"""

import argparse
import os
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import render_static  # tools/, beside this file
from notebook_client import notebook_client  # tools/: nbclient that cannot miss a kernel reply

from parallel_lab import i18n
from parallel_lab.course import editions, hidden, load, predictions, tags
from parallel_lab.course.quiz import bank, text
from parallel_lab.i18n import codetext

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "lessons" / "src"
LESSONS = ROOT / "lessons"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
SOLUTION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
STUB = "# YOUR CODE HERE\nraise NotImplementedError"
METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python", "pygments_lexer": "ipython3"},
}


def parse(source: str) -> list:
    """The cells of a percent-format source (jupytext), keeping of each cell's metadata only its tags."""
    cells = []
    for cell in jupytext.reads(source, fmt="py:percent").cells:
        cell_tags = cell.metadata.get("tags", [])
        cell.metadata = {"tags": list(cell_tags)} if cell_tags else {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    return cells


def student_source(source: str, stub: str = STUB) -> str:
    """An answer cell's source with every solution region replaced by the stub (same indentation);
    with ``stub=""`` (a prediction's answer cell) the regions are dropped, and the cell's end trimmed."""
    if not stub:
        return SOLUTION.sub("", source).rstrip()
    return SOLUTION.sub(lambda m: "\n".join(m["indent"] + line for line in stub.splitlines()), source)


def solution_source(source: str) -> str:
    """An answer cell's source with the solution markers removed."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in (BEGIN, END))


def check_editions(name: str, cells) -> None:
    """Every check cell has its answer cell before it; solution regions sit in answer cells only."""
    seen = set()
    for cell in cells:
        seen |= set(tags.answers(cell))
        for check in tags.checks(cell):
            if check not in seen:
                raise SystemExit(f"{name}: check cell check:{check} has no answer cell (tag answer:{check}) before it")
        if BEGIN in cell.source and not tags.answers(cell):
            raise SystemExit(f"{name}: a solution region outside an answer cell (tag it answer:<check id>)")
    for check, cell in tags.answer_cells(cells).items():  # a markdown answer (a written analysis) has none
        if tags.quiz(check) is None and cell.cell_type == "code" and BEGIN not in cell.source:
            raise SystemExit(f"{name}: answer cell answer:{check} holds no solution region")


def check_predictions(name: str, cells) -> None:
    """The graded predictions tagged in a lesson (``check:predict:<id>``) are the registry's for it
    (``parallel_lab.course.predictions.GRADED``), and every prediction's student edition leaves
    ``my_prediction = None``."""
    lesson = name[:2]
    tagged = {tags.prediction(c) for cell in cells for c in tags.checks(cell)} - {None}
    registered = {p.id for p in predictions.GRADED.values() if p.lesson == lesson}
    if tagged != registered:
        raise SystemExit(f"{name}: graded predictions tagged {sorted(tagged)} != registered for lesson "
                         f"{lesson} {sorted(registered)} (parallel_lab.course.predictions.GRADED)")
    for check, cell in tags.answer_cells(cells).items():
        if tags.prediction(check) is not None:
            try:
                left = predictions.read_prediction(student_source(cell.source, stub=""), kind=None)
            except ValueError as err:
                left = err
            if left is not None:
                raise SystemExit(f"{name}: answer:{check} must leave {predictions.VARIABLE} = None for the "
                                 f"student, with the answer in a solution region after it ({left})")


def quiz_cells(lesson: str, lang: str = "en") -> list:
    """The quiz that ends lesson ``lesson`` ("01"), built from its bank, its text in ``lang``; none
    when it has no bank."""
    if not any(b.lesson == lesson for b in bank.load_all()):
        return []
    with i18n.using(lang):
        return parse(text.lesson_cells(lesson))


def localized_links(cells, lang: str) -> list:
    """In a ``lang`` edition, a link to a lesson whose ``lang`` edition is not built yet points to the
    English one (``(00_x.ipynb)`` -> ``(../00_x.ipynb)``)."""
    untranslated = "|".join(re.escape(stem) for stem in editions.NOT_YET_TRANSLATED)
    if not untranslated:
        return cells
    pattern = re.compile(rf"\]\(({untranslated})\.ipynb")
    for cell in cells:
        if cell.cell_type == "markdown":
            cell.source = pattern.sub(r"](../\1.ipynb", cell.source)
    return cells


def quiz_items(lesson: str) -> int:
    """How many questions lesson ``lesson``'s quiz asks (0 without a bank)."""
    return sum(len(b.items) for b in bank.load_all() if b.lesson == lesson)


def lesson_load(source: Path) -> load.Load:
    """What lesson ``source`` asks of a student, by the rule of ``parallel_lab.course.load``."""
    return load.measure(parse(source.read_text(encoding="utf-8")), quiz_items(source.stem[:2]))


def with_load(source: Path, cells, lang: str) -> list:
    """The lesson's cells with its time stated under its title, and, in lesson 00, every lesson's
    time after its line of the course map; in ``lang`` (the rule's minutes, written at build time so
    that they cannot drift from the source)."""
    with i18n.using(lang):
        first = next(c for c in cells if c.cell_type == "markdown")
        first.source = load.with_statement(first.source, load.statement(lesson_load(source)))
        if source.stem.startswith("00"):
            minutes = {s.stem[:2]: lesson_load(s).minutes for s in sorted(SOURCES.glob("*.py"))}
            for cell in cells:
                if cell.cell_type == "markdown":
                    cell.source = load.with_map_minutes(cell.source, minutes)
    return cells


def notebook(source: Path, edition: str = "student", lang: str = "en"):
    """The unexecuted notebook of a lesson source in ``edition`` ("student" or "solutions") and
    ``lang``: its cells (markdown from the lesson's catalog in a translated edition), its time (the
    rule's), its quiz, stable ids, the metadata."""
    cells = parse(source.read_text(encoding="utf-8"))
    if lang != i18n.DEFAULT:
        cells = localized_links(editions.translated_cells(source.stem, cells, lang), lang)
    cells = with_load(source, cells, lang)
    cells += quiz_cells(source.stem[:2], lang)
    check_editions(source.name, cells)
    check_predictions(source.name, cells)
    for cell in cells:
        if cell.cell_type == "code" and edition == "student":
            cell.source = student_source(cell.source, stub="" if tags.is_prediction_answer(cell) else STUB)
        elif cell.cell_type == "code":
            cell.source = solution_source(cell.source)
    # A translated edition says its language (the grader writes its feedback in it); English is the default.
    metadata = dict(METADATA) if lang == i18n.DEFAULT else {**METADATA, "parallel_lab": {"lang": lang}}
    nb = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    for index, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"{source.stem[:2]}-{index:03d}"
    return nb


def refuse_without_renderer(names) -> None:
    """SystemExit naming the lessons when their figures' static renderings cannot be made here."""
    why = render_static.available()
    if why:
        raise SystemExit(f"cannot build {', '.join(names)}: the static renderings of the figures cannot be made "
                         f"here: {why}. A lesson without them fails tests/test_static_render.py; nothing was "
                         f"written.")


def build(source: Path, edition: str = "student", directory: Path = LESSONS, lang: str = "en") -> Path:
    """Execute ``source``'s notebook in ``edition`` and ``lang``, render its figures, and only then
    write it."""
    why = render_static.available()
    if edition == "student":
        refuse_without_renderer([source.name])
    nb = notebook(source, edition, lang)
    os.environ["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    # No per-cell timestamps: every rebuild would change the file.
    # Executed in its edition's folder (lessons/, lessons/zh-Hant/: where nbval runs it), wherever
    # the notebook is written.
    where = LESSONS if lang == i18n.DEFAULT else editions.EDITIONS[lang]
    where.mkdir(parents=True, exist_ok=True)
    notebook_client(nb, timeout=600, record_timing=False, resources={"metadata": {"path": str(where)}}).execute()
    # No saved widget state either: a FigureWidget's state embeds plotly.js (megabytes), and widgets
    # come alive when the student runs the cell. (nbclient's store_widget_state=False breaks on
    # Output widgets, so the state is dropped here.)
    nb.metadata.pop("widgets", None)
    # Plotly figures also as PNGs, so the lesson reads on GitHub/nbviewer (tools/render_static.py).
    if why:  # the solution edition only
        print(f"WARNING: {source.stem}: figures written without static PNGs: {why}", file=sys.stderr)
    else:
        try:
            render_static.render(nb)
        except Exception as exc:  # kaleido and the browser fail in many ways; all mean the same here
            raise SystemExit(f"cannot build {source.name}: the static renderings of its figures failed "
                             f"({type(exc).__name__}: {exc}); nothing was written.") from exc
    # Outputs that answer a prediction wait, in the student edition, until the student runs their cell
    # (parallel_lab.course.hidden; lessons/conftest.py gives nbval the real ones back).
    if edition == "student":
        with i18n.using(lang):
            hidden.hide(nb)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{source.stem}.ipynb"
    nbformat.write(nb, target)
    print(f"{target}: {edition} edition ({lang}) executed in {time.perf_counter() - start:.1f} s, "
          f"{target.stat().st_size / 1e3:.0f} kB", file=sys.stderr)
    return target


def _shown_text(cell) -> str:
    """Everything a code cell's outputs show, the hidden ones (``course.hidden``) included."""
    outputs = list(cell.get("outputs", [])) + list(cell.get("metadata", {}).get("parallel_lab", {})
                                                    .get("hidden_outputs", []))
    parts = []
    for output in outputs:
        parts.append(str(output.get("text", "")))
        parts += [str(value) for value in output.get("data", {}).values()]
        parts += [str(line) for line in output.get("traceback", [])]
    return "\n".join(parts)


def only_words_changed(new: str, old, target: Path) -> bool:
    """True when code cell ``old`` (committed, executed) differs from ``new`` only in comments and
    docstrings, in a way its outputs cannot show: the same program (``codetext.same_program``), no
    output quoting a replaced English text, and, when a statement moved to another line, no output
    that names lines (a traceback). SystemExit saying why when the cell must be executed."""
    if not codetext.same_program(new, old.source):
        return False
    gone = {p.text for p in codetext.pieces(old.source)} - {p.text for p in codetext.pieces(new)}
    shown = _shown_text(old)
    quoted = [text for text in gone for line in text.splitlines() if len(line.strip()) > 8 and line.strip() in shown]
    if quoted:
        raise SystemExit(f"{target}: code cell {old.get('id')}: its output shows {quoted[0][:60]!r}, which changed: "
                         f"build it")
    if codetext.moved_lines(old.source, new) and (re.search(r"\bline \d+|Cell In\[", shown) or any(
            o.get("output_type") == "error" for o in old.get("outputs", []))):
        raise SystemExit(f"{target}: code cell {old.get('id')}: its lines moved and its output names lines: build it")
    return True


def refresh_markdown(source: Path, directory: Path = LESSONS, lang: str = "en") -> Path:
    """Rewrite the markdown cells of a committed student edition from its source, and the code cells
    whose change is only in comments and docstrings (``only_words_changed``: the same program, outputs
    that cannot show the change), without executing anything: for a change of text only. Refuses
    (SystemExit, writing nothing) when any other code cell's source, or any tags, or the cells' kinds
    and order, differ from the build's: then the outputs may differ too and the lesson must be built."""
    target = directory / f"{source.stem}.ipynb"
    fresh = notebook(source, "student", lang)
    committed = nbformat.read(target, as_version=4)
    kinds = [c.cell_type for c in fresh.cells], [c.cell_type for c in committed.cells]
    if kinds[0] != kinds[1]:
        raise SystemExit(f"{target}: its cells are not the source's (kinds or order differ): build it")
    for new, old in zip(fresh.cells, committed.cells):
        if new.cell_type == "code" and (tags.of(new) != tags.of(old) or (
                new.source != old.source and not only_words_changed(new.source, old, target))):
            raise SystemExit(f"{target}: code cell {old.get('id')} differs from the source's: build it")
        old.source = new.source
    nbformat.write(committed, target)
    print(f"{target}: markdown refreshed from {source.name} (nothing executed)", file=sys.stderr)
    return target


README = ROOT / "README.md"
READMES = (README, ROOT / "README.zh-Hant.md")  # the front door in each language, each with the course map
README_ROW = re.compile(r"^\| \[(?P<n>\d\d) · (?P<title>[^\]]+)\]\(lessons/(?P<edition>zh-Hant/)?"
                        r"(?P<stem>\d\d_[a-z0-9_]+)\.ipynb\) \| (?:(?P<minutes>\d+) (?P<unit>min|分鐘) \| )?", re.M)


BINDER_LESSON = re.compile(r"\?urlpath=lab/tree/lessons/(?:zh-Hant/)?(?P<stem>\d\d_[a-z0-9_]+)\.ipynb\)")


def readme_with_minutes(text: str, lang: str = "en") -> str:
    """A README's course map with each lesson's minutes (by the rule) in its second column; in the
    zh-Hant README, each lesson's links go to its zh-Hant edition once it is translated (to the
    English one while it is in ``editions.NOT_YET_TRANSLATED``)."""
    def folder(stem: str) -> str:
        return "zh-Hant/" if lang != "en" and stem not in editions.NOT_YET_TRANSLATED else ""

    def row(match):
        minutes = lesson_load(SOURCES / f"{match['stem']}.py").minutes
        return (f"| [{match['n']} · {match['title']}](lessons/{folder(match['stem'])}{match['stem']}.ipynb) | "
                f"{minutes} {match['unit'] or 'min'} | ")

    text = README_ROW.sub(row, text)
    if lang == "en":
        return text
    return BINDER_LESSON.sub(lambda m: f"?urlpath=lab/tree/lessons/{folder(m['stem'])}{m['stem']}.ipynb)", text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prefixes", nargs="*", metavar="NN", help="lessons whose name starts with NN (default: all)")
    parser.add_argument("--solutions", metavar="DIR", type=Path,
                        help="build the instructor's solution edition into DIR instead of the student edition")
    parser.add_argument("--lang", choices=list(i18n.LANGUAGES),
                        help="build this language's edition only (default: English, and Traditional Chinese for "
                             "every lesson not in parallel_lab.course.editions.NOT_YET_TRANSLATED)")
    parser.add_argument("--readme", action="store_true",
                        help="only write each lesson's minutes (by the rule) into the READMEs' course maps")
    parser.add_argument("--markdown-only", action="store_true",
                        help="rewrite only the markdown cells of the committed student editions (refused when a code "
                             "cell differs from its source in more than its comments and docstrings)")
    args = parser.parse_args(argv)
    if args.readme:
        for readme, lang in zip(READMES, ("en", "zh-Hant")):
            readme.write_text(readme_with_minutes(readme.read_text(encoding="utf-8"), lang), encoding="utf-8")
            print(f"{readme}: the course map's minutes written", file=sys.stderr)
        return
    edition, directory = ("solutions", args.solutions.resolve()) if args.solutions else ("student", LESSONS)
    if edition == "solutions" and directory == LESSONS.resolve():
        raise SystemExit("the solution edition never goes into lessons/ (what students open): pick another DIR")
    chosen = [source for source in sorted(SOURCES.glob("*.py"))
              if not args.prefixes or any(source.stem.startswith(p) for p in args.prefixes)]
    if edition == "student" and not args.markdown_only:
        refuse_without_renderer([source.name for source in chosen])  # before the first one runs
    languages = [args.lang] if args.lang else list(i18n.LANGUAGES)
    for source in chosen:
        for lang in languages:
            if lang != i18n.DEFAULT and source.stem in editions.NOT_YET_TRANSLATED:
                if args.lang:
                    print(f"{source.stem}: no {lang} edition yet (parallel_lab.course.editions.NOT_YET_TRANSLATED)",
                          file=sys.stderr)
                continue
            folder = directory if lang == i18n.DEFAULT else \
                (directory / lang if edition == "solutions" else editions.EDITIONS[lang])
            if args.markdown_only:
                refresh_markdown(source, folder, lang)
            else:
                build(source, edition, folder, lang)


if __name__ == "__main__":
    main()
