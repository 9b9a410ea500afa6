"""SIGTERM drains (issue 28, item 4): the driver's handler only sets a flag; the controller takes
it at its next poll, stops at the next step boundary, saves that step durably and ends the run
STOPPED (issue 53, item 6: it was FAILED) with exit code 143, saying so. A second signal stops at
once (FAILED: the drain asked for was cut short) and counts what it discards."""

from __future__ import annotations

import json

from orchestrator.controller.seam import GroupFailed
from orchestrator.driver.signals import EXIT_SIGTERM, StopRequest
from orchestrator.lifecycle import Stopped
from tests.controller.fakes import lost
from tests.controller.harness import make

NEVER = "controller.checkpoint_interval.every_steps=1000"  # no periodic save would hide a loss


class Flag:
    """What ``StopSignals.request`` returns: None until the signal came."""

    def __init__(self) -> None:
        self.req: StopRequest | None = None

    def __call__(self) -> StopRequest | None:
        return self.req

    def term(self, at: float = 0.0) -> None:
        self.req = StopRequest(signal="SIGTERM", at=at)


def sim_with_flag(tmp_path, *overrides, **kw):
    sim = make(tmp_path, NEVER, *overrides, **kw)
    flag = Flag()
    sim.controller.run_state.stop_request = flag
    return sim, flag


def test_sigterm_mid_run_saves_the_step_it_stopped_at_and_exits_143(tmp_path):
    """The clean drain ends STOPPED, not FAILED: in the lifecycle, summary.json and the
    printed summary, with the signal as the Stopped payload's ``by``."""
    sim, flag = sim_with_flag(tmp_path)
    sim.fleet.on_step(7, lambda g: flag.term())
    summary = sim.run()
    assert sim.states()[-4:] == ["DRAINING", "CHECKPOINTING", "RELEASING", "STOPPED"]
    assert summary.state == "STOPPED" and summary.exit_code == EXIT_SIGTERM == 143
    assert json.loads((sim.run_dir / "summary.json").read_text())["state"] == "STOPPED"
    assert sim.controller.lifecycle.timeline[-1].payload == Stopped(reason=summary.reason,
                                                                    by="SIGTERM")
    assert summary.as_text(sim.run_dir).startswith("Run STOPPED: stopped by SIGTERM after")
    assert summary.stopped_by == "SIGTERM"
    assert 7 <= summary.step <= 9 and summary.last_committed_step == summary.step
    assert summary.step in sim.fleet.disk.committed
    assert summary.lost_steps == 0 and summary.unsaved_steps == 0
    assert f"stopped by SIGTERM after saving step {summary.step}" in summary.reason
    assert sim.fleet.groups[0].chunks[-1]["until"] > summary.step  # stopped mid-chunk


def test_sigterm_with_the_ram_tier_still_saves_durably(tmp_path):
    """The run ends: a RAM hand-over could die with the cluster, so the stop saves from the
    devices (never RAM-first)."""
    sim, flag = sim_with_flag(tmp_path, "checkpoint.ram.enabled=true")
    sim.fleet.on_step(7, lambda g: flag.term())
    summary = sim.run()
    assert sim.fleet.persisted == [] and summary.step in sim.fleet.disk.committed
    assert summary.exit_code == 143 and summary.lost_steps == 0


def test_sigterm_while_no_group_runs_stops_at_once_and_counts_the_unsaved_steps(tmp_path):
    """SIGTERM in BACKOFF after a host died at step 8 (committed 5): nothing to save; the run
    ends at once with the 3 steps past the checkpoint counted as lost (was 0)."""
    sim, flag = sim_with_flag(tmp_path, "controller.checkpoint_interval.every_steps=5",
                              "controller.backoff.base_s=30", "controller.backoff.max_s=30")
    sim.fleet.on_step(8, lambda g: (flag.term(), lost())[1])  # taken at BACKOFF's first poll
    summary = sim.run()
    assert sim.states()[-2:] == ["BACKOFF", "STOPPED"]
    assert summary.exit_code == 143 and summary.stopped_by == "SIGTERM"
    assert summary.last_committed_step == 5 and summary.unsaved_steps == 3
    assert summary.lost_steps == 3


def test_a_second_signal_during_the_drain_stops_now_and_counts_the_loss(tmp_path):
    """The second signal raises KeyboardInterrupt in the driver (here: inside the save): stop
    now, FAILED, exit 143, the steps past the last commit counted as lost."""
    sim, flag = sim_with_flag(tmp_path, "controller.checkpoint_interval.every_steps=5")
    sim.fleet.on_step(7, lambda g: flag.term())
    sim.fleet.save_failures.append(KeyboardInterrupt("signal SIGTERM"))  # type: ignore[arg-type]
    summary = sim.run()
    assert sim.states()[-2:] == ["CHECKPOINTING", "FAILED"]
    assert summary.exit_code == 143 and summary.stopped_by == "SIGTERM"
    assert summary.last_committed_step == 5
    assert summary.unsaved_steps == summary.step - 5 > 0
    assert summary.lost_steps == summary.unsaved_steps
    assert "second signal" in summary.reason


