"""Test-wide guards: nothing may reach Google, and no test may probe the GCE metadata server.

Every run the suite starts shares one executable store (``TPU_ORCH_EXECUTABLES_DIR``), as a
team would share one: a run of a model and mesh an earlier test compiled loads its step. Tests
of the store itself pass their own directories. Its signing key (``TPU_ORCH_EXECUTABLES_KEY``) is
a temporary file too, so no test writes the real ``~/.config``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

import orchestrator  # noqa: F401  first: it turns gRPC's fork handlers off before any import of grpc
from tests.support.task_check import check_here  # noqa: F401  (a fixture for every test)
from tests.support.units import read_durations, unit_of

os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")  # a closed port, never Google's
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if "TPU_ORCH_EXECUTABLES_DIR" not in os.environ:
    _store = tempfile.mkdtemp(prefix="tpuo-executables-")
    os.environ["TPU_ORCH_EXECUTABLES_DIR"] = _store
    atexit.register(shutil.rmtree, _store, True)
if "TPU_ORCH_EXECUTABLES_KEY" not in os.environ:  # the store's signing key: never the home dir
    _keys = tempfile.mkdtemp(prefix="tpuo-exec-key-")
    os.environ["TPU_ORCH_EXECUTABLES_KEY"] = os.path.join(_keys, "executables.key")
    atexit.register(shutil.rmtree, _keys, True)


@pytest.fixture(autouse=True)
def _no_google_auth(monkeypatch):
    """Fail loudly if any code path asks for application-default credentials."""
    import google.auth

    def _refuse(*args, **kwargs):
        raise AssertionError(
            "google.auth.default() must not run in tests: pass a channel/transport")

    monkeypatch.setattr(google.auth, "default", _refuse)
    yield


# Under pytest-xdist (``make test``: two workers, one unit at a time each, ``--dist loadfile
# --no-loadscope-reorder``) a worker that is free takes the next unit in collection order
# (``tests/support/units.py``: a file, or files sharing a costly package fixture). The longest
# units go first, by the seconds the last full run measured (``tests/durations.json``), so the
# run does not end with one worker alone on a long unit while the other idles. A unit not
# measured yet counts as ``UNMEASURED_CLUSTER_S`` when it is ``cluster``-marked (a cluster's start
# alone is ~15 s), else it keeps its place after them. Only the order
# changes, and only on xdist's workers.
DURATIONS_S = read_durations()
UNMEASURED_CLUSTER_S = 30.0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with ``unit_of``'s units; any other mode is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker: the order stays as collected
        return

    # A unit's weight, not a test's: a file of unit and ``cluster`` tests stays in its own order
    # (its unit tests must not run after its module-scoped cluster came up).
    clustered = {unit_of(i.nodeid) for i in items if i.get_closest_marker("cluster")}

    def weight(item) -> float:
        unit = unit_of(item.nodeid)
        return DURATIONS_S.get(unit, UNMEASURED_CLUSTER_S if unit in clustered else 0.0)

    items.sort(key=weight, reverse=True)  # stable: a unit's tests keep their order
