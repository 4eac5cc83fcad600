"""The course as students meet it: the lessons opened in JupyterLab in a real (headless) Chromium.

One JupyterLab server and one browser serve the whole module; each lesson is opened once, its saved
figures checked, its outputs cleared and all its cells run from the Run menu (``lessons`` fixture);
tests then look at and play with the page. Screenshots go to artifacts/screenshots/. At the end every
process the test started (server, kernels, ranks, browser) must be gone and the committed notebooks
unchanged.

Needs Debian's ``chromium`` (``apt-get install chromium``) and Playwright's Python package (the
``test`` extra). Without them the tests are skipped, except under CI (``CI=true``), where they fail.
"""

import hashlib
import importlib.util
import re

import psutil
import pytest
from browser_support import HOOKS, ROOT, Browser, JupyterServer, chromium_path, feature_lesson, unavailable, wait_for
from exercise_support import lesson_solution

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

PLOTLY = "application/vnd.plotly.v1+json"
LESSON_00 = "lessons/00_why_split_a_model.ipynb"
LESSON_01 = "lessons/01_ranks_and_collectives.ipynb"


def _missing() -> str | None:
    if chromium_path() is None:
        return "Debian's chromium is not on PATH (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright's Python package is not installed (pip install -e '.[test]')"
    return None


def _fingerprint() -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "lessons").glob("*.ipynb")}


def _children() -> list[tuple[int, str]]:
    """(pid, name) of this process's descendants."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            found.append((p.pid, p.name()))
        except psutil.NoSuchProcess:
            pass
    return found


def _saved_figures(notebook: str) -> int:
    import nbformat

    nb = nbformat.read(ROOT / notebook, as_version=4)
    return sum(PLOTLY in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


@pytest.fixture(scope="module")
def lab_session():
    """(server, browser) for the module; afterwards nothing of theirs may still run, and the
    committed lessons must be byte for byte what they were."""
    why = _missing()
    if why:
        unavailable(f"browser tests need a browser: {why}")
    before = _fingerprint()
    with JupyterServer(ROOT) as server, Browser() as browser:
        yield server, browser
    strays = [f"{pid} {name}" for pid, name in _children() if any(n in name for n in ("chrom", "jupyter", "node"))]
    leftovers = server.leftovers + browser.leftovers + strays
    assert not leftovers, f"processes left running after shutdown: {leftovers}"
    assert _fingerprint() == before, "a lesson notebook changed on disk during the browser test"


@pytest.fixture(scope="module")
def lessons(lab_session):
    """``get(notebook)``: the lesson open in JupyterLab, as a student finds it and then after
    Run All Cells (cleared first, so every output shown is fresh); opened once per module."""
    server, browser = lab_session
    opened = {}

    def get(notebook: str):
        if notebook not in opened:
            name = notebook.split("/")[-1].split("_")[0]
            lab = browser.open_notebook(server, notebook)
            # Before anything runs, each saved figure shows its static PNG (tools/render_static.py;
            # jupyterlab-plotly shows a bundle's image/png) and turns into a live chart on hover.
            lab.saved_figures = _saved_figures(notebook)
            images = lab.panel.locator(".jp-RenderedPlotly img.plot-img[src^='data:image/png']")
            wait_for(lambda: images.count() >= lab.saved_figures, 60, 0.5, f"{notebook}: saved figures shown")
            lab.screenshot(f"{name}-opened")
            if lab.saved_figures:
                lab.screenshot(f"{name}-saved-figure", images.first)
                images.first.dispatch_event("mouseenter")
                wait_for(lambda: lab.plotly_figures().count() >= 1, 60, 0.5, f"{notebook}: live chart on hover")
            lab.clear_outputs()
            lab.run_all(timeout=240)
            server.remember_processes()
            opened[notebook] = lab
        return opened[notebook]

    yield get
    for lab in opened.values():
        lab.close()


def _svg(chart) -> str:
    """A plotly chart's drawing, to tell whether it changed."""
    return chart.locator("svg.main-svg").first.inner_html()


# --- lessons that exist ---------------------------------------------------------------------------

def test_lesson_01_runs_in_the_browser_and_its_exercise_passes_once_written(lessons):
    """The student edition as a student meets it: every cell runs, the exercise says NOT YET (its
    stub), and once the student types a solution into the answer cell and runs it, the try-it cell
    on ranks and the check, the try-it cell shows the sums and the verdict is PASSED."""
    lab = lessons(LESSON_01)
    assert not lab.errors(), lab.errors()
    assert lab.saved_figures >= 6  # five collectives and the α–β fit
    wait_for(lambda: lab.plotly_figures().count() >= lab.saved_figures, 60, 0.5, "figures drawn after the run")
    assert "ring all-reduce: NOT YET" in lab.outputs_text()
    assert "ring all-reduce on 4 ranks: PASSED" not in lab.outputs_text()
    # The cells a student runs, found by what they hold (a markdown cell sits between the answer and
    # its try-it cell, so counting Shift+Enters from the answer would run the wrong cells).
    answer = lab.code_cell("def my_ring_all_reduce")
    try_it = lab.code_cell("%%ranks 4 --with my_ring_all_reduce")
    check = lab.code_cell("check_ring_all_reduce(my_ring_all_reduce)")
    assert "NOT YET" in lab.output_of(try_it)  # the stub, run on ranks
    lab.edit(answer)
    lab.page.keyboard.press("Control+A")
    # inserted as one piece of text: no auto-indentation or closing brackets on the way
    lab.page.keyboard.insert_text(lesson_solution("01_ranks_and_collectives.py", "ring-all-reduce"))
    lab.run_cell(answer)
    lab.run_cell(try_it)  # the answer on 4 ranks: every rank ends with the same sums
    wait_for(lambda: lab.output_of(try_it).count("[60.0, 64.0, 68.0, 72.0, 76.0, 80.0]") == 4, 180, 0.5,
             "the try-it cell printed the ring's sums on 4 ranks")
    lab.run_cell(check)
    wait_for(lambda: "ring all-reduce on 4 ranks: PASSED" in lab.output_of(check), 180, 0.5, "the exercise passed")
    lab.wait_idle(120)
    verdict = lab.cell_with_output(r"ring all-reduce on 4 ranks: PASSED")
    lab.screenshot("01-exercise-verdict", verdict)
    lab.screenshot("01-collective-figure", lab.plotly_figures().first)
    lab.screenshot("01-alpha-beta-figure", lab.plotly_figures().last)
    lab.screenshot("01-after-run-all")


