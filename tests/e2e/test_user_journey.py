"""A new user's journey in one run: start the default job (`make run`'s), publish a preemption
notice with the CLI, watch the job drain, checkpoint, re-form and finish; every metric lands in
(local) Cloud Monitoring with no rejected point; the run report renders; the run directory holds
what the docs promise; a later run with another model is refused without touching a file.

One driver subprocess (the real ``python -m orchestrator.main``, emulated cluster of 2 slices of
2 hosts × 2 CPU devices, one of them spare) serves every test here: affordable on 2 cores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.cli import MARK, _survivors, run_main, snapshot
from tests.support.metric_server import LocalMetricService

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


STEPS = 100  # long enough after the notice for the emulated cloud to reclaim and replace


@dataclass(frozen=True)
class Journey:
    run_dir: Path
    rc: int
    output: str
    event_id: str
    leftovers: tuple[str, ...]
    rejected: list
    metric_types: set[str]
    seconds: float


@pytest.fixture(scope="module")
def journey(tmp_path_factory) -> Journey:
    tmp_path = tmp_path_factory.mktemp("journey")
    run_dir = tmp_path / "run"
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_GCE_CHECK="true", **{MARK: marker})
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    with LocalMetricService() as svc:
        cmd = [sys.executable, "-m", "orchestrator.main", "--log-format", "json",
               f"run.run_dir={run_dir}", f"run.total_steps={STEPS}",
               "cluster.emulate.spare_slices=1", "cluster.emulate.replace_after_s=0",
               "controller.checkpoint_interval.every_steps=10",
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
                # a user watches it train first (3 lines: a couple of chunks in, metrics.jsonl
                # is flushed about once a second); a 5 s notice sent before the first step ends
                # (its first run, slower on a loaded machine) finds no step boundary to drain at
                _wait_for(lambda: len(_jsonl(run_dir / "metrics.jsonl")) >= 3, 120, proc,
                          "the first steps in metrics.jsonl")
                published_at = time.time()
                cli = subprocess.run(
                    [sys.executable, "-m", "orchestrator.events", "publish", "--run-dir",
                     str(run_dir), "--kind", "preemption", "--host", "1", "--deadline-s", "5"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
                assert cli.returncode == 0, cli.stderr
                event_id = json.loads(cli.stdout)["published"]["id"]

                def recorded() -> bool:
                    return any(e.get("decision") == "accepted"
                               and e.get("event", {}).get("id") == event_id
                               for e in _jsonl(run_dir / "events.jsonl"))

                _wait_for(recorded, 30, proc, "the notice in events.jsonl")
                print(f"CLI publish -> recorded: {time.time() - published_at:.2f}s")
                # the emulated cloud takes the noticed slice at the deadline (5 s) and a new
                # slice joins right after (replace_after_s=0), while the job still runs
                _wait_for(lambda: "emulated_slice_returned" in log_path.read_text(), 90, proc,
                          "the emulated cloud's replacement slice")
                rc = proc.wait(timeout=420)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        seconds = time.monotonic() - t0
        rec = svc.state.record
        rejected = list(rec.rejected)
        types = {p.metric_type.rsplit("/", 1)[-1] for p in rec.accepted}
    return Journey(run_dir=run_dir, rc=rc, output=log_path.read_text(), event_id=event_id,
                   leftovers=_survivors(marker, 30.0), rejected=rejected, metric_types=types,
                   seconds=seconds)


def test_default_job_survives_a_cli_preemption_and_reports(journey: Journey) -> None:
    """CLI notice → drain + save + re-form with 0 lost steps; metrics land; report renders."""
    run_dir, output = journey.run_dir, journey.output
    assert journey.rc == 0, output[-4000:]
    assert journey.leftovers == ()

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "SUCCEEDED"
    assert summary["step"] == STEPS
    assert summary["lost_steps"] == 0
    assert summary["restarts"] == {"spot_preemption": 1}
    assert summary["last_loss"] < summary["first_loss"]
    states = [t["state"] for t in _jsonl(run_dir / "timeline.jsonl")]
    for s in ("DRAINING", "CHECKPOINTING", "RELEASING", "FORMING", "RESTORING"):
        assert s in states[states.index("RUNNING"):], (s, states)
    cloud = [json.loads(line) for line in output.splitlines()
             if line.startswith("{") and '"emulated_slice_' in line]
    assert [(c["message"], c["slice"]) for c in cloud] == [
        ("emulated_slice_reclaimed", "emu-slice-0"), ("emulated_slice_returned", "emu-slice-2")]
    actions = [e.get("action") for e in _jsonl(run_dir / "events.jsonl")
               if e.get("event_id") == journey.event_id]
    # a durable save, or (a notice too short for one) a copy to the RAM tier's holders on the
    # spare slice (the defaults): either keeps the stopped step, 0 lost (above)
    assert "drain_now" in actions, actions
    assert {"drain:save", "drain:ram_copy_only"} & set(actions), actions
    assert "MFU" in output and "goodput" in output

    assert journey.rejected == [], journey.rejected[:5]
    for name in ("mfu", "loss", "step_time", "tokens_per_second", "heartbeat", "goodput"):
        assert name in journey.metric_types, (name, sorted(journey.metric_types))

    env = dict(os.environ, NO_GCE_CHECK="true")
    report = subprocess.run([sys.executable, "-m", "orchestrator.report", str(run_dir)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    html = (run_dir / "report.html").read_text()
    assert (run_dir / "report.png").stat().st_size > 10_000
    for needle in ("loss", "MFU", "goodput", "DRAINING"):
        assert needle.lower() in html.lower(), needle


def test_the_run_dir_holds_every_step_and_the_timings(journey: Journey) -> None:
    """Each step once (nothing re-done), MFU on every step, the final checkpoint, two
    groups; the timings of the default run are printed (with -s), not gated."""
    run_dir = journey.run_dir
    assert journey.rc == 0, journey.output[-4000:]
    steps = _jsonl(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["mfu"] > 0 and s["peak_source"] for s in steps)
    assert {s["devices"] for s in steps} == {4}
    assert statistics.mean(s["loss"] for s in steps[-5:]) < statistics.mean(
        s["loss"] for s in steps[:5])
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
    assert json.loads((run_dir / "run.json").read_text())["incarnation"] == 1  # one driver
    assert json.loads((run_dir / "topology.json").read_text())["incarnation"] == 2  # two groups

    timeline = _jsonl(run_dir / "timeline.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    started = json.loads((run_dir / "run.json").read_text())["started_at"]
    running_at = next(t["at"] for t in timeline if t["state"] == "RUNNING")
    numbers = {"process_wall_s": round(journey.seconds, 1),
               "cluster_start_s": round(timeline[0]["at"] - started, 1),
               "planning_to_running_s": round(running_at - timeline[0]["at"], 1),
               "compile_s": summary["compile_s"],
               "steady_step_s": round(statistics.median(s["step_time_s"] for s in steps), 4),
               "phases_s": summary["phases_s"], "recoveries": summary["recoveries"]}
    print("\nDEFAULT RUN TIMINGS " + json.dumps(numbers))
    assert len(summary["compile_s"]) == 2


def test_the_driver_printed_the_memory_estimate_before_the_cluster(journey: Journey) -> None:
    """The default task's estimate per host, fitted to this machine's RAM, before Ray starts."""
    output = journey.output
    line = [ln for ln in output.splitlines() if ln.startswith("Memory per host")]
    assert len(line) == 1 and "Fits within" in line[0], line
    assert output.index(line[0]) < output.index("emulated_cluster_started")


def test_tensorboard_marks_the_preemption_and_the_reform(journey: Journey) -> None:
    """RUN_DIR/tensorboard (read back with every record's CRC checked) holds the CLI's notice
    as a ``lifecycle/events`` text (its id and kind, written when the intake accepted it, before
    the drain) and the re-form it caused as a ``lifecycle/transitions`` text with its cause."""
    from tests.metrics.tfevents import event_jsons, read_dir, series, visible

    assert journey.rc == 0, journey.output[-4000:]
    _, points = read_dir(journey.run_dir / "tensorboard")
    shown = [e for p in visible(points, "lifecycle/events") for e in event_jsons(str(p.value))]
    assert [e.get("id") for e in shown].count(journey.event_id) == 1, shown
    # an entry is written again with each later event at its step: the first write is the
    # notice's own, at the time the intake accepted it
    point, event = next((p, e) for p in series(points, "lifecycle/events")
                        for e in event_jsons(str(p.value)) if e.get("id") == journey.event_id)
    assert event["kind"] == "preemption_notice" and event["target"]["host"] in ("1", 1), event
    transitions = series(points, "lifecycle/transitions")
    drains = [p for p in transitions if "→ DRAINING**" in str(p.value)]
    assert drains and point.wall_time <= drains[0].wall_time, [p.value for p in transitions]
    reforms = [str(p.value) for p in transitions if "re-form, cause:" in str(p.value)]
    assert reforms, [p.value for p in transitions]


def test_incompatible_checkpoint_is_refused_and_untouched(journey: Journey) -> None:
    """A run_dir holding another model's checkpoint: exit != 0, the fix named, files unchanged."""
    run_dir = journey.run_dir
    assert journey.rc == 0
    before = snapshot(run_dir / "checkpoints")
    assert any(k.startswith(f"{STEPS}/") for k in before)
    res = run_main([f"run.run_dir={run_dir}", f"run.total_steps={STEPS + 10}",
                    "model.d_model=32"])
    assert res.code != 0, res.stdout[-3000:]
    text = " ".join((res.stdout + res.stderr).split())  # the message is wrapped to 100 columns
    assert "another task" in text and "use a new run.run_dir" in text, text[-4000:]
    assert snapshot(run_dir / "checkpoints") == before
    assert res.leftovers == ()
