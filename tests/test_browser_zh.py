"""The whole path in Traditional Chinese, as a student takes it: ``python3 course.py start --lang
zh-Hant`` serves JupyterLab with its own menus in Chinese (its language pack) at the zh-Hant edition,
whose charts are titled in Chinese and drawn with real CJK glyphs, not boxes (tofu).

Needs Debian's ``chromium`` and a CJK font (``fonts-noto-cjk``; ``.ci/run`` installs both) and
Playwright's Python package. Without them the test is skipped, except under CI, where it fails."""

import importlib.util
import re
import shutil
import subprocess

import pytest
from browser_support import Browser, CourseServer, chromium_path, unavailable, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

LESSON = "lessons/zh-Hant/03_pipeline_bubble.ipynb"

# In the page: does the font the browser picks for ``text`` draw glyphs, or the same empty box it
# draws for a code point no font has (U+10FFFD, private use)? Compared pixel for pixel on a canvas.
TOFU = """([text, font]) => {
    const draw = (s) => {
        const canvas = document.createElement("canvas");
        canvas.width = 40 * s.length; canvas.height = 48;
        const ctx = canvas.getContext("2d");
        ctx.font = font; ctx.fillStyle = "black"; ctx.textBaseline = "top";
        ctx.fillText(s, 2, 4);
        return Array.from(ctx.getImageData(0, 0, canvas.width, canvas.height).data);
    };
    const box = "\\u{10FFFD}";
    const glyphs = Array.from(text).map((c) => draw(c).join(","));
    const tofu = draw(box).join(",");
    return {distinct: new Set(glyphs).size, tofu: glyphs.filter((g) => g === tofu).length,
            inked: glyphs.filter((g) => g.split(",").some((v, i) => i % 4 === 3 && v !== "0")).length};
}"""


def _missing() -> str | None:
    if chromium_path() is None:
        return "Debian's chromium is not on PATH (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright's Python package is not installed (pip install -e '.[test]')"
    if shutil.which("fc-list") and "CJK" not in subprocess.run(["fc-list", ":lang=zh-tw"], capture_output=True,
                                                                text=True).stdout:
        return "no CJK font (apt-get install fonts-noto-cjk)"
    return None


def test_course_start_in_chinese_shows_chinese_menus_and_a_chart_titled_in_chinese():
    why = _missing()
    if why:
        unavailable(f"the Chinese browser test needs: {why}")
    with CourseServer("zh-Hant") as server, Browser() as browser:
        settings = server.api("GET", "/lab/api/settings/@jupyterlab/translation-extension:plugin")
        assert settings["schema"]["properties"]["locale"]["default"] == "zh_TW"
        lab = browser.open_notebook(server, LESSON, timeout=180)
        page = lab.page
        # JupyterLab's own interface in Traditional Chinese: the page's language and the Run menu's
        # entries. (The zh-TW pack leaves the menu bar's titles, "&Run" and the like, untranslated.)
        assert page.evaluate("document.documentElement.lang") == "zh-TW"
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^(Run|執行)$")).first.click()
        entries = [t.strip() for t in page.locator(".lm-Menu-itemLabel").all_inner_texts() if t.strip()]
        assert "執行所有儲存格" in entries and "Run All Cells" not in entries, entries
        lab.screenshot("zh-Hant-03-run-menu")
        page.keyboard.press("Escape")
        # the lesson's first saved chart turns into a live plotly chart on hover: its title is Chinese
        images = lab.panel.locator(".jp-RenderedPlotly img.plot-img[src^='data:image/png']")
        wait_for(lambda: images.count() >= 1, 60, 0.5, "saved figures shown")
        lab.screenshot("zh-Hant-03-saved-figure", images.first)
        images.first.dispatch_event("mouseenter")
        chart = lab.plotly_figures().first
        chart.wait_for(timeout=60_000)
        title = chart.locator(".gtitle").first.text_content()
        assert "氣泡" in title, title
        # rendered with a CJK font, not boxes: each of the title's Chinese characters draws its own
        # inked glyph in the font the chart uses, none the box of a missing glyph
        chinese = "".join(dict.fromkeys(c for c in title if "\u4e00" <= c <= "\u9fff"))
        family = chart.locator(".gtitle").first.evaluate("e => getComputedStyle(e).fontFamily")
        result = page.evaluate(TOFU, [chinese, f"24px {family}"])
        assert result == {"distinct": len(chinese), "tofu": 0, "inked": len(chinese)}, (chinese, family, result)
        chart.scroll_into_view_if_needed()
        lab.screenshot("zh-Hant-03-chart", chart)
        lab.screenshot("zh-Hant-03-lab")
        lab.close()
    assert not server.leftovers and not browser.leftovers, server.leftovers + browser.leftovers
