"""The standing-cluster goodput figure's pure parts: the cloud's drains, reclaims and
replacements (against seams, no cluster), which slice a job trains on, the systems' command
lines, relative goodput; and ``events.ray_drains``, the switch that makes the full restart deaf
to drains. The cluster side (``add_slice`` / ``remove_slice``) runs in
``tests/production/test_try_locally.py`` on the README block's real cluster."""

from __future__ import annotations

import json

import pytest

from bench import standing, standing_cloud
from orchestrator.cluster import local
from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError


class FakeCluster:
    """What ``StandingCloud`` calls in ``orchestrator.cluster.local``, in memory."""

    def __init__(self) -> None:
        self.slices = {f"local-slice-{s}": [{"instance": f"local-slice-{s}-w{w}",
                                              "node_id": f"n{s}{w}", "worker": str(w)}
                                             for w in range(2)] for s in range(2)}
        self.drained: list[tuple[str, float]] = []

    def install(self, monkeypatch) -> None:
        state = local.ClusterState(url="u", gcs_address="127.0.0.1:1", temp_dir="/tmp/x",
                                   token_path="t", auth=False,
                                   shape={"slices": 2, "hosts_per_slice": 2,
                                          "devices_per_host": 2})
        monkeypatch.setattr(local, "load_state", lambda _d: state)
        monkeypatch.setattr(local, "slice_nodes", lambda _s: dict(self.slices))
        monkeypatch.setattr(local, "remove_slice",
                            lambda name, state_dir: [h["instance"] for h in self.slices.pop(name)])

        def add(name, state_dir):
            self.slices[name] = [{"instance": f"{name}-w{w}", "node_id": f"{name}{w}",
                                  "worker": str(w)} for w in range(2)]
        monkeypatch.setattr(local, "add_slice", add)
        monkeypatch.setattr(standing_cloud, "drain_node", lambda _gcs, node, deadline: (
            self.drained.append((node, deadline)) or (True, "")))


def test_a_preemption_drains_every_host_then_reclaims_at_the_deadline_and_replaces(
        monkeypatch, tmp_path):
    fake = FakeCluster()
    fake.install(monkeypatch)
    cloud = standing_cloud.StandingCloud(state_dir=tmp_path, deadline_s=30.0,
                                         replace_after_s=60.0, slices=2)
    rec = cloud.preempt("local-slice-0", now=1000.0)
    assert fake.drained == [("n00", 1030.0), ("n01", 1030.0)]
    assert rec["deadline"] == 1030.0 and all(d["accepted"] for d in rec["drains"])
    assert cloud.healthy() == ["local-slice-1"]  # a draining slice takes no new job
    cloud.tick(1029.0)
    assert "local-slice-0" in fake.slices
    cloud.tick(1030.0)
    assert sorted(fake.slices) == ["local-slice-1"]
    cloud.tick(1089.0)
    assert sorted(fake.slices) == ["local-slice-1"]
    cloud.tick(1090.0)
    for t in cloud._joins:
        t.join(5)
    assert sorted(fake.slices) == ["local-slice-1", "local-slice-2"]  # a new name
    assert [e["event"] for e in cloud.log] == ["preempt", "reclaim", "replace", "joined"]


def test_restore_reclaims_what_is_pending_and_refills_to_the_healthy_count(monkeypatch,
                                                                           tmp_path):
    fake = FakeCluster()
    fake.install(monkeypatch)
    cloud = standing_cloud.StandingCloud(state_dir=tmp_path, deadline_s=30.0,
                                         replace_after_s=60.0, slices=2)
    cloud.preempt("local-slice-1", now=0.0)
    cloud.restore()
    assert sorted(fake.slices) == ["local-slice-0", "local-slice-2"]
    assert cloud.healthy() == ["local-slice-0", "local-slice-2"]


def test_a_removed_slice_that_ray_still_lists_alive_is_not_healthy(monkeypatch, tmp_path):
    """Ray's node table lists a SIGKILLed node alive until its health checks fail: the cloud
    does not count it, and restore waits until Ray no longer lists it."""
    fake = FakeCluster()
    fake.install(monkeypatch)
    ghost = {}
    monkeypatch.setattr(local, "remove_slice", lambda name, state_dir: ghost.setdefault(
        name, [h["instance"] for h in fake.slices[name]]))  # killed, still listed
    cloud = standing_cloud.StandingCloud(state_dir=tmp_path, deadline_s=30.0,
                                         replace_after_s=60.0, slices=2)
    cloud.preempt("local-slice-1", now=0.0)
    cloud.tick(30.0)
    assert cloud.healthy() == ["local-slice-0"]
    monkeypatch.setattr(standing_cloud.time, "sleep", lambda s: fake.slices.pop(
        "local-slice-1", None))  # Ray notices the death while restore waits
    cloud.restore()
    assert cloud.healthy() == ["local-slice-0", "local-slice-2"]


