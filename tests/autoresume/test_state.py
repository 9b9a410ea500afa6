"""The service's durable state: pruning keeps the newest incident ids, across restarts."""

from __future__ import annotations

from orchestrator.autoresume import state as state_mod
from orchestrator.autoresume.state import StateStore


def test_pruning_keeps_newest_not_alphabetical(tmp_path, monkeypatch):
    """Ids added one by one, newest sorting first by name: the oldest fall off, not the 'z's."""
    monkeypatch.setattr(state_mod, "MAX_REMEMBERED_INCIDENTS", 3)
    store = StateStore(str(tmp_path))
    added = ["z-1", "y-2", "x-3", "b-4", "a-5"]  # added in this order: a-5 is the newest
    for inc in added:
        hist = store.history("run-a")
        store.update("run-a", handled_incidents=hist.handled_incidents | {inc})
    assert store.history("run-a").handled_incidents == {"x-3", "b-4", "a-5"}
    reloaded = StateStore(str(tmp_path))
    hist = reloaded.history("run-a")
    assert hist.handled_incidents == {"x-3", "b-4", "a-5"}
    reloaded.update("run-a", handled_incidents=hist.handled_incidents | {"0-6"})
    assert reloaded.history("run-a").handled_incidents == {"b-4", "a-5", "0-6"}


def test_stopped_ids_survive_a_restart(tmp_path):
    """What autoresume stopped itself is remembered (a stopped job is otherwise left alone)."""
    StateStore(str(tmp_path)).update("run-a", stopped=("run-a-r1",))
    assert StateStore(str(tmp_path)).history("run-a").stopped == ("run-a-r1",)
