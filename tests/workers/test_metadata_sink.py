"""The host actor pushes metadata notices to the driver's sink at once; a refused notice is
kept for poll_events. The actor class runs in this process (no Ray, no JAX needed)."""

from __future__ import annotations

import queue
import time
from dataclasses import asdict

from orchestrator.config import load_config
from orchestrator.events.config import MetadataConfig
from orchestrator.hosts import HostRef
from orchestrator.hostspec import HostSpec
from orchestrator.plan import plan_mesh
from tests.events.fake_metadata import fake_metadata_server
from workers.host import HostActor
from workers.metadata_watcher import PREEMPTED_KEY


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


def test_notice_goes_to_the_sink_not_the_poll_buffer():
    """A preemption notice is put on the sink as it is seen; polling finds nothing twice."""
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
    assert actor.poll_events() == []


def test_notice_the_sink_refuses_is_kept_for_polling():
    """A full (or dead) sink must not lose the notice: poll_events returns it."""
    actor = _actor()
    full: queue.Queue = queue.Queue(maxsize=1)
    full.put("occupied")
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint), full)
            server.set(PREEMPTED_KEY, "TRUE")
            got: list[dict] = []
            _wait_until(lambda: bool(got.extend(actor.poll_events()) or got))
        finally:
            actor.shutdown()
    assert [e["kind"] for e in got] == ["preemption_notice"]
    assert full.get_nowait() == "occupied"


def test_without_a_sink_notices_wait_for_polling():
    actor = _actor()
    with fake_metadata_server() as (endpoint, server):
        try:
            assert actor.start_metadata_watcher(_settings(endpoint))
            server.set(PREEMPTED_KEY, "TRUE")
            got: list[dict] = []
            _wait_until(lambda: bool(got.extend(actor.poll_events()) or got))
        finally:
            actor.shutdown()
    assert [e["kind"] for e in got] == ["preemption_notice"]
