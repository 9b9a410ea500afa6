"""The GCE metadata watcher against a local server that behaves like the metadata server."""

from __future__ import annotations

import threading
import time

from tests.events.fake_metadata import fake_metadata_server
from workers.host.metadata_watcher import (
    MAINTENANCE_KEY,
    PREEMPTED_KEY,
    MetadataWatcher,
    on_gce,
    should_watch,
)


class Collector:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.cond = threading.Condition()

    def __call__(self, event: dict) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def wait_for(self, n: int, timeout: float = 10.0) -> list[dict]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.events) >= n, timeout=timeout)
            return list(self.events)


def _watcher(endpoint: str, collector: Collector, **kw) -> MetadataWatcher:
    opts = {"timeout_s": 5.0, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}
    opts.update(kw)
    return MetadataWatcher(callback=collector, host="vm-1", slice_name="slice-a", job="demo",
                           endpoint=endpoint, clock=lambda: 1000.0, **opts)


def test_preemption_becomes_a_notice_with_deadline():
    """preempted FALSE -> TRUE yields one preemption_notice for this host, deadline now + 30 s."""
    with fake_metadata_server() as (endpoint, server):
        got = Collector()
        watcher = _watcher(endpoint, got)
        watcher.start()
        try:
            _wait(lambda: sum(1 for r in server.requests
                              if r["query"].get("wait_for_change") == "true") >= 2)
            server.set(PREEMPTED_KEY, "TRUE")
            events = got.wait_for(1)
        finally:
            watcher.stop()
        assert len(events) == 1
        event = events[0]
        assert event["kind"] == "preemption_notice"
        assert event["target"] == {"job": "demo", "slice": "slice-a", "host": "vm-1"}
        assert event["deadline"] == 1030.0
        assert all(r["flavor"] == "Google" for r in server.requests)
        assert any(r["query"].get("last_etag") for r in server.requests)


def test_maintenance_event_and_back_to_none():
    """TERMINATE_ON_HOST_MAINTENANCE is a notice; going back to NONE is not an event."""
    with fake_metadata_server() as (endpoint, server):
        got = Collector()
        watcher = _watcher(endpoint, got, maintenance_notice_s=60.0)
        watcher.start()
        try:
            _wait(lambda: len(server.requests) >= 2)
            server.set(MAINTENANCE_KEY, "TERMINATE_ON_HOST_MAINTENANCE")
            got.wait_for(1)
            server.set(MAINTENANCE_KEY, "NONE")
            time.sleep(0.3)
        finally:
            watcher.stop()
        assert [e["kind"] for e in got.events] == ["maintenance_scheduled"]
        assert got.events[0]["deadline"] == 1060.0


def test_already_preempted_at_start_is_reported():
    """A notice that is already set when the watcher starts is not missed."""
    with fake_metadata_server() as (endpoint, server):
        server.set(PREEMPTED_KEY, "TRUE")
        got = Collector()
        watcher = _watcher(endpoint, got)
        watcher.start()
        try:
            assert [e["kind"] for e in got.wait_for(1)] == ["preemption_notice"]
        finally:
            watcher.stop()


def test_503s_are_retried_with_backoff():
    """Errors are counted and retried; the notice still arrives afterwards."""
    with fake_metadata_server() as (endpoint, server):
        server.fail_next = 4
        got = Collector()
        watcher = _watcher(endpoint, got)
        watcher.start()
        try:
            _wait(lambda: watcher.errors >= 4)
            server.set(PREEMPTED_KEY, "TRUE")
            assert len(got.wait_for(1)) == 1
        finally:
            watcher.stop()
        assert watcher.errors >= 4


def test_server_without_flavor_header_is_not_trusted():
    """Answers lacking Metadata-Flavor: Google are errors, never events."""
    with fake_metadata_server() as (endpoint, server):
        server.send_flavor = False
        server.set(PREEMPTED_KEY, "TRUE")
        got = Collector()
        watcher = _watcher(endpoint, got)
        watcher.start()
        try:
            _wait(lambda: watcher.errors >= 2)
        finally:
            watcher.stop()
        assert got.events == []


def test_unreachable_server_is_logged_not_raised():
    """A closed port: errors with backoff, threads alive, stop() is prompt."""
    got = Collector()
    watcher = _watcher("http://127.0.0.1:9/computeMetadata/v1", got)
    watcher.start()
    try:
        _wait(lambda: watcher.errors >= 3)
        assert watcher.running
    finally:
        started = time.monotonic()
        watcher.stop()
    assert not watcher.running
    assert time.monotonic() - started < 5
    assert got.events == []