def test_the_training_slice_is_the_newest_alive_one_of_the_timeline_or_rank_1s(
        monkeypatch, tmp_path):
    fake = FakeCluster()
    fake.install(monkeypatch)
    cloud = standing_cloud.StandingCloud(state_dir=tmp_path, deadline_s=30.0,
                                         replace_after_s=60.0, slices=2)
    settings = standing.Settings()
    orch = standing.System(name="orchestrator", workdir=tmp_path / "o", settings=settings,
                           jobs=None)
    orch.workdir.mkdir()
    (orch.workdir / "timeline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in [
        {"slices": ["local-slice-0"]}, {"slices": ["local-slice-1"]}, {"slices": []}]))
    assert orch.training_slice(cloud) == "local-slice-1"
    fake.slices.pop("local-slice-1")
    assert orch.training_slice(cloud) == "local-slice-0"
    rt = standing.System(name="ray_train", workdir=tmp_path / "r", settings=settings, jobs=None)
    (rt.workdir / "nodes").mkdir(parents=True)
    (rt.workdir / "nodes" / "rank0").write_text("n00")
    (rt.workdir / "nodes" / "rank1").write_text("gone")
    assert rt.training_slice(cloud) == "local-slice-0"  # rank 1's node is gone: rank 0's


def test_the_full_restart_is_deaf_to_drains_and_the_orchestrator_runs_its_defaults(tmp_path):
    settings = standing.Settings()
    orch = standing.System(name="orchestrator", workdir=tmp_path, settings=settings, jobs=None)
    restart = standing.System(name="full_restart", workdir=tmp_path, settings=settings,
                              jobs=None)
    for flag in ("events.ray_drains=false", "controller.budgets.host_lost=0",
                 "controller.warm.standby_slices=0", "checkpoint.ram.enabled=false"):
        assert flag in restart.entrypoint() and flag not in orch.entrypoint()
    for system in (orch, restart):  # every override is one the driver accepts
        overrides = system.entrypoint().split("--log-format json ")[1].split()
        load_config(None, overrides)
    rt = standing.System(name="ray_train", workdir=tmp_path, settings=settings, jobs=None)
    assert "--address auto" in rt.entrypoint()
    assert rt.env_vars()["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "1"


def test_relative_goodput_pairs_each_disturbed_window_with_its_undisturbed_twin():
    """Relative goodput in productive time (the headline) and at the median step."""
    runs = [{"system": "orchestrator", "repeat": 0, "disturbed": True, "goodput": 0.70,
             "useful_step_time_share": 0.80, "steps_lost": 0, "preemptions": 2},
            {"system": "orchestrator", "repeat": 0, "disturbed": False, "goodput": 0.72,
             "useful_step_time_share": 0.82, "steps_lost": 0, "preemptions": 0},
            {"system": "ray_train", "repeat": 0, "disturbed": True, "goodput": 0.40,
             "useful_step_time_share": 0.45, "steps_lost": 30, "preemptions": 2},
            {"system": "ray_train", "repeat": 0, "disturbed": False, "goodput": None,
             "error": "boom"}]
    figures = standing.relative(runs)
    orch = figures["orchestrator"]
    assert orch["relative_goodput"] == pytest.approx(0.80 / 0.82)
    assert orch["relative_goodput_median_step"] == pytest.approx(0.70 / 0.72)
    assert (orch["goodput"], orch["undisturbed_goodput"]) == (0.80, 0.82)
    assert figures["ray_train"]["relative_goodput"] is None  # no twin: no ratio
    assert figures["ray_train"]["goodput"] == 0.45
    assert "full_restart" not in figures
    text = standing.table({"settings": vars(standing.Settings()), "validity": {"valid": True},
                           "figures": figures})
    assert "| orchestrator | 0.8 | 0.82 | **0.976** | 0.7 / 0.72 = 0.972 |" in text


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown systems"):
        standing.Settings(systems=("orchestrator", "slurm"))
    with pytest.raises(ValueError, match="spare"):
        standing.Settings(slices=1)


def test_ray_drains_is_a_boolean_setting():
    assert load_config(None, []).events.ray_drains is True
    assert load_config(None, ["events.ray_drains=false"]).events.ray_drains is False
    with pytest.raises(ConfigError, match=r"events\.ray_drains"):
        load_config(None, ["events.ray_drains=sometimes"])


def test_a_system_still_restarting_at_the_window_end_counts_its_checkpoint_not_its_last_step():
    recs = [{"step": s, "step_time_s": 0.1, "wall_time": 100.0 + s} for s in range(1, 81)]
    base = standing.summarize(recs, t0=0.0, seconds=300.0, skip=0)
    assert base["useful_steps"] == 80
    killed = [{"deadline": 190.0}]  # its slice went at 190 s and it has not stepped since
    out = dict(base)
    standing.down_at_end(out, recs, killed, [25, 50, 75, 100], end=300.0)
    assert out["down_at_end"] and out["useful_steps"] == 75 and out["steps_lost"] == 5
    assert out["goodput"] == pytest.approx(75 * 0.1 / 300.0)
    alive = dict(base)  # it stepped after the reclaim: its last step stands
    standing.down_at_end(alive, recs, [{"deadline": 150.0}], [50], end=300.0)
    assert not alive["down_at_end"] and alive["useful_steps"] == 80
