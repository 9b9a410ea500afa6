"""The emulated cloud's capacity schedule and its runner, with a fake cluster and clock."""

from __future__ import annotations

import pytest

from orchestrator.cluster.cloud import CapacitySchedule, EmulatedCloud, slices_named
from orchestrator.config import EmulateConfig
from orchestrator.events.model import Event, EventKind, Target
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.hosts import HostRef


def _hosts() -> list[HostRef]:
    return [HostRef(index=i, slice_name=s, worker_id=w, node_id=f"{s}-n{w}", node_ip="127.0.0.1",
                    instance=f"{s}-w{w}", devices=2)
            for i, (s, w) in enumerate([("a", 0), ("a", 1), ("b", 0), ("b", 1)])]


def _event(kind: EventKind, host: str | None, *, deadline: float | None = 130.0) -> Event:
    return Event(kind=kind, target=Target(host=host), source="operator", id=f"{kind}-{host}",
                 observed_at=100.0, deadline=deadline)


class FakeCapacity:
    def __init__(self) -> None:
        self.up = {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
        self.added: list[str] = []
        self.fail_next = False

    def slice_workers(self, slice_name: str) -> list[int]:
        return sorted(w for s, w in self.up if s == slice_name)

    def remove_host(self, slice_name: str, worker_id: int) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("raylet would not die")
        self.up.discard((slice_name, worker_id))

    def add_slice(self, hosts: int, *, name: str | None = None) -> str:
        name = name or f"new-{len(self.added)}"
        self.added.append(name)
        self.up |= {(name, w) for w in range(hosts)}
        return name


def test_a_slice_goes_at_the_deadline_and_a_new_one_comes_later():
    s = CapacitySchedule(replace_after_s=60.0)
    s.preempted(["a"], deadline=130.0, now=100.0)
    assert s.next_at() == 130.0
    assert s.due(129.9) == []
    assert [(a.kind, a.slice_name) for a in s.due(130.0)] == [("reclaim", "a")]
    assert s.due(189.9) == []
    assert [(a.kind, a.at) for a in s.due(190.0)] == [("replace", 190.0)]
    assert s.next_at() is None


def test_a_repeated_notice_reclaims_once_and_a_past_deadline_reclaims_now():
    s = CapacitySchedule(replace_after_s=0.0)
    assert len(s.preempted(["a"], deadline=50.0, now=100.0)) == 2
    assert s.preempted(["a"], deadline=50.0, now=101.0) == []
    assert [(a.kind, a.at) for a in s.due(100.0)] == [("reclaim", 100.0), ("replace", 100.0)]


def test_a_notice_takes_the_whole_slice_of_the_host_it_names():
    hosts = _hosts()
    assert slices_named(_event(EventKind.PREEMPTION_NOTICE, "b-w1"), hosts) == ["b"]
    assert slices_named(_event(EventKind.PREEMPTION_NOTICE, None), hosts) == ["a", "b"]
    # The VM stays after maintenance or a health report; unknown hosts name nothing.
    assert slices_named(_event(EventKind.MAINTENANCE_SCHEDULED, "b-w1"), hosts) == []
    assert slices_named(_event(EventKind.HOST_UNHEALTHY, "a-w0"), hosts) == []
    assert slices_named(_event(EventKind.PREEMPTION_NOTICE, "zz-w0"), hosts) == []


def test_the_cloud_removes_the_slice_then_adds_a_new_one():
    now = [100.0]
    cap = FakeCapacity()
    cloud = EmulatedCloud(cap, replace_after_s=60.0, hosts_per_slice=2, clock=lambda: now[0])
    cloud.on_event(_event(EventKind.PREEMPTION_NOTICE, "a-w1"), _hosts())
    cloud.on_event(_event(EventKind.HOST_UNHEALTHY, "b-w0"), _hosts())
    assert cloud.step() == [] and cap.slice_workers("a") == [0, 1]
    now[0] = 130.0
    cloud.step()
    assert cap.slice_workers("a") == [] and cap.slice_workers("b") == [0, 1]
    now[0] = 190.0
    cloud.step()
    assert cap.added == ["new-0"] and cap.slice_workers("new-0") == [0, 1]
    assert [h["action"] for h in cloud.history] == ["reclaim", "replace"]


def test_a_failed_removal_is_logged_and_the_replacement_still_comes():
    cap = FakeCapacity()
    cap.fail_next = True
    cloud = EmulatedCloud(cap, replace_after_s=0.0, hosts_per_slice=2, clock=lambda: 200.0)
    cloud.on_event(_event(EventKind.PREEMPTION_NOTICE, "a-w0", deadline=None), _hosts())
    cloud.step()  # must not raise
    assert cap.added == ["new-0"]
    assert [h["action"] for h in cloud.history] == ["replace"]


def test_the_thread_applies_due_actions_and_stops():
    import time

    cap = FakeCapacity()
    cloud = EmulatedCloud(cap, replace_after_s=0.05, hosts_per_slice=1)
    cloud.start()
    try:
        cloud.on_event(_event(EventKind.PREEMPTION_NOTICE, "b-w0", deadline=time.time() + 0.05),
                       _hosts())
        until = time.time() + 5
        while len(cloud.history) < 2 and time.time() < until:
            time.sleep(0.01)
    finally:
        cloud.stop()
    assert [h["action"] for h in cloud.history] == ["reclaim", "replace"]
    assert cap.slice_workers("b") == [] and cap.added == ["new-0"]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_replace_after_s_must_be_seconds(bad):
    with pytest.raises(ConfigError, match="replace_after_s"):
        EmulateConfig(replace_after_s=bad)