def test_lesson_00_memory_widget_redraws_when_its_controls_change(lessons):
    lab = lessons(LESSON_00)
    assert not lab.errors(), lab.errors()
    widget = lab.panel.locator(".jp-CodeCell", has=lab.page.locator(".widget-dropdown")).first
    wait_for(lambda: lab.plotly_figures(widget).count() == 1, 60, 0.5, "the widget's chart drawn")
    assert lab.plotly_figures().count() >= lab.saved_figures + 1  # the models chart and the widget's
    chart = lab.plotly_figures(widget).first
    summary = widget.locator(".widget-html-content").first
    title = lambda: " ".join(chart.locator(".gtitle").all_text_contents())  # noqa: E731
    assert "GPT-3 175B" in summary.inner_text() and "GPT-3 175B" in title()
    lab.screenshot("00-widget-start", widget)

    # a dropdown: another model
    drawing = _svg(chart)
    widget.locator(".widget-dropdown", has_text="model").locator("select").select_option("GPT-3 13B")
    wait_for(lambda: "GPT-3 13B" in summary.inner_text() and "GPT-3 13B" in title(), 30, 0.2,
             "summary and chart show the chosen model")
    assert _svg(chart) != drawing
    lab.screenshot("00-widget-model-13B", widget)

    # a slider (by keyboard, as noUiSlider's handle takes it): longer sequences, more activations
    drawing, text = _svg(chart), summary.inner_text()
    handle = widget.locator(".widget-slider", has_text="sequence length").locator(".noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    wait_for(lambda: "4096 tokens" in summary.inner_text(), 30, 0.2, "summary shows sequence length 4096")
    wait_for(lambda: _svg(chart) != drawing, 30, 0.2, "chart redrawn for sequence length 4096")
    gb = lambda s: float(re.search(r"([\d,.]+) GB =", s).group(1).replace(",", ""))  # noqa: E731
    assert gb(summary.inner_text()) > gb(text)
    lab.screenshot("00-widget-seq-4096", widget)


# --- lessons in preparation: skipped until their lesson and widget exist ---------------------------

def _open(request, prefix: str, hook: str):
    """The lesson for a feature, opened and run; skipped ("lesson not built yet") until the lesson
    notebook exists and a parallel_lab widget carries the feature's hook class (failed under CI)."""
    path = feature_lesson(prefix, HOOKS[hook])
    return request.getfixturevalue("lessons")(str(path.relative_to(ROOT)))


def test_pipeline_slider_redraws_the_schedule(request):
    lab = _open(request, "03", "pipeline_controls")
    # has= takes a locator relative to the cell: a page-level one, not one scoped to the panel
    cell = lab.panel.locator(".jp-CodeCell", has=lab.page.locator(f".{HOOKS['pipeline_controls']}")).first
    controls = cell.locator(f".{HOOKS['pipeline_controls']}").first
    chart = lab.plotly_figures(cell).first
    drawing = _svg(chart)
    lab.screenshot("03-pipeline-before", cell)
    handle = controls.locator(".noUi-handle").first  # e.g. micro-batches
    handle.focus()
    handle.press("ArrowRight")
    wait_for(lambda: _svg(chart) != drawing, 90, 0.2, "the schedule chart redrawn")
    lab.screenshot("03-pipeline-after", cell)


def test_quiz_answer_shows_feedback(request):
    lab = _open(request, "00", "quiz")
    # the first multiple-choice question: pick its first option, press Check, read the feedback
    quiz = lab.panel.locator(f".{HOOKS['quiz']}", has=lab.page.locator("input[type=radio]")).first
    quiz.scroll_into_view_if_needed()
    feedback = quiz.locator(f".{HOOKS['quiz_feedback']}").first
    assert not feedback.inner_text().strip()
    quiz.locator("input[type=radio]").first.check()
    quiz.locator("button", has_text=re.compile(r"^\s*(check|檢查)\s*$", re.I)).first.click()
    wait_for(lambda: feedback.inner_text().strip(), 60, 0.2, "quiz feedback shown")
    lab.screenshot("00-quiz-feedback", quiz)


def test_run_on_real_ranks_adds_the_measured_timeline(request):
    lab = _open(request, "03", "run_real")
    selector = f"button.{HOOKS['run_real']}, .{HOOKS['run_real']} button"
    cell = lab.panel.locator(".jp-CodeCell", has=lab.page.locator(selector)).first
    button = cell.locator(selector).first
    legend = lambda: " ".join(cell.locator(".legendtext").all_text_contents())  # noqa: E731
    assert "measured" not in legend()
    button.click()
    wait_for(lambda: "measured" in legend(), 300, 0.5, "the measured timeline drawn over the prediction")
    lab.screenshot("03-run-on-real-ranks", cell)