def test_stop_interrupts_a_hanging_long_poll():
    """stop() during a long wait_for_change returns without waiting for the server's timeout."""
    with fake_metadata_server() as (endpoint, server):
        watcher = _watcher(endpoint, Collector(), timeout_s=60.0)
        watcher.start()
        _wait(lambda: sum(1 for r in server.requests
                          if r["query"].get("wait_for_change") == "true") >= 2)
        watcher.stop(timeout_s=5)
        assert not watcher.running


def test_enabled_modes():
    """on/off force; auto follows GCE detection from DMI (no network)."""
    assert should_watch("on", detect=lambda: False)
    assert not should_watch("off", detect=lambda: True)
    assert should_watch("auto", detect=lambda: True)
    assert not should_watch("auto", detect=lambda: False)
    assert on_gce(dmi_files=("/nonexistent",)) is False


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_start_watcher_as_the_host_actor_calls_it():
    """settings = the events.metadata section; off -> None, on -> events name the instance."""
    from dataclasses import asdict

    from orchestrator.events.config import MetadataConfig
    from tests.events.helpers import hosts
    from workers.host.metadata_watcher import start_watcher

    host = hosts(2)[1]
    assert start_watcher(asdict(MetadataConfig(enabled="off")), host=host, sink=print) is None
    with fake_metadata_server() as (endpoint, server):
        server.set(PREEMPTED_KEY, "TRUE")
        got = Collector()
        settings = asdict(MetadataConfig(enabled="on", endpoint=endpoint, timeout_s=5,
                                         backoff_initial_s=0.05))
        watcher = start_watcher(settings, host=host, sink=got, job="demo")
        try:
            events = got.wait_for(1)
        finally:
            watcher.stop()
    assert events[0]["target"] == {"job": "demo", "slice": "slice-a", "host": "vm-1",
                                   "host_kind": "instance"}


def test_live_migration_is_noted_without_a_deadline():
    """MIGRATE_ON_HOST_MAINTENANCE keeps the VM running: live_migration, no invented deadline;
    TERMINATE_ON_HOST_MAINTENANCE stays a maintenance notice with its 60 s."""
    from orchestrator.events.model import Event, EventKind

    got = Collector()
    watcher = _watcher("http://127.0.0.1:9", got, host_kind="instance")
    migrate = watcher.event_for(MAINTENANCE_KEY, "MIGRATE_ON_HOST_MAINTENANCE", "e1")
    terminate = watcher.event_for(MAINTENANCE_KEY, "TERMINATE_ON_HOST_MAINTENANCE", "e2")
    assert (migrate["kind"], migrate["deadline"]) == ("live_migration", None)
    assert (terminate["kind"], terminate["deadline"]) == ("maintenance_scheduled", 1060.0)
    parsed = Event.from_json(migrate)
    assert parsed.kind is EventKind.LIVE_MIGRATION
    assert parsed.target.host_kind == "instance"


def test_host_named_by_index_says_so():
    """A host without an instance name is named by index, marked as such (never taken for an
    instance called "1")."""
    from dataclasses import asdict, replace

    from orchestrator.events.config import MetadataConfig
    from tests.events.helpers import hosts
    from workers.host.metadata_watcher import start_watcher

    host = replace(hosts(2)[1], instance="")
    with fake_metadata_server() as (endpoint, server):
        server.set(PREEMPTED_KEY, "TRUE")
        got = Collector()
        settings = asdict(MetadataConfig(enabled="on", endpoint=endpoint, timeout_s=5,
                                         backoff_initial_s=0.05))
        watcher = start_watcher(settings, host=host, sink=got)
        try:
            events = got.wait_for(1)
        finally:
            watcher.stop()
    assert (events[0]["target"]["host"], events[0]["target"]["host_kind"]) == ("1", "index")


def test_instance_identity_reads_id_and_name():
    """The id -> name pair a host reports at start, from its own metadata server."""
    from dataclasses import asdict

    from orchestrator.events.config import MetadataConfig
    from workers.host.metadata_watcher import ID_KEY, NAME_KEY, instance_identity

    with fake_metadata_server() as (endpoint, server):
        server.values.update({ID_KEY: "2093000891450668968", NAME_KEY: "vm-1"})
        server.etags.update({ID_KEY: 1, NAME_KEY: 1})
        settings = asdict(MetadataConfig(enabled="on", endpoint=endpoint, timeout_s=5))
        assert instance_identity(settings) == ("2093000891450668968", "vm-1")
    assert instance_identity(asdict(MetadataConfig(enabled="off"))) is None
