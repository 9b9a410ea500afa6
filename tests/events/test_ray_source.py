"""Ray as an event source: node deaths -> HOST_LOST (a failed actor call is the seam's
FailureKind, ``orchestrator.raygroup.results``)."""

from __future__ import annotations

import time

import pytest
import ray.exceptions

from orchestrator.events.ray_source import RayNodeWatcher
from orchestrator.raygroup import ray_private
from orchestrator.raygroup.results import failure_kind
from policies.causes import FailureKind
from tests.events.helpers import hosts
from tests.support.ray_cluster import RunningCluster, cluster_fixture

# One emulated host (1 device, TPU resource) on a head node, shared by the two tests that need
# a real cluster: its start is retried and whatever it started is reaped (tests/support).
cluster = cluster_fixture(layout=[1], names=["drain"], devices_per_host=1)


def test_node_watcher_reports_dead_and_missing_nodes_once():
    """A node listed dead or no longer listed -> HOST_LOST, reported a single time."""
    table = [{"NodeID": "node0", "Alive": True}, {"NodeID": "node1", "Alive": False}]
    watcher = RayNodeWatcher(job="j", nodes=lambda: table, clock=lambda: 5.0,
                             draining=lambda: {})
    hs = hosts(3)
    events = watcher.check(hs)
    assert sorted((e.target.host, e.labels["ray.node_state"]) for e in events) == [
        ("node1", "DEAD"), ("node2", "MISSING")]
    assert watcher.check(hs) == []


def test_node_watcher_survives_an_unreachable_gcs():
    """If the node table cannot be read, nothing is reported and nothing raises."""
    def broken():
        raise ConnectionError("gcs down")

    assert RayNodeWatcher(nodes=broken, draining=lambda: {}).check(hosts(2)) == []


@pytest.mark.cluster
def test_real_actor_death_and_node_table(cluster: RunningCluster):
    """A killed actor's real exception -> ACTOR_DIED; the live head node is not reported."""
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


def test_a_draining_node_is_a_preemption_notice_with_its_deadline_once():
    """Ray Core's drain (node id -> deadline ms) -> PREEMPTION_NOTICE targeted by Ray node id,
    deadline in seconds; a new deadline for the same node is a new notice; 0 means none."""
    drains = {"node1": 1_000_000_030_000}
    watcher = RayNodeWatcher(job="j", nodes=lambda: [{"NodeID": f"node{i}", "Alive": True}
                                                     for i in range(3)],
                             draining=lambda: drains, clock=lambda: 1_000_000_000.0)
    (ev,) = watcher.check(hosts(3))
    assert ev.kind.value == "preemption_notice" and ev.source == "ray"
    assert (ev.target.host, ev.target.host_kind, ev.target.job) == ("node1", "ray_node", "j")
    assert ev.deadline == 1_000_000_030.0
    assert watcher.check(hosts(3)) == []
    drains["node1"] = 1_000_000_020_000
    drains["spare9"] = 0
    again = {e.target.host: e.deadline for e in watcher.check(hosts(3))}
    assert again == {"node1": 1_000_000_020.0, "spare9": None}


def test_drain_polling_that_fails_reports_nothing_and_does_not_raise():
    def broken():
        raise AttributeError("moved in this Ray version")

    watcher = RayNodeWatcher(nodes=lambda: [], draining=broken)
    assert watcher.check_drains(hosts(1)) == []


@pytest.mark.cluster
def test_a_real_ray_drain_with_reason_preemption_becomes_a_notice(cluster: RunningCluster):
    """``ray drain-node``'s call (reason preemption, a deadline) on a node running an actor:
    the seam the driver passes (Ray's private accessor, pinned here) reports it."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    (host,) = cluster.hosts("drain")

    @ray.remote(resources={"TPU": 1})
    class Host:
        def ping(self) -> int:
            return 1

    actor = Host.remote()
    assert ray.get(actor.ping.remote(), timeout=60) == 1
    deadline_ms = int(time.time() * 1000) + 60_000
    gcs = GcsClient(address=cluster.emulated.cluster.gcs_address)
    accepted, why = gcs.drain_node(
        host.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "spot reclaim", deadline_ms)
    assert accepted, why
    watcher = RayNodeWatcher(job="j", draining=ray_private.draining_nodes)
    t_end = time.monotonic() + 30
    events = []
    while not events and time.monotonic() < t_end:
        events = watcher.check_drains(hosts(1))
        time.sleep(0.2)
    assert [(e.target.host, e.deadline) for e in events] == [
        (host.node_id, deadline_ms / 1000.0)]
