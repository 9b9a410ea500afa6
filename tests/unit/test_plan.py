"""Mesh plans for several topologies, and the MEGASCALE env a multislice TPU run needs."""

from __future__ import annotations

import pytest
from ray.util.tpu import get_tpu_coordinator_env_vars

from orchestrator.config import RunConfig, load_config
from orchestrator.shared.errors import ConfigError, TopologyError
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import MeshPlan, plan_mesh


def _hosts(layout: dict[str, int], *, devices: int = 2, shuffle: bool = True) -> list[HostRef]:
    """HostRefs for {slice: host count}, listed out of order as ray.nodes() may list them."""
    out = [HostRef(index=-1, slice_name=s, worker_id=w, node_id=f"node-{s}-{w}",
                   node_ip=f"10.0.{i}.{w}", instance=f"{s}-w{w}", devices=devices)
           for i, (s, n) in enumerate(layout.items()) for w in range(n)]
    return list(reversed(out)) if shuffle else out


def _order(plan: MeshPlan) -> list[tuple[str, int]]:
    return [(h.slice_name, h.worker_id) for h in plan.hosts]


@pytest.mark.parametrize(("layout", "expected_mesh"), [
    ({"a": 1}, {"data": 1, "fsdp": 2, "tensor": 1, "dcn_data": 1, "dcn_fsdp": 1}),
    ({"a": 2}, {"data": 1, "fsdp": 4, "tensor": 1, "dcn_data": 1, "dcn_fsdp": 1}),
    ({"a": 2, "b": 2}, {"data": 2, "fsdp": 4, "tensor": 1, "dcn_data": 2, "dcn_fsdp": 1}),
    ({"a": 1, "b": 1}, {"data": 2, "fsdp": 2, "tensor": 1, "dcn_data": 2, "dcn_fsdp": 1}),
])
def test_plan_shapes(layout, expected_mesh):
    """1x2, 2x2 (one slice), 2 slices x 2 hosts, 2 slices x 1 host: DCN data spans the slices."""
    plan = plan_mesh(RunConfig(), _hosts(layout), platform="cpu")
    n_hosts = sum(layout.values())
    assert plan.shape.as_dict() == expected_mesh
    assert (plan.num_processes, plan.num_slices) == (n_hosts, len(layout))
    assert plan.devices == 2 * n_hosts
    assert plan.hosts_per_slice == n_hosts // len(layout)
    assert [h.index for h in plan.hosts] == list(range(n_hosts))


def test_process_order_is_slice_then_worker_id():
    """Processes are numbered slice by slice (sorted names), worker ids ascending inside."""
    plan = plan_mesh(RunConfig(), _hosts({"s-b": 2, "s-a": 2}), platform="cpu")
    assert _order(plan) == [("s-a", 0), ("s-a", 1), ("s-b", 0), ("s-b", 1)]
    assert plan.slice_names == ("s-a", "s-b")
    assert [plan.slice_id(h) for h in plan.hosts] == [0, 0, 1, 1]
    assert plan.hosts[2].node_id == "node-s-b-0"


def test_incomplete_slice_is_left_out():
    """A slice missing a host (one lost) is not used; the mesh shrinks to the complete slices."""
    hosts = [h for h in _hosts({"a": 2, "b": 2, "c": 2}) if (h.slice_name, h.worker_id) != ("b", 1)]
    plan = plan_mesh(RunConfig(), hosts, platform="cpu", hosts_per_slice=2)
    assert plan.slice_names == ("a", "c")
    assert plan.shape.dcn_data == 2
    assert _order(plan) == [("a", 0), ("a", 1), ("c", 0), ("c", 1)]


def test_hosts_per_slice_defaults_to_the_largest_slice():
    hosts = [h for h in _hosts({"a": 2, "b": 2}) if (h.slice_name, h.worker_id) != ("a", 0)]
    plan = plan_mesh(RunConfig(), hosts, platform="cpu")
    assert plan.slice_names == ("b",)


def test_max_slices_caps_the_plan():
    plan = plan_mesh(RunConfig(), _hosts({"a": 1, "b": 1, "c": 1}), platform="cpu", max_slices=2)
    assert plan.slice_names == ("a", "b") and plan.shape.dcn_data == 2


