"""The Ray side of the seam maps what it sees into typed statuses (pure parts, no cluster)."""

from __future__ import annotations

from orchestrator.controller.seam import HostsLost, Progress
from orchestrator.hosts import HostRef
from orchestrator.ray_results import combine, lost_kind
from policies.causes import FailureKind


def test_hosts_disagreeing_on_the_step_become_a_recovery_not_a_crash():
    status = combine([{"step": 10, "records": []}, {"step": 9, "records": []}])
    assert isinstance(status, HostsLost)
    assert status.kind is FailureKind.STEP_ERROR and status.step_reached == 10


def test_a_step_is_committed_only_when_every_host_committed_it():
    status = combine([{"step": 10, "committed_step": 10, "records": [{"step": 10}]},
                      {"step": 10, "committed_step": 5, "records": []}])
    assert isinstance(status, Progress)
    assert status.committed_step == 5 and status.records == ({"step": 10},)
    none_yet = combine([{"step": 3, "committed_step": None}, {"step": 3, "committed_step": 0}])
    assert none_yet.committed_step is None


def _hosts(*slices: str) -> list[HostRef]:
    return [HostRef(slice_name=s, worker_id=w, node_id=f"{s}-n{w}", node_ip="10.0.0.1",
                    instance=f"{s}-w{w}", index=i, devices=4)
            for i, (s, w) in enumerate((s, w) for s in slices for w in range(2))]


def test_dead_nodes_refine_the_failure_kind():
    hosts = _hosts("a", "b")
    assert lost_kind(FailureKind.ACTOR_DIED, set(), hosts) is FailureKind.ACTOR_DIED
    assert lost_kind(FailureKind.ACTOR_UNAVAILABLE, {"a-n1"}, hosts) is FailureKind.NODE_DIED
    assert lost_kind(FailureKind.ACTOR_DIED, {"a-n0", "a-n1"}, hosts) is FailureKind.SLICE_LOST
