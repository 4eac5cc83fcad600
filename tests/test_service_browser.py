"""The course service in a real browser (Debian's Chromium, driven by Playwright), as its people use it:
the first instructor's account made with ``serve --create-instructor``, the instructor creates a
course in the browser; a learner registers, enrols, uploads a lesson-01 notebook with a correct
ring, watches the verdict arrive, meets the course's threshold, gets and downloads the credential and
opens its public verification page; then the same in Traditional Chinese (a browser asking for
zh-TW, and the language switch). The downloaded credential verifies offline with the issuer's
public key (``parallel-lab certificate verify``). Screenshots: artifacts/screenshots/service-*.png.

Skipped without Chromium or Playwright, except under CI, where it fails."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_support import SCREENSHOTS, Browser, chromium_path, in_ci  # noqa: E402
from service_support import ServiceProcess, exe, lesson01, require_bwrap  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.ranks, pytest.mark.timeout(900)]

PASSWORD = "instructor-password-1"


@pytest.fixture(scope="module")
def browser():
    why = None if chromium_path() else "Debian's chromium is not on PATH (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        why = "Playwright's Python package is not installed (pip install -e '.[test]')"
    if why:
        (pytest.fail if in_ci() else pytest.skip)(f"the service's browser test needs a browser: {why}")
    with Browser() as b:
        yield b
    assert b.leftovers == []


def shot(page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"service-{name}.png"), full_page=True)


def new_page(browser, locale):
    context = browser.browser.new_context(locale=locale, accept_downloads=True, viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    return page


def learner_walk(browser, server, notebook: Path, locale: str, name: str, email: str, words: dict, tmp: Path):
    """Register, enrol, upload, wait for the verdict, get the credential, download it, open its page."""
    page = new_page(browser, locale)
    page.goto(server.url + "/")
    page.click("#nav-register")
    page.fill("#name", name)
    page.fill("#email", email)
    page.fill("#password", "learner-password-1")
    page.click("#register")
    page.click("a[href='/courses/mp']")
    page.click("#enrol")
    page.wait_for_selector("#upload")
    assert words["upload"] in page.inner_text("main")
    page.set_input_files("#notebook", str(notebook))
    page.click("#upload")
    page.wait_for_url("**/submissions/*")
    shot(page, f"{locale}-waiting")
    page.wait_for_selector("#state[data-state='graded']", timeout=300_000)  # the page refreshes itself
    verdicts = page.inner_text("#verdicts")
    assert "ring-all-reduce" in verdicts and words["passed"] in verdicts
    assert page.inner_text("#score").strip() == "2 / 5"
    shot(page, f"{locale}-verdict")
    page.click("a[href='/courses/mp']")
    page.click("#get-credential")
    page.wait_for_url("**/credentials/*")
    assert page.get_attribute("#verdict", "data-valid") == "true"
    assert words["valid"] in page.inner_text("#verdict") and page.inner_text("#holder") == name
    fingerprint = page.inner_text("#fingerprint")
    assert fingerprint.startswith("SHA256:")
    shot(page, f"{locale}-credential")
    verify_url = page.url
    page.goto(server.url + "/courses/mp")
    page.wait_for_selector("#download")
    with page.expect_download() as download:
        page.click("#download")
    saved = tmp / f"credential-{locale}.json"
    download.value.save_as(saved)
    # the verification page is public: a fresh browser with no session opens it
    anonymous = new_page(browser, locale)
    anonymous.goto(verify_url)
    assert anonymous.get_attribute("#verdict", "data-valid") == "true"
    assert anonymous.inner_text("#fingerprint") == fingerprint
    info = json.loads(anonymous.goto(verify_url + ".json").text())
    assert info["valid"] and info["holder"]["name"] == name
    anonymous.context.close()
    page.context.close()
    return saved


def test_instructor_and_learners_in_both_languages(browser, tmp_path):
    require_bwrap()
    data = tmp_path / "data"
    made = subprocess.run([exe(), "serve", "--data", str(data), "--create-instructor", "lin@example.org",
                           "--name", "Prof. Lin"], env={**os.environ, "PARALLEL_LAB_PASSWORD": PASSWORD},
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    notebook = tmp_path / "01_ranks_and_collectives.ipynb"
    notebook.write_bytes(lesson01("solutions"))
    with ServiceProcess(data, ["--jobs", "1"], name="browser-serve") as server:
        teacher = new_page(browser, "en-US")
        teacher.goto(server.url + "/login")
        teacher.fill("#email", "lin@example.org")
        teacher.fill("#password", PASSWORD)
        teacher.click("#sign-in")
        teacher.goto(server.url + "/courses/new")
        teacher.fill("#title", "Model parallelism")
        teacher.fill("#slug", "mp")
        teacher.check("#lesson-01")
        teacher.fill("#threshold", "40")
        teacher.click("#create-course")
        teacher.wait_for_url("**/courses/mp")
        assert "Gradebook" in teacher.inner_text("main")
        english = {"upload": "Upload for grading", "passed": "passed", "valid": "Valid"}
        saved_en = learner_walk(browser, server, notebook, "en-US", "Ada Lovelace", "ada@example.org", english,
                                tmp_path)
        chinese = {"upload": "上傳評分", "passed": "通過", "valid": "有效"}
        saved_zh = learner_walk(browser, server, notebook, "zh-TW", "林怡君", "lin.yi@example.org", chinese, tmp_path)
        # the gradebook shows both; the language switch turns the instructor's page into Chinese
        teacher.goto(server.url + "/courses/mp")
        book = teacher.inner_text("#gradebook")
        assert "Ada Lovelace" in book and "林怡君" in book and book.count("2 / 5") == 2
        teacher.click("a[hreflang='zh-Hant']")
        teacher.wait_for_selector("text=成績簿")
        assert "覆寫成績" in teacher.inner_text("main")
        shot(teacher, "zh-Hant-gradebook")
        pub = tmp_path / "issuer.pub"
        pub.write_bytes(teacher.request.get(server.url + "/issuer.pub").body())
        teacher.context.close()
    for saved in (saved_en, saved_zh):
        out = subprocess.run([exe(), "certificate", "verify", str(saved), "--public-key", str(pub), "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and json.loads(out.stdout)["valid"], out.stdout + out.stderr
