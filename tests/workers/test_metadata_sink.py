"""The host actor pushes metadata notices to the driver's sink at once; a refused notice is
retried, then logged as lost by id. The actor class runs in this process (no Ray, no JAX)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict

from orchestrator.config import load_config
from orchestrator.events.config import MetadataConfig
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh
from tests.events.fake_metadata import fake_metadata_server
from workers.host.actor import HostActor
from workers.host.metadata_watcher import PREEMPTED_KEY


def _actor() -> HostActor:
    cfg = load_config(None, [])
    hosts = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip="127.0.0.1",
                     instance=f"vm-{i}", devices=2) for i in range(2)]
    plan = plan_mesh(cfg, hosts, platform="cpu")
    return HostActor(HostSpec.for_host(cfg, plan, plan.hosts[1], checkpoint_dir="/unused"), {})


def _settings(endpoint: str) -> dict:
    return asdict(MetadataConfig(enabled="on", endpoint=endpoint, timeout_s=5,
                                 backoff_initial_s=0.05))


def _wait_until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_notice_goes_to_the_sink_at_once():
    """A preemption notice is put on the sink as it is seen."""
    actor = _actor()
    sink: queue.Queue = queue.Queue()
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint), sink)
            server.set(PREEMPTED_KEY, "TRUE")
            event = sink.get(timeout=20)
        finally:
            actor.shutdown()
    assert event["kind"] == "preemption_notice"
    assert event["target"]["host"] == "vm-1"


def test_a_sink_full_for_a_moment_still_gets_the_notice():
    """The driver's queue refuses the notice (full), then frees a slot: it is delivered."""
    actor = _actor()
    sink: queue.Queue = queue.Queue(maxsize=1)
    sink.put("occupied")
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint), sink)
            server.set(PREEMPTED_KEY, "TRUE")
            time.sleep(0.3)  # the watcher has seen it and been refused at least once
            assert sink.get(timeout=5) == "occupied"
            event = sink.get(timeout=10)
        finally:
            actor.shutdown()
    assert event["kind"] == "preemption_notice"


def test_a_notice_the_sink_keeps_refusing_is_logged_as_lost(caplog):
    """Never silently: after the bounded retries the notice's id is logged at ERROR."""
    actor = _actor()

    class Gone:
        def __init__(self) -> None:
            self.tries = 0
            self.lock = threading.Lock()

        def put_nowait(self, item) -> None:
            with self.lock:
                self.tries += 1
            raise ConnectionError("the queue actor is dead")

    sink = Gone()
    caplog.set_level(logging.ERROR, logger="workers.host.notices")
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint), sink)
            server.set(PREEMPTED_KEY, "TRUE")
            _wait_until(lambda: any("lost" in r.getMessage() for r in caplog.records))
        finally:
            actor.shutdown()
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert "preemption_notice" in lost[0] and "refused it 6 times" in lost[0]
    assert sink.tries >= 6


def test_a_queue_that_hangs_does_not_stop_the_watcher(monkeypatch):
    """Ray's queue waits for its actor without a timeout: a put that hangs is abandoned after
    the bound and retried; the notice lands once the queue answers again."""
    import workers.host.notices as notices_module

    monkeypatch.setattr(notices_module, "_SINK_CALL_TIMEOUT_S", 0.2)
    actor = _actor()
    never = threading.Event()

    class HangsOnce:
        def __init__(self) -> None:
            self.calls = 0
            self.got: list[dict] = []

        def put_nowait(self, item) -> None:
            self.calls += 1
            if self.calls == 1:
                never.wait()  # the queue actor does not answer this call, ever
            self.got.append(item)

    sink = HangsOnce()
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint), sink)
            server.set(PREEMPTED_KEY, "TRUE")
            _wait_until(lambda: bool(sink.got))
        finally:
            never.set()
            actor.shutdown()
    assert sink.calls >= 2 and sink.got[0]["kind"] == "preemption_notice"
