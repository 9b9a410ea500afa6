"""The controller's behaviour on the fake seam: every recovery hole of issue 11, by scenario."""

from __future__ import annotations

import json

import pytest

from orchestrator.controller.seam import GroupFailed, Hung
from tests.controller.fakes import lost
from tests.controller.harness import lose_slice_then_add_one, make


def test_happy_path_succeeds_and_writes_one_summary(tmp_path):
    """A run with no events trains to the target, saves at the policy's steps, succeeds."""
    sim = make(tmp_path)
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.step == 20 and summary.exit_code == 0
    assert sim.states() == ["PLANNING", "FORMING", "RESTORING", "COMPILING", "RUNNING",
                            "CHECKPOINTING", "SUCCEEDED"]
    assert [c["save_steps"] for c in sim.fleet.groups[0].chunks] == [[5], [10], [15], [20]]
    written = json.loads((sim.run_dir / "summary.json").read_text())
    assert written["state"] == "SUCCEEDED" and written["last_committed_step"] == 20


def test_a_save_only_started_is_not_recorded_as_committed(tmp_path):
    """Saves commit 3 steps after they start; a host dies at step 12 → the save of step 10 was
    only started, so the restore point (and the lost-step count) is step 5."""
    sim = make(tmp_path, commit_after=3)
    sim.fleet.on_step(12, lambda g: lost())
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    releasing = sim.payloads("RELEASING")[0]
    assert releasing.lost_steps == 12 - 5
    assert summary.restores[1]["restored_step"] == 5 and summary.lost_steps == 7


def test_operator_stop_ends_the_run_when_nothing_is_left_to_save(tmp_path):
    """A stop right after a committed save ends the run (it used to re-form and go on): STOPPED
    by the operator, with the exit code a stop event always had (1: autoresume as before)."""
    sim = make(tmp_path, "run.total_steps=100")
    sim.fleet.on_step(10, lambda g: sim.notice("operator_stop", deadline_in=None))
    summary = sim.run()
    assert summary.state == "STOPPED" and summary.step < 100
    assert "stop" in summary.reason and len(sim.fleet.groups) == 1
    assert sim.controller.lifecycle.timeline[-1].payload.by == "operator"
    assert (summary.stopped_by, summary.exit_code) == ("operator", 1)


def test_job_wide_notice_never_reforms_on_the_doomed_hosts(tmp_path):
    """A notice naming no host dooms every mesh host: the next mesh is on the spare slice."""
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host=None))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    first, second = sim.fleet.groups
    assert {h.slice_name for h in first.spec.plan.hosts} == {"s0"}
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s1"}
    assert summary.lost_steps == 0


def test_job_wide_notice_during_backoff_keeps_the_last_hosts_out(tmp_path):
    """A host dies, and while the run backs off a notice naming no host arrives: the job's
    last hosts are the ones going, so the next mesh is on the spare slice, not on them."""
    sim = make(tmp_path, "controller.warm.standby_slices=0", spare=("s1",))
    sim.fleet.on_step(7, lambda g: lost())
    sleep, sent = sim.clock.sleep, []

    def sleep_and_notice(seconds: float) -> None:
        if not sent and sim.controller.lifecycle.state.value == "BACKOFF":
            sent.append(sim.clock.now())
            sim.notice(host=None, id="job-wide-in-backoff")
        sleep(seconds)

    sim.clock.sleep = sleep_and_notice
    summary = sim.run()
    assert sent and summary.state == "SUCCEEDED"
    first, second = sim.fleet.groups[0], sim.fleet.groups[-1]
    assert {h.slice_name for h in first.spec.plan.hosts} == {"s0"}
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s1"}
    assert {"s0-h0", "s0-h1"} <= sim.controller.run_state.placement.excluded


