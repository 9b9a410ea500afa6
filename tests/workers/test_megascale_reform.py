"""A re-form after a slice loss hands no stale MEGASCALE_* to any host process (issue 28, item 10).

libtpu reads them at backend start: a slice count or coordinator of the mesh before the loss
makes the new group's init wait for slices that are gone (seen by TPU users of other Ray tools
as an init that hangs for ever). Fresh processes get the new plan's env from Ray; reused ones
(parked survivors, standbys) had the old one set in their process and must lose it in
``rejoin``.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.config import load_config
from orchestrator.raygroup.group import host_envs
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MEGASCALE_KEYS, MeshPlan, plan_mesh
from workers.host.actor import HostActor

CFG = load_config(None, ["train.global_batch=48"])


def _plan(layout: dict[str, int]) -> MeshPlan:
    hosts = [HostRef(index=-1, slice_name=s, worker_id=w, node_id=f"node-{s}-{w}",
                     node_ip=f"10.0.{i}.{w}", instance=f"{s}-w{w}", devices=4)
             for i, (s, n) in enumerate(layout.items()) for w in range(n)]
    return plan_mesh(CFG, hosts, platform="tpu")


def _spec(plan: MeshPlan, node_id: str) -> HostSpec:
    (host,) = [h for h in plan.hosts if h.node_id == node_id]
    return HostSpec.for_host(CFG, plan, host, checkpoint_dir="/r/checkpoints")


def _env_of(plan: MeshPlan, node_id: str) -> dict[str, str]:
    (env,) = [e for h, e in zip(plan.hosts, host_envs(plan), strict=True) if h.node_id == node_id]
    return env


def _multislice() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")}


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's own MEGASCALE_* (a node env naming another mesh), restored afterwards."""
    for key in MEGASCALE_KEYS:
        monkeypatch.setenv(key, "stale-from-the-node")


def test_every_host_of_the_one_slice_mesh_gets_no_multislice_env():
    before, after = _plan({"s0": 2, "s1": 2}), _plan({"s0": 2})  # s1 lost
    assert [e["MEGASCALE_SLICE_ID"] for e in host_envs(before)] == ["0", "0", "1", "1"]
    assert [e["MEGASCALE_NUM_SLICES"] for e in host_envs(before)] == ["2"] * 4
    assert [[k for k in e if k.startswith("MEGASCALE_")] for e in host_envs(after)] == [[], []]


@pytest.mark.usefixtures("environ")
def test_a_survivor_reused_for_the_one_slice_mesh_drops_the_two_slice_env():
    before, after = _plan({"s0": 2, "s1": 2}), _plan({"s0": 2})
    node = "node-s0-1"
    actor = HostActor(_spec(before, node), _env_of(before, node))  # as Ray started it
    assert _multislice() == {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.0",
                             "MEGASCALE_PORT": "8081", "MEGASCALE_NUM_SLICES": "2",
                             "MEGASCALE_SLICE_ID": "0"}
    actor.rejoin(_spec(after, node), _env_of(after, node))  # parked, then taken
    assert _multislice() == {}


@pytest.mark.usefixtures("environ")
def test_a_survivor_of_a_smaller_multislice_mesh_gets_the_new_values():
    before, after = _plan({"s0": 1, "s1": 1, "s2": 1}), _plan({"s0": 1, "s2": 1})  # s1 lost
    node = "node-s2-0"
    actor = HostActor(_spec(before, node), _env_of(before, node))
    assert (_multislice()["MEGASCALE_NUM_SLICES"], _multislice()["MEGASCALE_SLICE_ID"]) == ("3",
                                                                                            "2")
    actor.rejoin(_spec(after, node), _env_of(after, node))
    assert _multislice() == {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.0",
                             "MEGASCALE_PORT": "8081", "MEGASCALE_NUM_SLICES": "2",
                             "MEGASCALE_SLICE_ID": "1"}


@pytest.mark.usefixtures("environ")
def test_a_standby_taking_a_one_slice_host_keeps_no_multislice_env_of_its_node():
    after = _plan({"s0": 2})
    node = "node-s0-0"
    standby = HostActor(None, host_envs(after)[0])  # a standby's env: devices only
    assert _multislice() == {}, "the node's stale keys are dropped at the standby's start"
    for key in MEGASCALE_KEYS:  # and again, should anything have set them meanwhile
        os.environ[key] = "stale"
    standby.rejoin(_spec(after, node), _env_of(after, node))
    assert _multislice() == {}
