"""The host contract where it needs several processes: 2 host actors on an emulated Ray cluster.

- a stop requested mid-chunk stops both hosts at the same step;
- metadata notices go straight into the driver's ``ray.util.queue.Queue``.

A shard of the latest checkpoint unreadable on ONE host is proven end to end, through the
controller, in tests/faults/test_group_faults.py (the corrupt newest checkpoint).
"""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest
from ray.util.queue import Queue

from orchestrator.config import load_config
from orchestrator.events.config import MetadataConfig
from tests.events.fake_metadata import fake_metadata_server
from tests.integration.groups import Group
from tests.support.ray_cluster import cluster_fixture
from workers.metadata_watcher import ID_KEY, NAME_KEY, PREEMPTED_KEY

pytestmark = pytest.mark.cluster

OVERRIDES = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
             "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
             "train.warmup_steps=2", "run.total_steps=2000", "timeouts.heartbeat_s=5"]

cluster = cluster_fixture(layout=[2], names=["pod"])


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, OVERRIDES)


def _group(cluster, cfg, run_dir) -> Group:
    return Group(cfg, cluster.hosts("pod"), run_dir, hosts_per_slice=2, timeout_s=180)


def test_stop_mid_chunk_stops_both_hosts_at_one_step(cluster, cfg, tmp_path):
    """request_stop(chunk, max(current)+1) on both hosts while a 2000-step chunk runs: both
    stop at the same step, and a stop for an older chunk id sent meanwhile changes nothing."""
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
        at = max(g.call("current_step")) + 1
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