def test_job_wide_maintenance_days_ahead_during_backoff_excludes_no_host(tmp_path):
    """The same in backoff, but for a window two days away: the hosts are fine until then, so
    the next mesh forms on them again (no spare is taken) and the run finishes there."""
    sim = make(tmp_path, "controller.warm.standby_slices=0", spare=("s1",))
    sim.fleet.on_step(7, lambda g: lost())
    sleep, sent = sim.clock.sleep, []

    def sleep_and_notice(seconds: float) -> None:
        if not sent and sim.controller.lifecycle.state.value == "BACKOFF":
            start = sim.clock.now() + 2 * 86400
            sent.append(start)
            sim.notice("maintenance_scheduled", host=None, deadline_in=None, id="mw-2d",
                       window_start=start, window_end=start + 3600)
        sleep(seconds)

    sim.clock.sleep = sleep_and_notice
    summary = sim.run()
    assert sent and summary.state == "SUCCEEDED"
    assert {h.slice_name for h in sim.fleet.groups[-1].spec.plan.hosts} == {"s0"}
    assert not {"s0-h0", "s0-h1"} & sim.controller.run_state.placement.excluded


def test_two_merged_notices_keep_the_earliest_deadline(tmp_path):
    sim = make(tmp_path, "cluster.emulate.hosts_per_slice=2", spare=("s1",))

    def two(g):
        sim.notice(host="vm-s0-0", deadline_in=300.0, id="late")
        sim.notice(host="vm-s0-1", deadline_in=20.0, id="early")

    sim.fleet.on_step(6, two)
    sim.run()
    draining = sim.payloads("DRAINING")[0]
    assert draining.deadline is not None
    assert abs(draining.deadline - (sim.fleet.groups[0].chunks[0] and draining.deadline)) < 1e-9
    deadlines = [e["event"]["deadline"] for e in sim.events()
                 if e.get("event", {}).get("id") in ("late", "early")]
    assert draining.deadline == min(deadlines)
    assert set(draining.doomed_hosts) == {"s0-h0", "s0-h1"}


def test_drain_waits_about_one_step_not_the_rest_of_the_chunk(tmp_path):
    """A notice mid-chunk raises the hosts' stop flag: the group stops at the next step."""
    sim = make(tmp_path, "run.steps_per_call=10", "controller.checkpoint_interval.every_steps=10",
               "controller.warm.handover_max_s=0",
               spare=("s1",))
    sim.fleet.on_step(3, lambda g: sim.notice(host="vm-s0-0"))
    sim.run()
    assert sim.payloads("DRAINING") and sim.controller.lifecycle.timeline
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert drain.step <= 5  # not 10: the chunk was cut at the next boundary


def test_notices_from_the_driver_owned_queue_survive_their_host(tmp_path):
    """A host pushes a notice and dies at once: the notice is still handled and recorded."""
    sim = make(tmp_path, spare=("s1",))

    def notice_then_die(g):
        g.queue.append({"schema_version": 1, "kind": "preemption_notice", "id": "md-1",
                        "target": {"job": "default", "host": "vm-s0-1"},
                        "deadline": sim.clock.now() + 30, "source": "metadata"})
        return lost(hosts=(1,))

    sim.fleet.on_step(8, notice_then_die)
    sim.run()
    recorded = [e for e in sim.events() if e.get("event", {}).get("id") == "md-1"
                or e.get("event_id") == "md-1"]
    assert recorded, "the metadata notice was lost with its host"
    assert "s0-h1" in sim.controller.run_state.placement.excluded


def test_an_error_escaping_the_loop_still_writes_the_summary(tmp_path):
    sim = make(tmp_path)
    sim.fleet.compile_error = RuntimeError("bug in a handler")
    summary = sim.run()
    assert summary.state == "FAILED" and "controller error" in summary.reason
    assert json.loads((sim.run_dir / "summary.json").read_text())["state"] == "FAILED"
    assert sim.fleet.groups[0].shutdowns  # torn down


