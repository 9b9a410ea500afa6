"""Ray as an event source: node deaths -> HOST_LOST (a failed actor call is the seam's
FailureKind, ``orchestrator.ray_results``)."""

from __future__ import annotations

import time

import pytest
import ray.exceptions

from orchestrator.events.ray_source import RayNodeWatcher
from orchestrator.ray_results import failure_kind
from policies.causes import FailureKind
from tests.events.helpers import hosts


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
    """A killed actor's real exception -> ACTOR_DIED; the live head node is not reported."""
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Host:
            def ping(self) -> str:
                return "pong"

        actor = Host.remote()
        assert ray.get(actor.ping.remote(), timeout=60) == "pong"
        ray.kill(actor, no_restart=True)
        # the kill is asynchronous: a call submitted at once may still be answered
        deadline, error = time.monotonic() + 60, None
        while error is None:
            try:
                ray.get(actor.ping.remote(), timeout=60)
            except ray.exceptions.RayActorError as exc:
                error = exc
            assert error is not None or time.monotonic() < deadline, "the actor still answers"
            time.sleep(0.05)
        host = hosts(1)[0]
        assert failure_kind(error) is FailureKind.ACTOR_DIED

        node_id = ray.get_runtime_context().get_node_id()
        from dataclasses import replace
        alive = replace(host, node_id=node_id)
        gone = replace(hosts(2)[1], node_id="f" * 56)
        events = RayNodeWatcher().check([alive, gone])
        assert [e.target.host for e in events] == ["f" * 56]
    finally:
        ray.shutdown()
