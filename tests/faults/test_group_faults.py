"""Announced and unannounced faults on one shared emulated cluster: two 2-host slices.

Runs use one slice (1 × 2 hosts × 2 devices) and keep the other as the replacement, except where
a test needs both. No test here removes a node (those have their own cluster), so the cluster is
shared by the whole module. Faults come from the deterministic chaos schedule keyed by
(host, step), or, for duplicate and late notices, through a real EventIntake. Each test asserts
the steps reached and what was lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

from orchestrator.controller_config import ChaosFaultConfig
from orchestrator.events.intake import EventIntake
from tests.faults.harness import (
    Action,
    alive_host_processes,
    fault_config,
    print_recovery,
    run_controller,
    started_cluster,
)
from tests.support.ray_cluster import RunningCluster

pytestmark = pytest.mark.cluster

@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=2, hosts_per_slice=2, devices_per_host=2) as running:
        yield running


def _checkpoint_steps(run_dir) -> list[int]:
    """Complete Orbax steps on disk (in-progress saves live in temporary directories)."""
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def _restored(result) -> list[int | None]:
    return [r["restored_step"] for r in result.controller.restores]


# ---- announced ---------------------------------------------------------------------------


def test_notice_for_one_host_reforms_on_spare_with_bit_identical_params(cluster, tmp_path):
    """Preempt 1 host of a 2-host slice: 0 lost steps, params equal an uninterrupted run's."""
    plain = run_controller(fault_config(tmp_path / "plain"), collect_params=True)
    assert plain.summary.state == "SUCCEEDED"
    assert plain.summary.step == 20

    chaos = [ChaosFaultConfig(at_step=8, host=1, kind="preempt", deadline_s=60)]
    hit = run_controller(fault_config(tmp_path / "hit", chaos=chaos), collect_params=True)
    print_recovery("announced", hit)

    s = hit.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    assert s.restarts == {"spot_preemption": 1}
    assert "DRAINING" in hit.states and "CHECKPOINTING" in hit.states
    assert _restored(hit) == [None, 8]
    slices = {tuple(t["slices"]) for t in hit.timeline if t["state"] == "RUNNING"}
    assert len(slices) == 2, "the second incarnation must run on the spare slice"
    assert plain.final_params is not None and hit.final_params is not None
    assert plain.final_params.keys() == hit.final_params.keys()
    for k, v in plain.final_params.items():
        np.testing.assert_array_equal(v, hit.final_params[k], err_msg=k)


def test_deadline_shorter_than_a_save_falls_back_and_counts_lost_steps(cluster, tmp_path):
    """A 50 ms notice at step 8: no save (policy: fallback), restore step 5, 3 steps lost."""
    chaos = [ChaosFaultConfig(at_step=8, host=1, kind="preempt", deadline_s=0.05)]
    result = run_controller(fault_config(tmp_path / "run", chaos=chaos))

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 3)
    assert s.restarts == {"spot_preemption": 1}
    assert _restored(result) == [None, 5]
    i = result.states.index("DRAINING")
    assert result.states[i + 1] == "RELEASING", "fallback skips the save"
    assert "falling back to step 5, losing 3 step(s)" in result.timeline[i + 1]["reason"]


def test_notices_for_every_host_duplicates_and_late_notices_via_the_intake(cluster, tmp_path):
    """Notices for both hosts at once + a duplicate: one drain, 0 lost; a late one: stale."""
    cfg = fault_config(tmp_path / "run")
    intake = EventIntake(cfg.events, run_dir=tmp_path / "run", job=cfg.run.name)
    intake.start()

    def notice(ctl, host: int, event_id: str, deadline_in_s: float) -> dict:
        return {"schema_version": 1, "kind": "preemption_notice", "id": event_id,
                "target": {"job": cfg.run.name, "host": ctl.plan.hosts[host].instance},
                "deadline": time.time() + deadline_in_s, "source": "test"}

    def every_host(ctl) -> None:
        for payload in (notice(ctl, 0, "ev-h0", 60), notice(ctl, 1, "ev-h1", 60),
                        notice(ctl, 0, "ev-h0", 60)):
            intake.submit(payload, source="test")

    def late(ctl) -> None:
        intake.submit(notice(ctl, 0, "ev-late", -5), source="test")

    try:
        result = run_controller(cfg, intake=intake, actions=[
            Action(step=6, name="notices for every host + duplicate", fn=every_host),
            Action(step=13, name="late notice", fn=late)])
    finally:
        intake.close()

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    assert s.restarts == {"spot_preemption": 1}, "one drain for all notices"
    first, second = {tuple(t["slices"]) for t in result.timeline if t["state"] == "RUNNING"}
    assert not set(first) & set(second), "every host was doomed: the whole slice is replaced"
    records = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text()
               .splitlines()]
    decided = [(r["event"]["id"], r["decision"]) for r in records if "event" in r]
    assert decided == [("ev-h0", "accepted"), ("ev-h1", "accepted"), ("ev-h0", "duplicate"),
                       ("ev-late", "stale")]
    actions = [(r["event_id"], r["action"]) for r in records if r["decision"] == "action"]
    assert ("ev-h0", "drain") in actions and ("ev-h1", "merged") in actions
    assert not any(e == "ev-late" for e, _ in actions), "a stale notice causes no action"


