"""SIGTERM (``ray job stop``, a Kubernetes pod deletion) drains a real driver: it stops at the
next step boundary, saves that step, exits 143 and says so in summary.json, with 0 steps lost
(issue 28, item 4; before: FAILED, exit 1, the steps since the last save discarded, lost 0),
and ends STOPPED (issue 53, item 6; before: FAILED)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from orchestrator.shared import layout as ckpt_layout
from tests.faults.harness import BASE_OVERRIDES
from tests.integration.cli import _survivors, newest_step, start_main

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(900)
def test_sigterm_mid_run_saves_the_step_it_stopped_at_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    log = tmp_path / "driver.log"
    args = [*BASE_OVERRIDES, f"run.run_dir={run_dir}", "run.total_steps=5000",
            "controller.checkpoint_interval.every_steps=1000",  # no periodic save before it
            "metrics.console_every_steps=0"]
    driver, marker = start_main(args, log_path=log)
    try:
        until = time.monotonic() + 400
        while newest_step(run_dir) < 12 and driver.poll() is None and time.monotonic() < until:
            time.sleep(0.2)
        assert driver.poll() is None and newest_step(run_dir) >= 12, log.read_text()[-3000:]
        t0 = time.monotonic()
        driver.send_signal(signal.SIGTERM)  # the driver only, as `ray job stop` signals it
        code = driver.wait(120)
        took = time.monotonic() - t0
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 143, log.read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["step"]
    assert (summary["state"], summary["stopped_by"], summary["exit_code"]) == (
        "STOPPED", "SIGTERM", 143)
    assert step >= 12 and summary["last_committed_step"] == step
    assert summary["lost_steps"] == 0 and summary["unsaved_steps"] == 0
    assert f"stopped by SIGTERM after saving step {step}" in summary["reason"]
    assert ckpt_layout.committed_steps(run_dir / "checkpoints") == [step]
    timeline = (run_dir / "timeline.jsonl").read_text().splitlines()
    states = [json.loads(x)["state"] for x in timeline if x.startswith("{")]
    assert states[-4:] == ["DRAINING", "CHECKPOINTING", "RELEASING", "STOPPED"]
    assert _survivors(marker, 30.0) == ()
    phases = summary["phases_s"]
    print(f"\nSIGTERM -> exit {took:.1f}s (drain {phases.get('DRAINING', 0):.2f}s, save "
          f"{phases.get('CHECKPOINTING', 0):.2f}s, release {phases.get('RELEASING', 0):.2f}s, "
          f"median step {summary['median_step_s']:.3f}s); stopped and saved at step {step}")