def test_corrupt_latest_checkpoint_falls_back_and_counts_lost_steps(tmp_path):
    """The newest checkpoint is unreadable: restore the previous one, say so, count the loss."""
    sim = make(tmp_path, spare=("s1",))

    def corrupt_and_die(g):
        sim.fleet.disk.corrupt.add(15)
        return lost(hosts=(0,))

    sim.fleet.on_step(17, corrupt_and_die)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    restore = summary.restores[1]
    assert restore["restored_step"] == 10 and restore["skipped"][0]["step"] == 15
    assert summary.lost_steps == 7
    assert 10 in sim.fleet.disk.committed  # never deleted first
    assert "skipped unreadable" in next(t.reason for t in sim.controller.lifecycle.timeline
                                        if t.state.value == "COMPILING" and t.incarnation == 2)


def test_corrupt_checkpoint_the_group_cannot_skip_is_skipped_on_a_reform(tmp_path):
    sim = make(tmp_path)
    sim.fleet.disk.committed = [5, 10]
    sim.fleet.disk.corrupt = {10}
    sim.fleet.disk.corrupt_raises = True
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert summary.restores[0]["restored_step"] == 5
    assert sim.controller.run_state.placement.skip_steps == {10}


def test_a_hung_chunk_times_out_dumps_stacks_and_reforms(tmp_path):
    sim = make(tmp_path)

    def hang(g):
        g.hang = True

    sim.fleet.on_step(3, hang)
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.restarts == {"timeout": 1}
    assert list((sim.run_dir / "diagnostics").glob("stacks-step-*"))


def test_restart_budget_exhausted_fails_with_the_cause(tmp_path):
    sim = make(tmp_path, "controller.budgets.host_lost=1")
    sim.fleet.on_step(3, lambda g: lost())
    sim.fleet.on_step(4, lambda g: lost())
    summary = sim.run()
    assert summary.state == "FAILED"
    assert sim.controller.lifecycle.timeline[-1].payload.cause.value == "host_lost"


def test_failure_during_forming_releases_and_backs_off(tmp_path):
    sim = make(tmp_path)
    sim.fleet.form_failures.append(GroupFailed(Hung(phase="init", hosts=(1,), seconds=5)))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert ("FORMING", "RELEASING") in sim.edges() and ("RELEASING", "BACKOFF") in sim.edges()


@pytest.mark.parametrize("commit_after", [0, 3])
def test_capacity_wait_then_grow_back_when_a_slice_returns(tmp_path, commit_after):
    """Two slices, one lost for good: shrink to one; when a new slice appears, grow back at a
    save step, also when async saves commit steps later than the chunk ends."""
    sim = make(tmp_path, "cluster.emulate.slices=2", "run.total_steps=60",
               "controller.elastic.min_resize_interval_s=0", slices=("s0", "s1"),
               commit_after=commit_after)
    lose_slice_then_add_one(sim)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    sizes = [g.spec.plan.num_slices for g in sim.fleet.groups]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2
    assert summary.restores[-1]["lost_steps"] == 0  # the grow itself loses nothing
    grow_drain = [t for t in sim.controller.lifecycle.timeline
                  if t.state.value == "DRAINING" and "grow" in t.reason]
    assert grow_drain and grow_drain[0].step % 5 == 0


def test_operator_stop_while_waiting_for_capacity_ends_the_run(tmp_path):
    sim = make(tmp_path, "controller.elastic.enabled=false", "controller.backoff.base_s=0")

    def lose_all(g):
        sim.cluster.remove("s0-h1")
        sim.notice("operator_stop", deadline_in=None)
        return lost(hosts=(1,), nodes=frozenset({"s0-h1"}))

    sim.fleet.on_step(4, lose_all)
    summary = sim.run()
    assert summary.state == "STOPPED" and "stop" in summary.reason
    assert ("WAITING_FOR_CAPACITY", "STOPPED") in sim.edges()


