"""A new user's journey in one run: start the default job, publish a preemption notice with the
CLI, watch the job drain, checkpoint, re-form and finish; every metric lands in (local) Cloud
Monitoring with no rejected point; the run report renders.

One driver subprocess (the real ``python -m orchestrator.main``, emulated cluster of 2 slices of
2 hosts × 2 CPU devices, one of them spare) keeps this affordable on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.metric_service import LocalMetricService

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver exited ({proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_default_job_survives_a_cli_preemption_and_reports(tmp_path: Path) -> None:
    """CLI notice → drain + save + re-form with 0 lost steps; metrics land; report renders."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_GCE_CHECK="true")
    env.pop("RAY_ADDRESS", None)
    with LocalMetricService() as svc:
        cmd = [sys.executable, "-m", "orchestrator.main", "--log-format", "json",
               f"run.run_dir={run_dir}", "run.total_steps=40",
               "cluster.emulate.spare_slices=1", "controller.checkpoint_interval.every_steps=10",
               "events.metadata.enabled=off",
               "metrics.cloud_monitoring.enabled=true", "metrics.cloud_monitoring.project=demo",
               f"metrics.cloud_monitoring.endpoint={svc.address}",
               "metrics.cloud_monitoring.window_s=5"]
        log_path = tmp_path / "driver.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                timeline = run_dir / "timeline.jsonl"
                _wait_for(lambda: any(t["state"] == "RUNNING" for t in _jsonl(timeline)), 240,
                          proc, "RUNNING")
                published_at = time.time()
                cli = subprocess.run(
                    [sys.executable, "-m", "orchestrator.events", "publish", "--run-dir",
                     str(run_dir), "--kind", "preemption", "--host", "1", "--deadline-s", "60"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
                assert cli.returncode == 0, cli.stderr
                event_id = json.loads(cli.stdout)["published"]["id"]

                def recorded() -> bool:
                    return any(e.get("decision") == "accepted"
                               and e.get("event", {}).get("id") == event_id
                               for e in _jsonl(run_dir / "events.jsonl"))

                _wait_for(recorded, 30, proc, "the notice in events.jsonl")
                print(f"CLI publish -> recorded: {time.time() - published_at:.2f}s")
                rc = proc.wait(timeout=420)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        output = log_path.read_text()
        assert rc == 0, output[-4000:]

        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["state"] == "SUCCEEDED"
        assert summary["step"] == 40
        assert summary["lost_steps"] == 0
        assert summary["restarts"] == {"spot_preemption": 1}
        assert summary["last_loss"] < summary["first_loss"]
        states = [t["state"] for t in _jsonl(run_dir / "timeline.jsonl")]
        for s in ("DRAINING", "CHECKPOINTING", "RELEASING", "FORMING", "RESTORING"):
            assert s in states[states.index("RUNNING"):], (s, states)
        actions = [e.get("action") for e in _jsonl(run_dir / "events.jsonl")
                   if e.get("event_id") == event_id]
        assert "drain_now" in actions and "drain:save" in actions, actions
        assert "MFU" in output and "goodput" in output

        rec = svc.state.record
        assert rec.rejected == [], rec.rejected[:5]
        types = {p.metric_type.rsplit("/", 1)[-1] for p in rec.accepted}
        for name in ("mfu", "loss", "step_time", "tokens_per_second", "heartbeat", "goodput"):
            assert name in types, (name, sorted(types))

    report = subprocess.run([sys.executable, "-m", "orchestrator.report", str(run_dir)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    html = (run_dir / "report.html").read_text()
    assert (run_dir / "report.png").stat().st_size > 10_000
    for needle in ("loss", "MFU", "goodput", "DRAINING"):
        assert needle.lower() in html.lower(), needle
