"""Test-wide guards: nothing may reach Google, and no test may probe the GCE metadata server.

Every run the suite starts shares one executable store (``TPU_ORCH_EXECUTABLES_DIR``), as a
team would share one: a run of a model and mesh an earlier test compiled loads its step. Tests
of the store itself pass their own directories.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")  # a closed port, never Google's
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if "TPU_ORCH_EXECUTABLES_DIR" not in os.environ:
    _store = tempfile.mkdtemp(prefix="tpuo-executables-")
    os.environ["TPU_ORCH_EXECUTABLES_DIR"] = _store
    atexit.register(shutil.rmtree, _store, True)


@pytest.fixture(autouse=True)
def _no_google_auth(monkeypatch):
    """Fail loudly if any code path asks for application-default credentials."""
    import google.auth

    def _refuse(*args, **kwargs):
        raise AssertionError(
            "google.auth.default() must not run in tests: pass a channel/transport")

    monkeypatch.setattr(google.auth, "default", _refuse)
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) every test marked ``cluster``
    runs in one group, on one worker, one after another: never two Ray clusters at once on a
    2-core machine. The other worker runs the rest (pure logic, the emulator, JAX subprocesses)
    alongside. A module with the emulator keeps its tests together, so it starts one emulator.
    Without xdist the marks change nothing."""
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif item.get_closest_marker("emulator"):
            item.add_marker(pytest.mark.xdist_group(f"emulator-{item.module.__name__}"))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Refuse to run two Ray clusters at once silently: if xdist's grouping did not take (it
    tags each grouped node id with ``@group``), stop with the fix instead of going on."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items
                if i.get_closest_marker("cluster") and not i.nodeid.endswith("@ray")]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist did not group {len(lost)} Ray-cluster tests (e.g. {lost[0]}); "
                "with pytest 9.2 --dist loadgroup ignores xdist_group (pytest-xdist issue "
                "1386). Install the pinned test extra (pip install -e '.[test]') or run with "
                "-n 0.")
