"""resolve_targets: hosts are named only by the field that names them for the event's source."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from orchestrator.events.model import EventKind, MalformedEvent, Target
from orchestrator.events.parsing import parse_bytes, parse_value
from orchestrator.events.relevance import staleness
from orchestrator.events.targeting import resolve_targets
from orchestrator.shared.hosts import HostRef
from tests.events.conftest import load_fixture
from tests.events.helpers import event, hosts

NOW = 1_742_191_214.0
PREEMPTED = "logentry_gce_compute_instances_preempted_real_gcpdiag.json"


def mesh() -> list[HostRef]:
    """Four hosts in two slices; one GCE instance is literally called "3"."""
    return [HostRef(index=i, slice_name=f"slice-{i // 2}", worker_id=i % 2, node_id=f"node{i}",
                    node_ip=f"10.0.0.{i + 1}", instance=name, devices=4)
            for i, name in enumerate(["vm-a", "vm-b", "3", "spot-vm-termination"])]


def targeted(host, kind, *, slice_name=None, **kw):
    ev = replace(event(), target=Target(host=host, host_kind=kind, slice=slice_name))
    return resolve_targets(ev, mesh(), **kw)


def test_instance_named_3_is_not_mesh_index_3():
    """Regression: an instance called "3" matched host index 3; now only instance names match."""
    t = targeted("3", "instance")
    assert t.node_ids == {"node2"}  # the VM called "3" is index 2
    assert not targeted("1", "instance").for_this_mesh


def test_numeric_instance_id_resolves_through_the_hosts_map():
    """Regression: a numeric instance id fell back to "stale, not in the mesh"."""
    ids = {"2093000891450668968": "spot-vm-termination"}
    t = targeted("2093000891450668968", "instance_id", id_to_name=ids)
    assert (t.node_ids, t.job_wide) == (frozenset({"node3"}), False)
    missing = targeted("2093000891450668968", "instance_id")
    assert not missing.for_this_mesh and "id -> name map" in missing.reason


def test_real_entry_naming_only_the_instance_id_is_targeted():
    """A GCE entry without resourceName is targeted through resource.labels.instance_id."""
    entry = load_fixture(PREEMPTED)
    del entry["protoPayload"]["resourceName"]
    ev = parse_value(entry, now=NOW, source="t")
    assert (ev.target.host, ev.target.host_kind) == ("2093000891450668968", "instance_id")
    verdict = staleness(ev, hosts=mesh(), incarnation=0, now=NOW,
                        id_to_name={"2093000891450668968": "spot-vm-termination"})
    assert verdict.accepted


def test_entry_naming_no_instance_is_dead_lettered_with_reason():
    """A reservation-level entry cannot be tied to a host: dead letter saying what it named."""
    entry = load_fixture("logentry_gce_compute_instances_upcomingMaintenance_ASSEMBLED.json")
    entry["protoPayload"]["resourceName"] = "projects/p/zones/z/reservations/r/reservationBlocks/b"
    entry["resource"] = {"type": "gce_reservation", "labels": {"project_id": "p"}}
    with pytest.raises(MalformedEvent) as info:
        parse_value(entry, now=NOW, source="t")
    assert "names no instance" in info.value.reason and "reservationBlocks" in info.value.reason


@pytest.mark.parametrize(
    ("host", "kind", "slice_name", "expected"),
    [
        ("spot-vm-termination", "node_name", None, {"node3"}),  # GKE node = VM name
        ("1", "tpu_worker", "slice-1", {"node3"}),  # worker 1 of slice-1
        ("1", "tpu_worker", "slice-0", {"node1"}),
        ("node2", "ray_node", None, {"node2"}),
        ("10.0.0.1", "ip", None, {"node0"}),
        ("1", "index", None, {"node1"}),
        ("vm-a", "ip", None, set()),  # an instance name is not an IP
        ("node2", "instance", None, set()),  # a Ray node id is not an instance name
    ],
)
def test_each_host_kind_matches_only_its_field(host, kind, slice_name, expected):
    """Every host kind reads exactly one HostRef field."""
    assert targeted(host, kind, slice_name=slice_name).node_ids == frozenset(expected)


def test_operator_names_may_be_any_host_name():
    """Operator input (no host_kind): instance, node id, IP or mesh index."""
    for name, node in (("vm-b", "node1"), ("node2", "node2"), ("10.0.0.4", "node3"),
                       ("0", "node0")):
        assert targeted(name, None).node_ids == {node}


def test_slice_target_names_every_host_of_the_slice():
    """A slice without a host names all its hosts; an unknown slice names none, with reason."""
    ev = event(host=None, slice_name="slice-1")
    assert resolve_targets(ev, mesh()).node_ids == {"node2", "node3"}
    gone = resolve_targets(event(host=None, slice_name="slice-9"), mesh())
    assert not gone.for_this_mesh and "slice-9" in gone.reason


def test_job_wide_only_for_the_operator_or_the_jobs_own_cluster():
    """No host: job-wide for operator events and for this job's cluster; else a reason."""
    operator = resolve_targets(event(EventKind.OPERATOR_STOP, host=None), mesh())
    assert operator.job_wide and not operator.node_ids
    ours = replace(event(host=None), target=Target(cluster="tpu-cluster"))
    assert resolve_targets(ours, mesh(), cluster="tpu-cluster").job_wide
    other = resolve_targets(ours, mesh(), cluster="prod")
    assert not other.for_this_mesh and "not this job's cluster" in other.reason
    unknown = resolve_targets(ours, mesh())
    assert not unknown.for_this_mesh and "events.cluster" in unknown.reason


def test_uptime_check_alert_is_dead_lettered_by_the_intake_parser():
    """Regression: an uptime check's URL host was matched as a host. Now: dead letter."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    payload["incident"]["resource"] = {"type": "uptime_url",
                                       "labels": {"host": "vm-a", "project_id": "p"}}
    payload["incident"]["metric"] = {"type": "monitoring.googleapis.com/uptime_check/"
                                             "check_passed", "labels": {}}
    payload["incident"]["policy_user_labels"] = {}
    with pytest.raises(MalformedEvent, match="names no host"):
        parse_bytes(json.dumps(payload).encode(), now=NOW, source="t")


def test_intake_verdict_agrees_with_the_resolver():
    """staleness() accepts exactly the events resolve_targets ties to the mesh."""
    cases = [("3", "instance"), ("3", None), ("1", "instance"), ("9", "index"),
             ("node1", "ray_node"), ("vm-a", "node_name"), (None, None)]
    for host, kind in cases:
        ev = replace(event(), target=Target(host=host, host_kind=kind))
        expected = resolve_targets(ev, mesh()).for_this_mesh
        assert staleness(ev, hosts=mesh(), incarnation=0, now=0).accepted is expected, (host,
                                                                                        kind)


def test_helpers_mesh_still_accepts_operator_names():
    """The default helpers' hosts: the CLI's names keep working."""
    for name in ("1", "vm-1", "node1", "10.0.0.2"):
        assert resolve_targets(event(host=name), hosts(2)).node_ids == {"node1"}
