"""Which groups RELEASING kills instead of parking (``orchestrator.raygroup.release``)."""

from __future__ import annotations

from orchestrator.raygroup.release import all_doomed
from orchestrator.shared.hosts import HostRef


def hosts(*slices: str) -> list[HostRef]:
    return [HostRef(index=i, slice_name=s, worker_id=i % 2, node_id=f"{s}-h{i % 2}",
                    node_ip="127.0.0.1", instance=f"{s}-w{i % 2}", devices=2)
            for i, s in enumerate(s for s in slices for _ in range(2))]


def test_a_doomed_host_dooms_its_slice_and_a_group_is_killed_only_when_all_its_slices_are():
    one = hosts("s0")
    assert all_doomed(one, {"s0-h1"})  # one host's notice: the slice goes as a unit
    two = hosts("s0", "s1")
    assert not all_doomed(two, {"s1-h0", "s1-h1"})  # a survivor slice may need a save
    assert all_doomed(two, {"s0-h0", "s1-h1"})
    assert not all_doomed(one, set())
    assert not all_doomed(one, {"elsewhere"})
