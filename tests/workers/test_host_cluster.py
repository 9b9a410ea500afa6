"""The host contract where it needs several processes: 2 host actors on an emulated Ray cluster.

- a shard of the latest checkpoint unreadable on ONE host: that host raises CheckpointCorrupt
  (the group cannot fall back in place), and a new group with ``skip_steps`` restores the
  previous step, with the bad step moved aside and saved again later;
- a stop requested mid-chunk stops both hosts at the same step;
- metadata notices go straight into the driver's ``ray.util.queue.Queue``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import pytest
import ray
from ray.util.queue import Queue

from orchestrator.config import load_config
from orchestrator.errors import CheckpointCorrupt
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


def test_shard_unreadable_on_one_host_raises_then_skip_restores_previous(cluster, cfg, tmp_path):
    """Host 1's shard of step 4 truncated: host 1 raises CheckpointCorrupt(step=4); a new group
    restoring with skip_steps=[4] gets step 2 on both hosts, 4 moved aside, and saves 4 again."""
    g = _group(cluster, cfg, tmp_path)
    try:
        g.form()
        g.call("compile")
        g.get([a.run_steps.remote(4, chunk=1, save_steps=[2, 4]) for a in g.actors])
        g.call("shutdown")  # waits for the async save of step 4
    finally:
        g.kill()
    shards = sorted((tmp_path / "checkpoints" / "4" / "state").glob("ocdbt.process_1/d/*"))
    assert shards, "process 1 wrote no shard files of its own"
    for f in shards:
        os.truncate(f, 10)

    g = _group(cluster, cfg, tmp_path)
    try:
        g.initialize()
        g.call("build")
        refs = [a.restore.remote([]) for a in g.actors]
        ready, _ = ray.wait(refs, num_returns=1, timeout=180)
        assert refs[1] in ready, "host 1 (the unreadable shard) must answer first"
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(refs[1])
        err = info.value.cause
        assert isinstance(err, CheckpointCorrupt) and not err.retryable
        assert (err.step, err.hosts) == (4, (1,))
        # host 0 waits in Orbax's restore barrier for a peer that left: only killing helps
        host0_done = refs[0] in ray.wait([refs[0]], timeout=2)[0]
        print(f"host 0's restore finished by itself: {host0_done}")
    finally:
        g.kill()
    assert (tmp_path / "checkpoints" / "4").is_dir(), "nothing is moved before the driver asks"

    g = _group(cluster, cfg, tmp_path)
    try:
        _, restored = g.form(skip_steps=[4])
        assert [r["restored_step"] for r in restored] == [2, 2]
        assert [(s["step"], s["moved_to"]) for s in restored[0]["skipped"]] == [
            (4, "4.corrupt-1")]
        g.call("compile")
        out = g.get([a.run_steps.remote(4, chunk=1, save_steps=[4], report=(i == 0))
                     for i, a in enumerate(g.actors)])
        assert [r["step"] for r in out] == [4, 4]
        assert [r["saved"] for r in out[0]["records"]] == [False, True]
        saved = g.call("save", wait=True)
        assert [s["committed_step"] for s in saved] == [4, 4]
        assert g.call("checkpoint_steps") == [[2, 4], [2, 4]]
    finally:
        g.kill()
    moved = tmp_path / "checkpoints" / "4.corrupt-1"
    assert sorted(p.name for p in moved.glob("state/ocdbt.process_1/d/*")) == [
        p.name for p in shards]


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
    stay there after the host actors are killed, and nothing is left for poll_events."""
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
            assert g.call("poll_events") == [[], []]
            instances = sorted(h.instance for h in g.plan.hosts)
            g.call("shutdown")
        g.kill()
        events = [queue.get(timeout=10), queue.get(timeout=10)]
    finally:
        g.kill()
        queue.shutdown()
    assert {e["kind"] for e in events} == {"preemption_notice"}
    assert sorted(e["target"]["host"] for e in events) == instances
