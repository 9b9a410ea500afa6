"""Autoresume brings back a run of a user's task (issue 30, item 8).

The run is `examples/text_lm` as README "Train your own model" submits it: `--config` inside the
job's working_dir package, `task.data.dir=...` as an override. run.json and config.yaml are
written by the driver's own code (`Driver._prepare_run_dir`); the alert names the run id only.
The resubmission is the run's own command line, its task from the --config file and its task
settings as the run recorded them. A run.json edited to choose another task's code
(`task.kind=...`, `task={...}`) or other settings than the recorded ones is refused, and so is a
`task.*` override when the run recorded no config.yaml to check it against.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.main import Driver
from policies.autoresume import JobStatus
from tests.autoresume.notifications import encode, notification
from tests.autoresume.test_service_unit import Clock, TableRay, audit, service

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "examples/text_lm/config.yaml"
PACKAGE = "gcs://_ray_pkg_0123abcd.zip"


def record_run(tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    """A text_lm run's directory as its driver leaves it (run.json, config.yaml); its argv."""
    run_dir = tmp_path / "runs" / "text-lm"
    argv = ["--config", CONFIG, "run.name=text-lm", f"run.run_dir={run_dir}",
            "run.total_steps=60", f"task.data.dir={tmp_path / 'data' / 'sqlite'}"]
    monkeypatch.chdir(ROOT)  # --config is relative to the job's working_dir
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {"working_dir": PACKAGE}, "metadata": {"job_submission_id": "text-lm-r0"}}))
    cfg = load_config(CONFIG, argv[2:])
    assert cfg.task.kind == "examples.text_lm.task:make_task"
    Driver(cfg, argv=argv)._prepare_run_dir()
    return run_dir, argv


def failed_r0(argv: list[str]) -> TableRay:
    """Ray's job table after README's `ray job submit --submission-id text-lm-r0 --working-dir
    . -- python -m orchestrator.main <argv>` failed: Ray recorded the command."""
    ray = TableRay()
    ray.record("text-lm-r0", ["python", "-m", "orchestrator.main", *argv],
               {"working_dir": PACKAGE}, status=JobStatus.FAILED)
    return ray


def tamper(run_dir: Path, argv: list[str]) -> None:
    """A runs-bucket writer rewrites the recorded entrypoint."""
    meta = json.loads((run_dir / "run.json").read_text())
    meta["entrypoint"] = ["python", "-m", "orchestrator.main", *argv]
    (run_dir / "run.json").write_text(json.dumps(meta))


def test_a_user_task_run_is_resubmitted_with_its_own_task(tmp_path, monkeypatch):
    """The alert (whatever labels it carries) names the run; the resubmission is the run's own
    command line: --config in its package, task.data.dir as recorded; same working_dir."""
    _, argv = record_run(tmp_path, monkeypatch)
    ray = failed_r0(argv)
    svc = service(tmp_path, ray, Clock())
    alert = notification(incident_id="i-1", run_id="text-lm")
    alert["incident"]["policy_user_labels"] = {
        **alert["incident"]["policy_user_labels"], "task": "evil.mod:make_task"}
    alert["incident"]["documentation"]["content"] = "task.kind=evil.mod:make_task"
    assert svc.handle_message(encode(alert)) == "submitted"
    [(sid, line, env)] = ray.submitted
    assert sid == "text-lm-r1"
    assert line == shlex.join(["python", "-m", "orchestrator.main", *argv])
    assert "evil" not in line and "task.kind" not in line
    assert env["working_dir"] == PACKAGE


@pytest.mark.parametrize("override,why", [
    ("task.kind=evil.mod:make_task", "kind comes from the --config file"),
    ("task={kind: 'evil.mod:make_task'}", "kind comes from the --config file"),
    ("task.data.dir=/elsewhere", "differs from the task the run recorded"),
    ("task.settings.d_model=256", "differs from the task the run recorded"),
    ("task.data={dir: /elsewhere}", "differs from the task the run recorded"),
])
def test_an_edited_task_is_refused(tmp_path, monkeypatch, override, why):
    """run.json edited to choose other code or other settings: refused, nothing submitted."""
    run_dir, argv = record_run(tmp_path, monkeypatch)
    tamper(run_dir, [*argv, override])
    ray = failed_r0(argv)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="text-lm"))) == (
        "refused")
    assert ray.submitted == []
    assert why in audit(tmp_path)[0]["reason"]


@pytest.mark.parametrize("forge", [False, True])
def test_a_task_setting_config_yaml_agrees_with_is_still_refused(tmp_path, monkeypatch, forge):
    """A task setting added to run.json is refused even where config.yaml records that value:
    the same writer can forge config.yaml (issue 49, finding 4); only the command Ray recorded
    for the run is resubmitted. (Issue 30 passed `task.settings.d_model=128` as "changes
    nothing"; `forge`: config.yaml rewritten to agree with a new data dir.)"""
    run_dir, argv = record_run(tmp_path, monkeypatch)
    if forge:
        recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
        recorded["task"]["settings"]["data"]["dir"] = "/evil/data"
        (run_dir / "config.yaml").write_text(yaml.safe_dump(recorded))
        tamper(run_dir, [w if not w.startswith("task.data.dir=") else "task.data.dir=/evil/data"
                         for w in argv])
    else:
        tamper(run_dir, [*argv, "task.settings.d_model=128"])
    ray = failed_r0(argv)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="text-lm"))) == (
        "refused")
    assert ray.submitted == []
    assert "differs from the one Ray recorded for text-lm-r0" in audit(tmp_path)[0]["reason"]


def test_task_overrides_without_a_recorded_config_are_refused(tmp_path, monkeypatch):
    """No config.yaml to check task.data.dir against: refused, with the fix."""
    run_dir, argv = record_run(tmp_path, monkeypatch)
    (run_dir / "config.yaml").unlink()
    ray = failed_r0(argv)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="text-lm"))) == (
        "refused")
    reason = audit(tmp_path)[0]["reason"]
    assert "recorded no readable config.yaml" in reason and "--config file" in reason
