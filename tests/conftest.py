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


# Under pytest-xdist (``make test``: two workers, one file at a time each, ``--dist loadfile
# --no-loadscope-reorder``) a worker that is free takes the next file in collection order. The
# files that start Ray clusters take most of the suite; the longest go first, so that the run
# does not end with one worker alone on a long file while the other idles. Seconds per file as
# measured under two workers (2026-11-27); a file not listed keeps its place after these, a
# ``cluster``-marked one first. Only the order changes, and only on xdist's workers.
HEAVY_FIRST_S = {
    "tests/faults/test_group_faults.py": 189,
    "tests/tasks/test_user_task_cluster.py": 125,
    "tests/bench/test_smoke.py": 121,
    "tests/faults/test_ram_tier.py": 118,
    "tests/e2e/test_train_your_own_model.py": 94,
    "tests/faults/test_elastic_and_node_loss.py": 91,
    "tests/production/test_try_locally.py": 88,
    "tests/workers/test_executables.py": 79,
    "tests/e2e/test_user_journey.py": 64,
    "tests/models/test_llama.py": 58,
    "tests/integration/test_training.py": 58,
    "tests/autoresume/test_e2e.py": 55,
    "tests/workers/test_host_cluster.py": 44,
    "tests/integration/test_driver_sigkill.py": 44,
    "tests/integration/test_driver_sigterm.py": 31,
    "tests/events/test_pubsub.py": 30,
}


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker: the order stays as collected
        return

    def path(item) -> str:
        return item.nodeid.split("::", 1)[0]

    # A file's weight, not a test's: a file of unit and ``cluster`` tests stays in its own order
    # (its unit tests must not run after its module-scoped cluster came up).
    clustered = {path(i) for i in items if i.get_closest_marker("cluster")}
    items.sort(key=lambda i: HEAVY_FIRST_S.get(path(i), 1 if path(i) in clustered else 0),
               reverse=True)  # stable: a file's tests keep their order