def test_no_hosts_is_a_topology_error_naming_the_fix():
    with pytest.raises(TopologyError) as info:
        plan_mesh(RunConfig(), [], platform="cpu")
    assert "cluster.mode=emulate" in info.value.fix


def test_no_complete_slice():
    hosts = [h for h in _hosts({"a": 2}) if h.worker_id == 0]
    with pytest.raises(TopologyError) as info:
        plan_mesh(RunConfig(), hosts, platform="cpu", hosts_per_slice=2)
    assert "replacement slice" in info.value.fix


def test_mixed_device_counts_rejected():
    hosts = _hosts({"a": 1}, devices=2) + _hosts({"b": 1}, devices=4)
    with pytest.raises(TopologyError) as info:
        plan_mesh(RunConfig(), hosts, platform="cpu")
    assert "one TPU type" in info.value.fix


def test_mesh_that_does_not_fit_the_hosts_names_the_axis():
    """tensor=4 asks for 4 devices per slice; one host of 2 devices cannot hold it."""
    cfg = load_config(None, ["mesh.ici.tensor=4", "mesh.ici.fsdp=1"])
    with pytest.raises(ConfigError) as info:
        plan_mesh(cfg, _hosts({"a": 1}), platform="cpu")
    assert info.value.setting == "mesh.ici"


def test_plan_describe_is_plain_data():
    import json

    plan = plan_mesh(RunConfig(), _hosts({"a": 2}), platform="cpu")
    d = json.loads(json.dumps(plan.describe()))
    assert d == {"slices": ["a"], "hosts": 2, "devices_per_host": 2, "platform": "cpu",
                 "mesh": {"data": 1, "fsdp": 4, "tensor": 1, "dcn_data": 1, "dcn_fsdp": 1}}


# ---- MEGASCALE --------------------------------------------------------------------------

def test_megascale_env_matches_ray_util_tpu_for_every_host():
    """Multislice TPU: each host gets exactly the keys and values ray.util.tpu computes."""
    cfg = load_config(None, ["train.global_batch=24"])
    plan = plan_mesh(cfg, _hosts({"s0": 2, "s1": 2, "s2": 2}), platform="tpu")
    coord = plan.hosts[0].node_ip
    for h in plan.hosts:
        ours = plan.megascale_env(h, coordinator_ip=coord)
        theirs = get_tpu_coordinator_env_vars(coordinator_address=coord, num_slices=3,
                                              slice_id=plan.slice_id(h))
        assert ours == theirs
    assert [plan.megascale_env(h, coordinator_ip=coord)["MEGASCALE_SLICE_ID"]
            for h in plan.hosts] == ["0", "0", "1", "1", "2", "2"]


def test_megascale_env_custom_port():
    plan = plan_mesh(RunConfig(), _hosts({"s0": 1, "s1": 1}), platform="tpu")
    h = plan.hosts[1]
    assert plan.megascale_env(h, coordinator_ip="10.9.9.9", port="9999") == \
        get_tpu_coordinator_env_vars("10.9.9.9", 2, 1, coordinator_port="9999")


@pytest.mark.parametrize(("layout", "platform"), [({"s0": 2}, "tpu"), ({"s0": 1, "s1": 1}, "cpu")])
def test_no_megascale_env_for_one_slice_or_cpu(layout, platform):
    """Single-slice TPU and emulated CPU runs need no MEGASCALE_* (and must not get any)."""
    plan = plan_mesh(RunConfig(), _hosts(layout), platform=platform)
    assert all(plan.megascale_env(h, coordinator_ip="10.0.0.1") == {} for h in plan.hosts)


def test_device_env_sets_cpu_device_count_and_keeps_megascale():
    """Host env: every XLA flag carries its leading `--`; MEGASCALE keys pass through."""
    from orchestrator.shared.host_env import device_env

    env = device_env(platform="cpu", devices_per_host=3)
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=3", "JAX_PLATFORMS": "cpu"}
    tpu = device_env(platform="tpu", devices_per_host=4, extra={"MEGASCALE_NUM_SLICES": "2"})
    assert tpu == {"MEGASCALE_NUM_SLICES": "2"}
