"""The ``ranks`` marker is held (tests/conftest.py): a test that starts ranks without it fails."""

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

INNER = '''
import pytest

from parallel_lab.runtime import demos, launcher


@pytest.fixture(scope="module")
def started():
    return launcher.run(demos.rank_id, 1)


def test_unmarked_that_starts_ranks():
    launcher.run(demos.rank_id, 1)


def test_unmarked_whose_fixture_starts_ranks(started):
    pass


def test_unmarked_without_ranks():
    assert launcher.pool_pids() == []


@pytest.mark.ranks
def test_marked_that_starts_ranks():
    assert launcher.run(demos.rank_id, 1) == [0]
    launcher.shutdown()
'''


@pytest.mark.ranks
def test_a_test_that_starts_ranks_without_the_marker_fails(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:nbval", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=300)
    result.assert_outcomes(passed=2, failed=1, errors=1)
    for name in ("test_unmarked_that_starts_ranks", "test_unmarked_whose_fixture_starts_ranks"):
        result.stdout.fnmatch_lines([f"*{name} starts ranks (the launcher's pool) but is not marked ranks*"])
