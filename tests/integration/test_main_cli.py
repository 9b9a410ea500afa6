"""``python -m orchestrator.main`` end to end: the default run, and bad input of every kind.

Bad input must end with a one-paragraph message naming the fix, a non-zero exit code, no
process of the run left behind and no existing checkpoint touched.
"""

from __future__ import annotations

import json
import statistics

import pytest

from tests.integration.cli import run_main, snapshot

STEPS = 30


def _message(stderr: str, title: str) -> str:
    """The user-facing paragraph: from the line starting with ``title`` to the next log line.

    Ray and structlog also write to stderr (JSON lines, ``[...]``/timestamped lines); the
    message is the one block that is neither, and it must be the only one.
    """
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(title)]
    assert len(starts) == 1, f"expected one {title!r} paragraph in:\n{stderr[-3000:]}"
    block = []
    for ln in lines[starts[0]:]:
        if not ln.strip() or ln.startswith(("{", "[", "20")) or (block and ln.startswith(title)):
            break
        block.append(ln)
    return " ".join(block)


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("override", "setting"), [
    ("model.num_heads=3", "model.num_heads"),
    ("mesh.ici.data=3", "mesh.ici.fsdp"),
    ("model.bogus=1", "model.bogus"),
    ("train.global_batch=6", "train.global_batch"),
])
def test_invalid_config_exits_2_before_anything_starts(tmp_path, override, setting):
    """Validation runs before Ray: exit 2, the setting and a fix named, no run_dir created."""
    run_dir = tmp_path / "run"
    res = run_main([f"run.run_dir={run_dir}", override], timeout_s=120, grace_s=5)
    assert res.code == 2, res.stderr[-3000:]
    msg = _message(res.stderr, "Configuration error")
    assert f"`{setting}`" in msg and "Fix:" in msg
    assert not run_dir.exists()
    assert res.leftovers == ()


def test_missing_config_file_exits_2(tmp_path):
    res = run_main(["--config", str(tmp_path / "absent.yaml")], timeout_s=120, grace_s=5)
    assert res.code == 2
    assert "--config" in _message(res.stderr, "Configuration error")


@pytest.mark.cluster
def test_unreachable_ray_address_exits_2_and_leaves_nothing(tmp_path):
    """A Ray address nobody listens on: bounded wait, exit 2, the fix named, no process left."""
    res = run_main([f"run.run_dir={tmp_path / 'run'}", "cluster.address=127.0.0.1:1",
                    "cluster.connect_timeout_s=5"], timeout_s=180)
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    msg = _message(res.stderr, "Ray cluster unreachable")
    assert "'127.0.0.1:1'" in msg and "within 5s" in msg
    assert "Fix:" in msg and "cluster.address" in msg
    assert res.leftovers == ()


@pytest.mark.cluster
def test_too_few_hosts_exits_2_and_leaves_nothing(tmp_path):
    """3 slices asked of a 1-slice emulated cluster: exit 2 before any actor, nothing left."""
    run_dir = tmp_path / "run"
    res = run_main([f"run.run_dir={run_dir}", "cluster.mode=emulate", "cluster.slices=3",
                    "cluster.emulate.hosts_per_slice=1"])
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    msg = _message(res.stderr, "Cluster too small")
    assert "3 complete slice" in msg
    assert "Fix:" in msg and "cluster.slices" in msg
    assert not (run_dir / "checkpoints").exists()
    assert res.leftovers == ()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The default `make run` (1 slice × 2 hosts × 2 devices), shortened to STEPS steps."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    res = run_main([f"run.run_dir={run_dir}", f"run.total_steps={STEPS}"])
    return res, run_dir


@pytest.mark.cluster
def test_default_run_trains_and_writes_the_run_dir(default_run):
    """Falling loss, MFU printed, summary/timeline/metrics written, nothing left running."""
    res, run_dir = default_run
    assert res.code == 0, (res.stdout[-3000:], res.stderr[-5000:])
    assert res.leftovers == ()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["state"], summary["step"], summary["lost_steps"]) == ("SUCCEEDED", STEPS, 0)
    assert summary["last_loss"] < summary["first_loss"] - 0.1, summary
    assert "MFU" in res.stdout and "Run SUCCEEDED" in res.stdout

    states = [t["state"] for t in _jsonl(run_dir / "timeline.jsonl")]
    assert states == ["PLANNING", "FORMING", "RESTORING", "COMPILING", "RUNNING",
                      "CHECKPOINTING", "SUCCEEDED"], states

    steps = _jsonl(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["mfu"] > 0 and s["peak_source"] for s in steps)
    assert {s["devices"] for s in steps} == {4}
    assert statistics.mean(s["loss"] for s in steps[-5:]) < statistics.mean(
        s["loss"] for s in steps[:5])
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
    run_meta = json.loads((run_dir / "run.json").read_text())
    assert run_meta["incarnation"] == 1


@pytest.mark.cluster
def test_default_run_timings(default_run):
    """Measured (printed with -s): steady step time, first-step compile, time to steady state."""
    res, run_dir = default_run
    assert res.code == 0
    timeline = _jsonl(run_dir / "timeline.jsonl")
    steps = _jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    started = json.loads((run_dir / "run.json").read_text())["started_at"]
    steady = statistics.median(s["step_time_s"] for s in steps[len(steps) // 3:])
    first_steady = next(s for s in steps if s["step_time_s"] <= 1.5 * steady)
    running_at = next(t["at"] for t in timeline if t["state"] == "RUNNING")
    planning_at = timeline[0]["at"]
    numbers = {
        "process_wall_s": round(res.seconds, 1),
        "cluster_start_s": round(planning_at - started, 1),
        "planning_to_running_s": round(running_at - planning_at, 1),
        "compile_s": summary["compile_s"][0],
        "steady_step_s": round(steady, 4),
        "time_to_steady_state_s": round(first_steady["wall_time"] - started, 1),
        "time_to_steady_from_planning_s": round(first_steady["wall_time"] - planning_at, 1),
        "phases_s": summary["phases_s"],
    }
    print("\nDEFAULT RUN TIMINGS " + json.dumps(numbers))
    # A measurement, not a benchmark gate: only check that every number was recorded.
    assert len(summary["compile_s"]) == 1 and len(steps) == STEPS


@pytest.mark.cluster
def test_incompatible_checkpoint_is_refused_and_untouched(default_run):
    """A run_dir holding another model's checkpoint: exit != 0, the fix named, files unchanged."""
    res0, run_dir = default_run
    assert res0.code == 0
    before = snapshot(run_dir / "checkpoints")
    assert any(k.startswith(f"{STEPS}/") for k in before)
    res = run_main([f"run.run_dir={run_dir}", f"run.total_steps={STEPS + 10}",
                    "model.d_model=32"])
    assert res.code != 0, res.stdout[-3000:]
    text = " ".join((res.stdout + res.stderr).split())  # the message is wrapped to 100 columns
    assert "different model" in text and "use a new run.run_dir" in text, text[-4000:]
    assert snapshot(run_dir / "checkpoints") == before
    assert res.leftovers == ()
