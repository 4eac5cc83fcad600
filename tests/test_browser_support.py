"""The browser tests' own rules, held without a browser: a lesson or CSS hook they look for that is
missing skips them here and fails them under CI, so a renamed hook cannot turn a test off unseen."""

import pytest
from browser_support import HOOKS, feature_lesson


def test_every_hook_the_browser_tests_use_leads_to_its_lesson(monkeypatch):
    monkeypatch.setenv("CI", "true")
    for prefix, hook in (("03", "pipeline_controls"), ("00", "quiz"), ("00", "quiz_feedback"), ("03", "run_real")):
        assert feature_lesson(prefix, HOOKS[hook]).name.startswith(prefix)


@pytest.mark.parametrize("prefix, hook", [("03", "pl-renamed-hook"), ("98", HOOKS["quiz"])])
def test_a_missing_hook_or_lesson_fails_under_ci_and_skips_elsewhere(monkeypatch, prefix, hook):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="lesson not built yet"):
        feature_lesson(prefix, hook)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="lesson not built yet"):
        feature_lesson(prefix, hook)