def test_ctrl_c_fails_cleanly_with_a_summary(tmp_path):
    sim = make(tmp_path)

    def interrupt(g):
        raise KeyboardInterrupt

    sim.fleet.on_step(4, interrupt)
    summary = sim.run()
    assert summary.state == "FAILED" and "interrupted" in summary.reason
    assert sim.fleet.groups[0].shutdowns == [False]


def test_unhealthy_host_is_cordoned_for_good(tmp_path):
    sim = make(tmp_path, "controller.health.cordon_after=1", spare=("s1",))
    sim.fleet.on_step(6, lambda g: sim.notice("host_unhealthy", host="vm-s0-1",
                                              deadline_in=None))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert "s0-h1" in sim.controller.run_state.placement.cordoned
    assert all("s0-h1" not in {h.node_id for h in g.spec.plan.hosts}
               for g in sim.fleet.groups[1:])


def test_chaos_plugin_arms_faults_in_hosts_without_core_branches(tmp_path):
    sim = make(tmp_path, "controller.chaos=[{at_step: 7, host: 1, kind: kill}]")
    sim.fleet.on_step(8, lambda g: lost() if (1, {"at_step": 7, "kind": "kill"}) in g.injected
                      else None)
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.restarts == {"host_lost": 1}


def test_scheduled_maintenance_drains_at_a_step_of_its_choosing(tmp_path):
    """A window days ahead is not a 60 s notice: the drain lands maintenance_lead_s before it."""
    sim = make(tmp_path, "run.total_steps=100", "run.steps_per_call=10",
               "controller.checkpoint_interval.every_steps=10", spare=("s1",))

    def schedule(g):
        start = sim.clock.now() + 600.0 + 5.0  # 5 s of steps (50 at 0.1 s) before the lead
        sim.notice("maintenance_scheduled", host="vm-s0-0", deadline_in=None,
                   window_start=start, window_end=start + 3600)

    sim.fleet.on_step(10, schedule)
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert 50 <= drain.step <= 62, drain.step
    assert drain.payload.cause.value == "maintenance"


def test_topology_is_written_for_explain_and_instance_ids_reach_the_intake(tmp_path):
    """explain --topology RUN_DIR sees the mesh the run formed, with the hosts' id map."""
    from orchestrator.controller.seam import Formed
    from orchestrator.events.explain import load_topology

    sim = make(tmp_path)
    sim.fleet.formed_instance_ids = {"123456789": "vm-s0-1"}
    sim.run()
    topo = load_topology(sim.run_dir)
    assert [h.instance for h in topo.hosts] == ["vm-s0-0", "vm-s0-1"]
    assert topo.id_to_name == {"123456789": "vm-s0-1"} and topo.job == "default"
    assert sim.intake.id_to_name == {"123456789": "vm-s0-1"}
    assert Formed(hosts=1).instance_ids == {}


def test_a_maintenance_drain_outlives_an_unrelated_failure_before_its_step(tmp_path):
    """Found by the fleet simulator: a failure replaced the pending drain_at_step, and the
    window then took the slice from a running mesh. The notice is now decided again on the
    re-formed mesh and still drains before the window."""
    sim = make(tmp_path, "controller.warm.standby_slices=0", "run.total_steps=120",
               "run.steps_per_call=10", "controller.checkpoint_interval.every_steps=10",
               spare=("s1",))

    def schedule(g):
        start = sim.clock.now() + 600.0 + 8.0  # ~80 steps at 0.1 s before the lead
        sim.notice("maintenance_scheduled", host="vm-s0-0", deadline_in=None,
                   window_start=start, window_end=start + 3600)

    sim.fleet.on_step(10, schedule)
    sim.fleet.on_step(25, lambda g: lost(hosts=(1,)))
    summary = sim.run()
    assert summary.state == "SUCCEEDED", summary.reason
    drains = [t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING"]
    assert [d.payload.cause.value for d in drains] == ["maintenance"]
    actions = [e.get("action") for e in sim.events() if e.get("decision") == "action"]
    assert "deferred" in actions and actions.count("drain_at_step") == 2, actions
