"""Honest numbers (issue 28, item 9): lost steps count what a run's end discards, the timeline
marks its pre-restore estimates as such beside the outcome, and a resume names the steps whose
records metrics.jsonl never got."""

from __future__ import annotations

import json

from orchestrator.controller.seam import Fatal, GroupFailed
from tests.controller.fakes import lost
from tests.controller.harness import make


def _restore_from_ram_at(sim, step: int) -> None:
    """The RAM tier holds ``step`` (newer than the durable commit) when a host dies there."""
    def die(g):
        sim.fleet.ram_copies.append(step)
        return lost()

    sim.fleet.on_step(step, die)


def test_estimates_are_marked_and_the_restore_records_what_it_lost(tmp_path):
    """Killed at step 8 with step 5 durable and step 8 in RAM: RELEASING estimates 3 lost and
    RESTORING expects step 5 (both ``estimated``); COMPILING says step 8 came from RAM, 0
    lost, as the summary does."""
    sim = make(tmp_path, "controller.checkpoint_interval.every_steps=5",
               "controller.backoff.base_s=0.1", spare=("s1",))
    _restore_from_ram_at(sim, 8)
    summary = sim.run()
    releasing = sim.payloads("RELEASING")[0]
    restoring = sim.payloads("RESTORING")[1]
    compiling = sim.payloads("COMPILING")[1]
    assert (releasing.lost_steps, releasing.estimated) == (3, True)
    assert (restoring.step, restoring.estimated) == (5, True)
    assert (compiling.tier, compiling.restored_step, compiling.lost_steps) == ("ram", 8, 0)
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    lines = (sim.run_dir / "timeline.jsonl").read_text().splitlines()
    line = next(json.loads(x) for x in lines if '"Releasing"' in x)
    assert line["payload"]["estimated"] is True


def test_a_restore_that_rolls_back_records_the_loss_where_it_happens(tmp_path):
    sim = make(tmp_path, "controller.checkpoint_interval.every_steps=5",
               "controller.backoff.base_s=0.1", spare=("s1",))
    sim.fleet.on_step(8, lambda g: lost())
    summary = sim.run()
    compiling = sim.payloads("COMPILING")[1]
    assert (compiling.restored_step, compiling.lost_steps) == (5, 3)
    assert summary.lost_steps == 3 and summary.recoveries[0]["lost_steps"] == 3


def test_a_failed_final_save_counts_the_steps_it_discards(tmp_path):
    """The final save fails for good at step 20 (last commit 15): 5 steps lost, not 0."""
    sim = make(tmp_path, "controller.checkpoint_interval.every_steps=15")
    sim.fleet.save_failures.append(GroupFailed(Fatal(message="disk gone", hosts=(0,))))
    summary = sim.run()
    assert summary.state == "FAILED" and summary.last_committed_step == 15
    assert summary.unsaved_steps == 5 and summary.lost_steps == 5


def test_a_run_that_gives_up_counts_the_steps_past_its_checkpoint(tmp_path):
    """Budget spent after a host died at step 8 (commit 5): 3 steps lost, counted once."""
    sim = make(tmp_path, "controller.budgets.host_lost=0")
    sim.fleet.on_step(8, lambda g: lost())
    summary = sim.run()
    assert summary.state == "FAILED" and summary.lost_steps == 3 == summary.unsaved_steps


def _metrics(run_dir, steps) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for s in steps:
            fh.write(json.dumps({"step": s, "loss": 1.0}) + "\n")
        fh.write('{"step": 1')  # a half-written last line, as a killed driver leaves it


def test_a_resume_names_the_steps_metrics_jsonl_never_got(tmp_path):
    """The dead driver trained and checkpointed step 15 but wrote records up to step 10 only:
    the resumed run's summary says steps 11-15 are a gap (not silence)."""
    sim = make(tmp_path)
    sim.fleet.disk.committed.append(15)
    _metrics(sim.run_dir, range(1, 11))
    summary = sim.run()
    assert summary.metrics_gaps == [[11, 15]]
    assert "metrics gap: steps 11-15" in summary.as_text(sim.run_dir)
    assert json.loads((sim.run_dir / "summary.json").read_text())["metrics_gaps"] == [[11, 15]]


def test_no_gap_when_the_records_reached_the_restored_step(tmp_path):
    sim = make(tmp_path)
    sim.fleet.disk.committed.append(15)
    _metrics(sim.run_dir, range(1, 18))  # steps past the checkpoint: re-done, not a gap
    assert sim.run().metrics_gaps == []


def test_no_gap_claimed_when_the_run_writes_no_metrics_jsonl(tmp_path):
    sim = make(tmp_path, "metrics.jsonl=false")
    sim.fleet.disk.committed.append(15)
    assert sim.run().metrics_gaps == []
