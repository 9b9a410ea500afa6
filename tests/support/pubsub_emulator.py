"""Pytest support for Google's Pub/Sub emulator: a free loopback port, always torn down.

Usage::

    from tests.support.pubsub_emulator import emulator_fixture, pubsub_emulator

    with pubsub_emulator() as host_port:          # "127.0.0.1:PORT"
        ...

    pubsub_emulator_host = emulator_fixture(scope="module")   # a fixture in your test module

The fixture sets PUBSUB_EMULATOR_HOST while it lives (the real clients then use an insecure
channel and anonymous credentials) and skips the test when gcloud is missing. Use a fresh topic
and subscription per test (see FACTS.md: reusing a subscription after cancel delays messages).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from orchestrator.events.emulator import (
    EmulatorProcess,
    emulator_process,
    gcloud_available,
    pubsub_emulator,
)

__all__ = ["EmulatorProcess", "emulator_fixture", "emulator_process",
           "gcloud_available", "pubsub_emulator", "unique_name"]


def unique_name(prefix: str) -> str:
    """A fresh topic/subscription id."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def emulator_fixture(scope: str = "module"):
    """A pytest fixture factory: ``name = emulator_fixture("session")`` yields host:port.

    Sets PUBSUB_EMULATOR_HOST for the fixture's lifetime (so the real clients use the emulator
    with anonymous credentials) and skips the test when gcloud is missing.
    """

    @pytest.fixture(scope=scope)
    def _fixture() -> Iterator[str]:
        if not gcloud_available():
            pytest.skip("gcloud (Pub/Sub emulator) is not installed")
        old = os.environ.get("PUBSUB_EMULATOR_HOST")
        with pubsub_emulator() as host_port:
            os.environ["PUBSUB_EMULATOR_HOST"] = host_port
            try:
                yield host_port
            finally:
                if old is None:
                    os.environ.pop("PUBSUB_EMULATOR_HOST", None)
                else:
                    os.environ["PUBSUB_EMULATOR_HOST"] = old

    return _fixture
