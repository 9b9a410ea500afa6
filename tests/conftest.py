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
