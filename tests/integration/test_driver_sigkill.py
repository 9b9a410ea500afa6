"""A driver killed with SIGKILL mid-run leaves no process of its emulated cluster behind (GCS,
raylets, dashboard and runtime-env agents, host actors), and the next start on the run dir
resumes and finishes (issue 28, item 8)."""

from __future__ import annotations

import json
import time

import pytest

from tests.faults.harness import BASE_OVERRIDES
from tests.integration.cli import _survivors, marked_pids, newest_step, run_main, start_main

pytestmark = pytest.mark.cluster

GONE_WITHIN_S = 20.0


@pytest.mark.timeout(900)
def test_a_sigkilled_driver_leaves_no_process_and_the_next_start_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = [*BASE_OVERRIDES, f"run.run_dir={run_dir}", "run.total_steps=60",
            "metrics.console_every_steps=0"]
    driver, marker = start_main(args, log_path=tmp_path / "driver.log")
    try:
        until = time.monotonic() + 400
        while newest_step(run_dir) < 10 and driver.poll() is None and time.monotonic() < until:
            time.sleep(0.2)
        assert driver.poll() is None and newest_step(run_dir) >= 10, (
            (tmp_path / "driver.log").read_text()[-3000:])
        kinds = "\n".join(marked_pids(marker).values())
        for daemon in ("gcs_server", "raylet", "dashboard/agent.py", "runtime_env/agent",
                       "HostActor"):
            assert daemon in kinds, f"the check would miss {daemon}: {kinds}"
        driver.kill()  # SIGKILL: no teardown runs in the driver
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    t0 = time.monotonic()
    left = _survivors(marker, GONE_WITHIN_S)  # kills and reports what outlived the bound
    assert left == (), f"outlived the driver by {GONE_WITHIN_S:g}s: {left}"
    print(f"\nemulated cluster gone {time.monotonic() - t0:.1f}s after the driver's SIGKILL")

    again = run_main(args, timeout_s=400)
    assert again.code == 0, again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["state"], summary["step"]) == ("SUCCEEDED", 60)
    assert again.leftovers == ()
