"""Errors no retry can fix, and exits the loop does not handle, on the fake seam: the run ends
FAILED with the host's message (never a restart loop) and the summary is always written."""

from __future__ import annotations

import json

import pytest

from orchestrator.controller import core
from orchestrator.controller.seam import Fatal, GroupFailed
from orchestrator.lifecycle import RunState
from tests.controller.harness import make

FIX = ("checkpoint step 10 was written by another model (d_model 64, this run 32). Fix: "
       "point checkpoint.dir at this model's checkpoints")


def test_a_fatal_error_while_forming_fails_the_run_without_restarting(tmp_path):
    sim = make(tmp_path)
    sim.fleet.form_failures.append(GroupFailed(Fatal(message=FIX, hosts=(0, 1))))
    summary = sim.run()
    assert summary.state == "FAILED" and summary.reason == FIX
    assert summary.restarts == {} and len(sim.fleet.groups) == 1
    assert sim.states()[-2:] == ["FORMING", "FAILED"]
    assert json.loads((sim.run_dir / "summary.json").read_text())["reason"] == FIX


def test_a_fatal_error_from_a_chunk_fails_the_run_without_restarting(tmp_path):
    sim = make(tmp_path)
    sim.fleet.on_step(7, lambda g: Fatal(message=FIX, hosts=(1,)))
    summary = sim.run()
    assert summary.state == "FAILED" and summary.reason == FIX and summary.restarts == {}
    assert sim.states()[-2:] == ["RUNNING", "FAILED"]
    assert all(g.shutdowns for g in sim.fleet.groups), "the group is torn down"


def test_system_exit_in_a_handler_still_writes_the_summary(tmp_path, monkeypatch):
    """``sys.exit`` deep in a handler (or a second Ctrl-C during teardown) is not an
    ``Exception``: the summary is written anyway and the exit goes on."""
    sim = make(tmp_path)

    def exits(run):
        raise SystemExit(3)

    monkeypatch.setitem(core.HANDLERS, RunState.COMPILING, exits)
    with pytest.raises(SystemExit):
        sim.run()
    written = json.loads((sim.run_dir / "summary.json").read_text())
    assert written["state"] == "FAILED" and "exiting" in written["reason"]
    assert sim.fleet.groups[0].shutdowns, "the group is torn down"


def test_a_save_committed_after_the_hosts_last_report_is_not_counted_lost(tmp_path):
    """Issue 51: a run that failed at step 13 with step 10's save committed on disk, but never
    reported (the chunk that carried it failed: a disk that filled), counted 10..13 as lost."""
    sim = make(tmp_path, "controller.checkpoint_interval.every_steps=1000")
    step = sim.run_dir / "checkpoints" / "10"
    (step / "meta").mkdir(parents=True)
    (step / "commit_success.txt").write_text("")
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    sim.fleet.on_step(13, lambda g: Fatal(message=FIX, hosts=(1,)))
    summary = sim.run()
    assert summary.state == "FAILED" and summary.last_committed_step == 10
    assert summary.unsaved_steps == summary.step - 10 and summary.lost_steps == summary.step - 10
