"""Topology discovery from ``ray.nodes()`` entries, and the bounded Ray connect (no cluster)."""

from __future__ import annotations

import threading

import pytest

from orchestrator.raygroup.topology import (
    EMULATED_LABEL,
    INSTANCE_LABEL,
    POD_TYPE_LABEL,
    SLICE_LABEL,
    WORKER_LABEL,
    accelerator_of,
    connect_ray,
    hosts_from_nodes,
    platform_of,
)
from orchestrator.shared.errors import ClusterUnreachableError


def _node(node_id: str, *, slice_name: str | None = "s0", worker: int = 0, tpu: float = 4,
          alive: bool = True, emulated: bool = False, pod: str = "v5litepod-16",
          instance: str | None = None) -> dict:
    labels = {POD_TYPE_LABEL: pod, WORKER_LABEL: str(worker)}
    if slice_name:
        labels[SLICE_LABEL] = slice_name
    if emulated:
        labels[EMULATED_LABEL] = "true"
    if instance:
        labels[INSTANCE_LABEL] = instance
    resources = {"CPU": 8.0, **({"TPU": tpu} if tpu else {})}
    return {"NodeID": node_id, "Alive": alive, "Labels": labels, "Resources": resources,
            "NodeManagerAddress": f"10.0.0.{worker}", "NodeManagerHostname": f"vm-{node_id}"}


def test_only_alive_labelled_tpu_nodes_are_hosts():
    nodes = [_node("a", worker=1), _node("b", worker=0), _node("dead", alive=False),
             _node("cpu-only", tpu=0), _node("no-slice", slice_name=None)]
    hosts = hosts_from_nodes(nodes)
    assert sorted(h.node_id for h in hosts) == ["a", "b"]
    a = next(h for h in hosts if h.node_id == "a")
    assert (a.index, a.slice_name, a.worker_id, a.devices, a.node_ip) == (-1, "s0", 1, 4,
                                                                           "10.0.0.1")
    assert a.instance == "vm-a"  # no instance label: the VM hostname Ray reports


def test_instance_label_wins_and_exclude_drops_nodes():
    hosts = hosts_from_nodes([_node("a", instance="tpu-vm-7"), _node("b", worker=1)],
                             exclude=["b"])
    assert [(h.node_id, h.instance) for h in hosts] == [("a", "tpu-vm-7")]


def test_platform_and_accelerator():
    """Emulated nodes mean CPU and no chip peak; real pod types map to the MFU table keys."""
    assert platform_of([_node("a", emulated=True)]) == "cpu"
    assert platform_of([_node("a")]) == "tpu"
    assert platform_of([]) == "cpu"
    assert accelerator_of([_node("a", pod="v5litepod-16")]) == "v5e"
    assert accelerator_of([_node("a", pod="v6e-8")]) == "v6e"
    assert accelerator_of([_node("a", pod="v4-32")]) == "v4"
    assert accelerator_of([_node("a", pod="cpu-emu-4", emulated=True)]) is None


def test_connect_gives_up_after_the_timeout_naming_the_fix():
    """Ray retries an unreachable GCS forever; the driver stops waiting after timeout_s."""
    release = threading.Event()

    def hanging_init(**kwargs):
        release.wait(30)

    try:
        with pytest.raises(ClusterUnreachableError) as info:
            connect_ray("10.1.2.3:6379", timeout_s=0.2, init=hanging_init)
    finally:
        release.set()
    assert "'10.1.2.3:6379'" in info.value.message and "within 0.2s" in info.value.message
    assert "cluster.address" in info.value.fix


def test_connect_error_is_reported_with_the_fix():
    def failing_init(**kwargs):
        raise ConnectionError("refused")

    with pytest.raises(ClusterUnreachableError) as info:
        connect_ray("127.0.0.1:1", timeout_s=5, init=failing_init)
    assert "refused" in info.value.message and "ray start --head" in info.value.fix


def test_connect_passes_the_address():
    seen: dict = {}
    connect_ray("10.0.0.9:6379", timeout_s=5, init=lambda **kw: seen.update(kw))
    assert seen["address"] == "10.0.0.9:6379"
