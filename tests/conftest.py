"""Test-wide guards: nothing may reach Google, and no test may probe the GCE metadata server."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")  # a closed port, never Google's
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _no_google_auth(monkeypatch):
    """Fail loudly if any code path asks for application-default credentials."""
    import google.auth

    def _refuse(*args, **kwargs):
        raise AssertionError(
            "google.auth.default() must not run in tests: pass a channel/transport")

    monkeypatch.setattr(google.auth, "default", _refuse)
    yield
