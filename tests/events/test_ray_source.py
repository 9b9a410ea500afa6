"""Ray as an event source: exceptions and node deaths -> HOST_LOST / HOST_UNHEALTHY."""

from __future__ import annotations

import pytest
import ray.exceptions

from orchestrator.events.model import EventKind
from orchestrator.events.ray_source import (
    RayNodeWatcher,
    classify_exception,
    event_from_exception,
)
from tests.events.helpers import hosts


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ray.exceptions.ActorDiedError(), EventKind.HOST_LOST),
        (ray.exceptions.RayActorError(), EventKind.HOST_LOST),
        (ray.exceptions.WorkerCrashedError(), EventKind.HOST_LOST),
        (ray.exceptions.NodeDiedError("node gone"), EventKind.HOST_LOST),
        (ray.exceptions.ActorUnavailableError("busy", None), EventKind.HOST_UNHEALTHY),
        (ray.exceptions.GetTimeoutError(), EventKind.HOST_UNHEALTHY),
        (ValueError("a bug"), None),
    ],
)
def test_exceptions_are_classified(exc, kind):
    """Ray's own exception classes map to a closed set of kinds."""
    assert classify_exception(exc) is kind


def test_one_death_many_exceptions_one_id():
    """Every failed call of one dead actor in one incarnation has the same event id."""
    host = hosts(2)[1]
    first = event_from_exception(ray.exceptions.ActorDiedError(), host, incarnation=3, now=1.0)
    second = event_from_exception(ray.exceptions.RayActorError(), host, incarnation=3, now=2.0)
    assert first.id == second.id
    assert first.target.host == "node1" and first.target.slice == "slice-a"
    assert first.kind is EventKind.HOST_LOST


def test_node_watcher_reports_dead_and_missing_nodes_once():
    """A node listed dead or no longer listed -> HOST_LOST, reported a single time."""
    table = [{"NodeID": "node0", "Alive": True}, {"NodeID": "node1", "Alive": False}]
    watcher = RayNodeWatcher(job="j", nodes=lambda: table, clock=lambda: 5.0)
    hs = hosts(3)
    events = watcher.check(hs)
    assert sorted((e.target.host, e.labels["ray.node_state"]) for e in events) == [
        ("node1", "DEAD"), ("node2", "MISSING")]
    assert watcher.check(hs) == []


def test_node_watcher_survives_an_unreachable_gcs():
    """If the node table cannot be read, nothing is reported and nothing raises."""
    def broken():
        raise ConnectionError("gcs down")

    assert RayNodeWatcher(nodes=broken).check(hosts(2)) == []


@pytest.mark.cluster
def test_real_actor_death_and_node_table():
    """A killed actor's ActorDiedError -> HOST_LOST; the live head node is not reported."""
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Host:
            def ping(self) -> str:
                return "pong"

        actor = Host.remote()
        assert ray.get(actor.ping.remote(), timeout=60) == "pong"
        ray.kill(actor, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError) as info:
            ray.get(actor.ping.remote(), timeout=60)
        host = hosts(1)[0]
        assert event_from_exception(info.value, host, incarnation=0).kind is EventKind.HOST_LOST

        node_id = ray.get_runtime_context().get_node_id()
        from dataclasses import replace
        alive = replace(host, node_id=node_id)
        gone = replace(hosts(2)[1], node_id="f" * 56)
        events = RayNodeWatcher().check([alive, gone])
        assert [e.target.host for e in events] == ["f" * 56]
    finally:
        ray.shutdown()
