"""The dedupe window: bounded, persisted, rebuilt after a crash."""

from __future__ import annotations

import json

from orchestrator.events.dedupe import DedupeWindow


def test_window_is_bounded_and_keeps_newest(tmp_path):
    """Past capacity the oldest ids are forgotten."""
    window = DedupeWindow(3)
    for i in range(5):
        assert window.add(f"id{i}")
    assert not window.add("id4")
    assert "id0" not in window and "id1" not in window and "id4" in window
    assert len(window) == 3


def test_window_survives_restart(tmp_path):
    """Saved ids, plus ids from the event log tail, are known after reload."""
    path = tmp_path / "event_dedupe.json"
    first = DedupeWindow(10, path)
    first.add("a")
    first.save()
    second = DedupeWindow(10, path)
    second.load(recent_log_ids=["b"])
    assert "a" in second and "b" in second


def test_corrupt_file_is_ignored(tmp_path):
    """A broken file is logged and the window starts empty instead of crashing the driver."""
    path = tmp_path / "event_dedupe.json"
    path.write_text("{broken")
    window = DedupeWindow(10, path)
    window.load()
    assert len(window) == 0
    window.add("x")
    window.save()
    assert json.loads(path.read_text())["ids"] == ["x"]