# ---- unannounced -------------------------------------------------------------------------


def test_kill_mid_step_and_kill_during_async_save_restore_last_complete_checkpoint(
        cluster, tmp_path):
    """kill -9 of host 1 before step 8, then right after step 15's async save started."""
    chaos = [ChaosFaultConfig(at_step=7, host=1, kind="kill"),
             ChaosFaultConfig(at_step=15, host=1, kind="kill_in_save")]
    result = run_controller(fault_config(tmp_path / "run", chaos=chaos))
    print_recovery("unannounced", result)

    s = result.summary
    assert (s.state, s.step) == ("SUCCEEDED", 20)
    assert s.restarts == {"host_lost": 2}
    assert _restored(result) == [None, 5, 10], "step 15's save never completed: restore 10"
    lost = [r["lost_steps"] for r in result.controller.restores]
    assert lost == [0, 2, 5]
    assert s.lost_steps == 7
    assert all(n <= 5 for n in lost), "lost steps <= the checkpoint interval"


def test_budget_runs_out_fails_with_reason_and_intact_checkpoint(cluster, tmp_path):
    """host_lost budget 0: the first kill ends the run FAILED; step 5 stays on disk."""
    chaos = [ChaosFaultConfig(at_step=7, host=1, kind="kill")]
    result = run_controller(fault_config(tmp_path / "run", "controller.budgets.host_lost=0",
                                         chaos=chaos))
    s = result.summary
    assert s.state == "FAILED"
    assert "exceeds the budget of 0" in s.reason and "controller.budgets.host_lost" in s.reason
    assert _checkpoint_steps(tmp_path / "run") == [5]
    assert alive_host_processes(result.host_pids) == []


def test_replacement_that_never_arrives_fails_with_reason(cluster, tmp_path):
    """Both slices in use, one preempted, elastic off, 3 s wait: FAILED, step 8 saved."""
    chaos = [ChaosFaultConfig(at_step=8, host=3, kind="preempt", deadline_s=60)]
    cfg = fault_config(tmp_path / "run", "cluster.emulate.slices=2",
                       "controller.elastic.enabled=false",
                       "controller.max_wait_for_capacity_s=3", chaos=chaos)
    result = run_controller(cfg)
    s = result.summary
    assert s.state == "FAILED"
    assert "no replacement for 1 slice(s)" in s.reason
    assert "controller.max_wait_for_capacity_s" in s.reason
    assert "WAITING_FOR_CAPACITY" in result.states
    assert _checkpoint_steps(tmp_path / "run")[-1] == 8
    assert alive_host_processes(result.host_pids) == []


def test_host_that_never_joins_init_times_out_and_is_retried(cluster, tmp_path):
    """Host 1 hangs in distributed init: bounded by timeouts.init_s, stacks dumped, retried."""
    chaos = [ChaosFaultConfig(at_step=0, host=1, kind="hang_init")]
    result = run_controller(fault_config(tmp_path / "run", "timeouts.init_s=20", chaos=chaos))
    print_recovery("init-hang", result)

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    assert s.restarts == {"timeout": 1}
    assert "BACKOFF" in result.states
    dumps = list((tmp_path / "run" / "diagnostics").glob("stacks-init-*.txt"))
    assert len(dumps) == 1
    assert "_maybe_init_fault" in dumps[0].read_text(), "the hung host's stack is in the dump"
    assert alive_host_processes(result.host_pids) == []
