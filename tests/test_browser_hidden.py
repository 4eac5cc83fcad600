"""Predictions come before answers, in a real browser: lesson 04 opened in JupyterLab as a student
finds it shows no answer to its graded prediction; the hidden output opens on a click (a reader
without a kernel), and running the cell brings the real output back.

Needs Debian's ``chromium`` and Playwright (as tests/test_browser.py); skipped without them, failed
under CI. Screenshots in artifacts/screenshots/hidden-*.png."""

import importlib.util
import re

import pytest
from browser_support import ROOT, Browser, JupyterServer, chromium_path, unavailable, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.ranks, pytest.mark.timeout(600)]

LESSON = "lessons/04_gpipe_microbatching.ipynb"


def test_the_answer_waits_behind_a_reveal_until_the_cell_runs():
    if chromium_path() is None or importlib.util.find_spec("playwright") is None:
        unavailable("browser tests need Debian's chromium and Playwright")
    before = (ROOT / LESSON).read_bytes()
    with JupyterServer(ROOT) as server, Browser() as browser:
        lab = browser.open_notebook(server, LESSON)
        page = lab.panel
        hidden = page.locator(".jp-OutputArea-output details", has_text="it answers prediction gpipe-bubble").first
        hidden.scroll_into_view_if_needed()
        summary = hidden.locator("summary")
        assert "Write your prediction first" in summary.inner_text()
        stored = hidden.locator("pre", has_text="simulated 0.429").first
        assert stored.count() == 1 and not stored.is_visible(), "the stored answer shows before a click"
        visible = "\n".join(t for t in page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "simulated 0.429" not in visible and "bubble 0.429" not in visible
        lab.screenshot("hidden-04-closed", hidden)
        summary.click()
        wait_for(stored.is_visible, 10, what="the stored output opens on a click")
        lab.screenshot("hidden-04-opened", hidden)
        # run the lesson as a student would: the real output replaces the reveal
        lab.run_all()
        cell = page.locator(".jp-CodeCell", has=lab.page.locator(".jp-OutputArea-output",
                                                                 has_text="prediction gpipe-bubble: simulated")).first
        out = cell.locator(".jp-OutputArea-output").all_inner_texts()
        assert any(re.search(r"prediction gpipe-bubble: simulated 0\.429", t) for t in out), out
        assert not page.locator("details", has_text="answers prediction gpipe-bubble").count()
        lab.screenshot("hidden-04-run", cell)
    assert (ROOT / LESSON).read_bytes() == before, "the lesson changed on disk"
