"""Rules every test keeps, held while it runs.

A test that starts real ranks (the launcher's pool, in this process) carries the ``ranks`` marker,
so that ``-m "not ranks"`` runs the tests without processes and the rank tests can be found: a test
without it fails as soon as it (or a fixture it sets up) asks the pool for ranks. Ranks that a
subprocess starts (``parallel-lab run ...``) are not seen here; those tests carry the marker too.
"""

import pytest

from parallel_lab.runtime import pool

pytest_plugins = ["pytester"]

_current = {"item": None}  # the test being set up or run


def _unmarked_test_starts_ranks():
    item = _current["item"]
    if item is not None and item.get_closest_marker("ranks") is None:
        pytest.fail(f"{item.nodeid} starts ranks (the launcher's pool) but is not marked ranks: add "
                    f"@pytest.mark.ranks (or pytestmark = pytest.mark.ranks for a module whose fixtures "
                    f"start them)", pytrace=False)


def _guarded(method):
    def guarded(self, *args, **kwargs):
        _unmarked_test_starts_ranks()
        return method(self, *args, **kwargs)

    guarded.__wrapped__ = method
    return guarded


pool.Pool.__init__ = _guarded(pool.Pool.__init__)  # a new pool of ranks
pool.Pool.run = _guarded(pool.Pool.run)  # a task for the ranks of a pool that is already up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _current["item"] = item
    yield
    _current["item"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current["item"] = item
    yield
    _current["item"] = None