def test_sigterm_joins_a_drain_under_way_and_keeps_its_hosts_out(tmp_path):
    """A preemption drain is pending when SIGTERM comes: one drain, one save, then the stop;
    the notice is settled as stopped, with its host (kept out by the next driver)."""
    sim, flag = sim_with_flag(tmp_path, "controller.warm.handover_max_s=0", spare=("s1",))
    sim.fleet.on_step(6, lambda g: sim.notice(host="vm-s0-1", deadline_in=60.0, id="n1"))
    sim.fleet.on_step(6, lambda g: flag.term())
    summary = sim.run()
    assert summary.exit_code == 143 and len(sim.fleet.groups) == 1
    assert summary.last_committed_step == summary.step
    outcomes = [(e["action"], e["details"].get("hosts")) for e in sim.events()
                if e.get("event_id") == "n1" and e.get("outcome")]
    assert outcomes == [("stopped", ["s0-h1"])]


def test_a_failed_save_of_the_stop_is_recovered_like_the_final_save(tmp_path):
    """A host lost during the SIGTERM save: the stop holds (no re-form), the run ends with the
    loss counted."""
    sim, flag = sim_with_flag(tmp_path, "controller.checkpoint_interval.every_steps=5",
                              spare=("s1",))
    sim.fleet.on_step(7, lambda g: flag.term())
    sim.fleet.save_failures.append(GroupFailed(lost()))
    summary = sim.run()
    assert summary.state == "STOPPED" and summary.exit_code == 143
    assert len(sim.fleet.groups) == 1  # stopping: never re-formed
    assert summary.lost_steps == summary.step - 5 > 0


def test_sigterm_while_the_group_forms_stops_before_compiling(tmp_path):
    """Issue 51: a SIGTERM during FORMING or RESTORING acted only once RUNNING started (after a
    compile, minutes on a TPU, and a step). With nothing restored past the durable checkpoint
    there is nothing to save: the group is released at once, the run STOPPED, exit 143."""
    sim, flag = sim_with_flag(tmp_path)
    sim.fleet.on_phase("form", lambda g: flag.term())
    summary = sim.run()
    assert sim.states()[-4:] == ["RESTORING", "COMPILING", "RELEASING", "STOPPED"]
    assert "RUNNING" not in sim.states() and summary.compiles == []
    assert sim.fleet.groups[0].chunks == []
    assert summary.exit_code == 143 and summary.stopped_by == "SIGTERM"
    assert summary.step == 0 and summary.lost_steps == 0


def test_sigterm_while_restoring_the_durable_step_stops_there(tmp_path):
    """A restarted driver restoring step 10 from the durable tier: stopped at 10, no compile."""
    sim, flag = sim_with_flag(tmp_path)
    sim.fleet.disk.committed.append(10)
    sim.fleet.on_phase("restore", lambda g: flag.term())
    summary = sim.run()
    assert sim.states()[-3:] == ["COMPILING", "RELEASING", "STOPPED"]
    assert summary.compiles == [] and summary.step == 10 == summary.last_committed_step
    assert summary.exit_code == 143 and summary.lost_steps == 0


def test_sigterm_while_restoring_a_newer_ram_step_still_saves_it(tmp_path):
    """Restored from the RAM tier past the durable step: the run trains on to the next step
    boundary and drains, so the RAM-only steps are saved durably before it stops."""
    sim, flag = sim_with_flag(tmp_path, "checkpoint.ram.enabled=true")
    sim.fleet.disk.committed.append(10)
    sim.fleet.ram_copies.append(14)
    sim.fleet.on_phase("restore", lambda g: flag.term())
    summary = sim.run()
    assert "DRAINING" in sim.states() and "CHECKPOINTING" in sim.states()
    assert summary.state == "STOPPED" and summary.last_committed_step >= 14
    assert summary.lost_steps == 0


def test_a_recovery_the_run_ended_inside_is_in_the_summary_marked_open(tmp_path):
    """Issue 51 (the soak): a SIGTERM while the run backed off after a host died left that
    recovery out of summary.json (only closed ones were written)."""
    sim, flag = sim_with_flag(tmp_path, "controller.checkpoint_interval.every_steps=5",
                              "controller.backoff.base_s=30", "controller.backoff.max_s=30")
    sim.fleet.on_step(8, lambda g: (flag.term(), lost())[1])
    summary = sim.run()
    [r] = json.loads((sim.run_dir / "summary.json").read_text())["recoveries"]
    assert (r["kind"], r["cause"], r["open"], r["ended_in"]) == (
        "unannounced", "host_lost", True, "STOPPED")
    assert "to_first_step_s" not in r and "first_step_at" not in r
    assert "open when the run ended (STOPPED)" in summary.as_text(sim.run_dir)
