"""The host contract where it needs several processes: 2 host actors on an emulated Ray cluster.

- a stop requested mid-chunk stops both hosts at the same step;
- metadata notices go straight into the driver's ``ray.util.queue.Queue``;
- warm processes: a released process and a standby join the next runtime in process, and the
  pool's fallbacks (a failed release or rejoin) end in a killed process and a fresh one.

A shard of the latest checkpoint unreadable on ONE host is proven end to end, through the
controller, in tests/faults/test_group_faults.py (the corrupt newest checkpoint).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

import pytest
import ray
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.config import load_config
from orchestrator.controller.seam import GroupSpec
from orchestrator.events.config import MetadataConfig
from orchestrator.raygroup.group import STOP_MARGIN_STEPS, RayWorkerGroup
from orchestrator.raygroup.warm_pool import WarmPool
from orchestrator.shared.host_env import device_env
from orchestrator.shared.plan import plan_mesh
from tests.events.fake_metadata import fake_metadata_server
from tests.integration.groups import Group, _RemoteHost
from tests.support.ray_cluster import cluster_fixture
from workers.host.metadata_watcher import ID_KEY, NAME_KEY, PREEMPTED_KEY

pytestmark = pytest.mark.cluster

OVERRIDES = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
             "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
             "train.warmup_steps=2", "run.total_steps=2000", "timeouts.heartbeat_s=5"]

cluster = cluster_fixture(layout=[2], names=["pod"])


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, OVERRIDES)


def _group(cluster, cfg, run_dir, *, survive_peers: bool = False) -> Group:
    return Group(cfg, cluster.hosts("pod"), run_dir, hosts_per_slice=2, timeout_s=180,
                 survive_peers=survive_peers)


def test_stop_mid_chunk_stops_both_hosts_at_one_step(cluster, cfg, tmp_path):
    """request_stop(chunk, max(current) + the driver's margin) on both hosts while a 2000-step
    chunk runs: both stop at the same step, and a stop for an older chunk id sent meanwhile
    changes nothing. (max + 1 races with a host finishing a step meanwhile: one host would pass
    the bound and wait in a collective for the other forever.)"""
    g = _group(cluster, cfg, tmp_path)
    try:
        g.form()
        g.call("compile")
        g.get([a.run_steps.remote(1, chunk=1) for a in g.actors])
        refs = [a.run_steps.remote(2000, chunk=2) for a in g.actors]
        deadline = time.monotonic() + 120
        while min(g.call("current_step")) < 4:
            assert time.monotonic() < deadline, "the chunk did not advance"
            time.sleep(0.05)
        g.call("request_stop", 1, 0)  # chunk 1 is over: ignored
        at = max(g.call("current_step")) + STOP_MARGIN_STEPS
        returned = g.call("request_stop", 2, at)
        out = g.get(refs)
    finally:
        g.kill()
    steps = [r["step"] for r in out]
    assert steps[0] == steps[1], f"hosts stopped at different steps {steps}"
    assert all(r["stopped_early"] for r in out)
    assert at <= steps[0] <= max(at, max(returned) + 1)


def test_metadata_notices_go_to_the_driver_queue(cluster, cfg, tmp_path):
    """Both hosts push the preemption notice into the driver's Ray queue at once; the notices
    stay there after the host actors are killed."""
    queue = Queue(actor_options={"num_cpus": 0})
    g = _group(cluster, cfg, tmp_path)
    try:
        with fake_metadata_server() as (endpoint, server):
            settings = asdict(MetadataConfig(enabled="on", endpoint=endpoint, timeout_s=5,
                                             backoff_initial_s=0.05))
            assert g.call("start_metadata_watcher", settings, queue) == [True, True]
            server.values.update({ID_KEY: "2093000891450668968", NAME_KEY: "vm-1"})
            server.etags.update({ID_KEY: 1, NAME_KEY: 1})
            # what RayWorkerGroup.form collects into Formed.instance_ids (id -> name targeting)
            assert [tuple(x) for x in g.call("instance_identity", settings)] == [
                ("2093000891450668968", "vm-1")] * 2
            server.set(PREEMPTED_KEY, "TRUE")
            deadline = time.monotonic() + 60
            while queue.qsize() < 2:
                assert time.monotonic() < deadline, "notices did not reach the queue"
                time.sleep(0.05)
            instances = sorted(h.instance for h in g.plan.hosts)
            g.call("shutdown")
        g.kill()
        events = [queue.get(timeout=10), queue.get(timeout=10)]
    finally:
        g.kill()
        queue.shutdown()
    assert {e["kind"] for e in events} == {"preemption_notice"}
    assert sorted(e["target"]["host"] for e in events) == instances


# ---- warm processes: in-process re-init and standbys ----------------------------------------


def test_a_released_process_and_a_standby_form_the_next_group(cluster, cfg, tmp_path):
    """Train 4 steps and save; ``release`` both processes (runtime shut down in process); kill
    host 1's and put a standby (``HostActor(None, env)``, JAX imported) there; ``rejoin`` both
    into a new runtime: the step is loaded (not compiled), step 4 restored, training goes on,
    and host 0 is the same process throughout."""
    g = _group(cluster, cfg, tmp_path, survive_peers=True)
    try:
        g.form()
        g.call("compile")
        g.get([a.run_steps.remote(4, chunk=1, save_steps=[4]) for a in g.actors])
        g.call("save", wait=True)
        pid0 = g.call("info")[0]["pid"]
        g.call("quiesce")
        # process 0 runs the coordination service: it leaves last (WarmPool.park's order)
        released = [ray.get(g.actors[i].release.remote(), timeout=60) for i in (1, 0)]
        assert all(r["pid"] for r in released)
        ray.kill(g.actors[1], no_restart=True)
        h1 = g.plan.hosts[1]
        env = device_env(platform="cpu", devices_per_host=h1.devices)
        g.actors[1] = _RemoteHost.options(
            num_cpus=0, resources={"TPU": h1.devices}, max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=h1.node_id, soft=False),
            runtime_env={"env_vars": env}).remote(None, env)
        assert g.call("info")[1]["index"] is None  # a standby has no host yet
        g.call("warm")
        for a, spec in zip(g.actors, g.specs, strict=True):
            ray.get(a.rejoin.remote(spec, device_env(platform="cpu",
                                                      devices_per_host=spec.host.devices)))
        _, restored = g.form()
        compiled = g.call("compile")
        out = g.get([a.run_steps.remote(6, chunk=2) for a in g.actors])
        assert g.call("info")[0]["pid"] == pid0
    finally:
        g.kill()
    assert [r["restored_step"] for r in restored] == [4, 4]
    assert [c["source"] for c in compiled] == ["loaded", "loaded"]
    assert [o["step"] for o in out] == [6, 6]


def test_rejoin_refuses_a_process_that_still_trains_or_another_node(cluster, cfg, tmp_path):
    g = _group(cluster, cfg, tmp_path, survive_peers=True)
    try:
        g.form()
        with pytest.raises(ray.exceptions.RayTaskError, match="release"):
            ray.get(g.actors[0].rejoin.remote(g.specs[0], {}), timeout=60)
        g.call("quiesce")
        for i in (1, 0):
            ray.get(g.actors[i].release.remote(), timeout=60)
        with pytest.raises(ray.exceptions.RayTaskError, match="cannot change hosts"):
            ray.get(g.actors[0].rejoin.remote(g.specs[1], {}), timeout=60)
    finally:
        g.kill()


@ray.remote(num_cpus=0)
class _Warmable:
    """A host process stand-in for the pool's own logic: answers release/rejoin as told."""

    def __init__(self, spec: Any, env: dict) -> None:
        self.spec, self.fail = spec, set()

    def fail_on(self, *methods: str) -> None:
        self.fail = set(methods)

    def _answer(self, method: str) -> dict:
        if method in self.fail:
            raise RuntimeError(f"{method} refused")
        return {"pid": os.getpid(), "release_s": 0.01}

    def quiesce(self, ahead_wait_s: float = 120.0) -> dict:
        return self._answer("quiesce")

    def release(self) -> dict:
        return self._answer("release")

    def rejoin(self, spec: Any, env: dict) -> dict:
        return self._answer("rejoin")

    def warm(self) -> dict:
        return self._answer("warm")

    def info(self) -> dict:
        return {"pid": os.getpid()}


def _pinned(h: Any) -> Any:
    """A stand-in holding ``h``'s TPU resource on ``h``'s node, as a host process does."""
    return _Warmable.options(resources={"TPU": h.devices}, scheduling_strategy=(
        NodeAffinitySchedulingStrategy(node_id=h.node_id, soft=False))).remote(None, {})


def _dead(actor: Any, within_s: float = 30.0) -> bool:
    """Whether ``actor`` dies within ``within_s``: ``ray.kill`` is asynchronous, so a call
    sent right after it can still be answered (seen once in a full suite run)."""
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        try:
            ray.get(actor.info.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_the_pool_keeps_what_released_and_kills_the_rest(cluster):
    hosts = cluster.hosts("pod")
    a, b = _Warmable.remote(None, {}), _Warmable.remote(None, {})
    ray.get(b.fail_on.remote("release"))
    pool = WarmPool(start_standby=lambda h: _Warmable.remote(None, {}))
    try:
        assert pool.park([(hosts[0].node_id, a), (hosts[1].node_id, b)]) == 1
        assert pool.stats.release_failed == 1 and _dead(b)
        assert pool.ensure_standby([hosts[1]]) == 1
        assert pool.ensure_standby([hosts[1]]) == 0  # one per host, kept
        assert pool.take(hosts[0].node_id)[1] == "parked"
        assert pool.take(hosts[1].node_id)[1] == "standby"
        assert pool.take(hosts[1].node_id) is None
    finally:
        pool.close()
        for x in (a, b):
            ray.kill(x, no_restart=True)


def test_a_group_starts_a_fresh_process_where_a_warm_one_fails_to_rejoin(cluster, cfg,
                                                                          tmp_path):
    """Host 0's parked process refuses to rejoin: it is killed and a fresh process takes its
    place (its TPU resource freed first); host 1's standby is taken."""
    plan = plan_mesh(cfg, cluster.hosts("pod"), platform="cpu", hosts_per_slice=2)
    hosts = plan.hosts  # the group's order
    pool = WarmPool(start_standby=lambda h: _Warmable.remote(None, {}))
    parked = _pinned(hosts[0])
    ray.get(parked.fail_on.remote("rejoin"))
    pool.parked[hosts[0].node_id] = parked
    pool.standby[hosts[1].node_id] = _pinned(hosts[1])
    group_cls = type("G", (RayWorkerGroup,), {"actor_cls": _Warmable})
    group = group_cls(GroupSpec(plan=plan, cfg=cfg, incarnation=1, run_dir=str(tmp_path)),
                      pool=pool, reuse=True)
    try:
        group._start()
        assert group.origins == ["fresh", "standby"]
        assert _dead(parked)
        assert not _dead(group.actors[0], within_s=1.0)
    finally:
        group.shutdown(graceful=False)
        pool.close()
