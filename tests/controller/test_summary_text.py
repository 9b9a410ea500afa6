"""What ``python -m orchestrator.main`` prints at the end (``RunSummary.as_text``)."""

from __future__ import annotations

from orchestrator.controller.summary import RunSummary


def test_summary_text_names_the_outcome_restores_and_recoveries():
    s = RunSummary(
        state="SUCCEEDED", reason="reached step 40", step=40, total_steps=40, lost_steps=1,
        restarts={"host_lost": 1}, phases_s={"RUNNING": 12.04, "FORMING": 2.5}, wall_s=20.12,
        first_loss=5.5, last_loss=2.25, median_step_s=0.05, compile_s=[1.5], recoveries=[
            {"kind": "unannounced", "cause": "host_lost", "to_first_step_s": 4.1,
             "lost_steps": 1, "phases_s": {"FORMING": 2.5}}],
        compiles=[], restores=[{"restored_step": None},
                               {"restored_step": 37, "tier": "ram", "restore_s": 0.03,
                                "lost_steps": 1}], goodput=0.65)
    text = s.as_text("/runs/x").splitlines()
    assert text[0] == "Run SUCCEEDED: reached step 40"
    assert "lost steps 1" in text[1] and "host_lost" in text[1]
    assert "loss 5.5 -> 2.25" in text[2] and "median step 0.05s" in text[2]
    assert "goodput 65.0%" in text[3] and "RUNNING 12.0s" in text[4]
    assert text[5] == "  restore: step 37 from the ram tier in 0.03 s, lost 1 step(s)"
    assert text[6].startswith("  recovery (unannounced, host_lost): to first step 4.1s")
    assert text[-1] == "  run dir: /runs/x"


def test_summary_text_of_a_failed_run_with_nothing_measured():
    s = RunSummary(state="FAILED", reason="interrupted", step=0, total_steps=10, lost_steps=0,
                   restarts={}, phases_s={}, wall_s=0.5, first_loss=None, last_loss=None,
                   median_step_s=None, compile_s=[], recoveries=[], compiles=[], restores=[])
    text = s.as_text("r")
    assert "restarts none" in text and "loss n/a -> n/a" in text and "goodput n/a" in text


def test_summary_text_of_a_sigterm_stop_names_the_signal_the_loss_and_the_gap():
    s = RunSummary(state="FAILED", reason="stopped by SIGTERM", step=47, total_steps=100,
                   lost_steps=2, restarts={}, phases_s={}, wall_s=9.0, first_loss=None,
                   last_loss=None, median_step_s=None, compile_s=[], recoveries=[],
                   compiles=[], restores=[], last_committed_step=45, exit_code=143,
                   stopped_by="SIGTERM", unsaved_steps=2, metrics_gaps=[[41, 45]])
    text = s.as_text("r")
    assert "stopped by SIGTERM (exit 143); last committed checkpoint: step 45" in text
    assert "2 step(s) past the last save were discarded" in text
    assert "metrics gap: steps 41-45" in text
    assert s.to_json()["metrics_gaps"] == [[41, 45]] and s.to_json()["stopped_by"] == "SIGTERM"
