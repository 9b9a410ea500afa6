"""One events subscription per run (issue 16), the driver's side, without an emulator.

Terraform creates `<topic>-<run.name>` per run, filtered on the message attribute `job`. The
driver defaults to that subscription, warns when a configured one looks shared, and ignores a
message addressed to another run; the CLI sets `job` on every Pub/Sub event it publishes.
(The Pub/Sub path itself: tests/events/test_pubsub.py, against Google's emulator.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.events import cli
from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.intake import EventIntake
from orchestrator.events.relevance import relevance
from orchestrator.shared.errors import ConfigError
from tests.events.helpers import event


class RecordingSubscriber:
    """Subscriber factory seam: records the subscription asked for, then fails (no network)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, cfg: PubSubConfig) -> Any:
        return self

    def subscription_path(self, project: str, sub: str) -> str:
        self.paths.append(f"projects/{project}/subscriptions/{sub}")
        return self.paths[-1]

    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("tests never reach Pub/Sub")

    def close(self) -> None:
        return None


def _intake(tmp_path: Path, pubsub: PubSubConfig, job: str, sub: RecordingSubscriber
            ) -> EventIntake:
    return EventIntake(EventsConfig(inbox=False, pubsub=pubsub), run_dir=tmp_path, job=job,
                       subscriber_factory=sub)


def test_subscription_defaults_to_the_runs_own():
    """topic alone -> `<topic>-<run.name>`; a named subscription is kept; neither -> off."""
    cfg = PubSubConfig(project="my-proj", topic="tpu-orchestrator-events")
    assert cfg.for_job("llm-001").subscription == "tpu-orchestrator-events-llm-001"
    assert cfg.for_job("llm-001").enabled
    named = PubSubConfig(project="my-proj", topic="t-events", subscription="mine-llm-001")
    assert named.for_job("llm-001").subscription == "mine-llm-001"
    assert not PubSubConfig().for_job("llm-001").enabled
    emulated = PubSubConfig(emulator=True).for_job("demo")
    assert (emulated.project, emulated.topic, emulated.subscription) == (
        "local-project", "demo-events", "demo-events-demo")


def test_per_run_default_that_is_no_pubsub_id_names_the_setting():
    """A topic + run name over Pub/Sub's 255 characters is a ConfigError at construction."""
    cfg = PubSubConfig(project="my-proj", topic="t" * 250)
    with pytest.raises(ConfigError, match=r"events\.pubsub\.subscription"):
        cfg.for_job("run-000001")


def test_intake_pulls_the_runs_own_subscription(tmp_path):
    """With only a topic configured, the driver subscribes to `<topic>-<job>`."""
    sub = RecordingSubscriber()
    cfg = PubSubConfig(project="my-proj", topic="tpu-orchestrator-events",
                       reconnect_initial_s=0.05, reconnect_max_s=0.1)
    with capture_logs() as logs, _intake(tmp_path, cfg, "llm-001", sub) as intake:
        assert intake.pubsub_config.subscription == "tpu-orchestrator-events-llm-001"
        _wait(lambda: sub.paths)
    assert sub.paths[0] == "projects/my-proj/subscriptions/tpu-orchestrator-events-llm-001"
    assert not [e for e in logs if e["event"] == "pubsub_subscription_not_per_run"]


def test_a_subscription_not_ending_in_the_run_name_is_warned_about_with_the_fix(tmp_path):
    """A shared-looking subscription: warning naming the run's own subscription; still used."""
    sub = RecordingSubscriber()
    cfg = PubSubConfig(project="my-proj", topic="tpu-orchestrator-events",
                       subscription="tpu-orchestrator-intake", reconnect_initial_s=0.05,
                       reconnect_max_s=0.1)
    with capture_logs() as logs, _intake(tmp_path, cfg, "llm-001", sub):
        _wait(lambda: sub.paths)
    (warning,) = [e for e in logs if e["event"] == "pubsub_subscription_not_per_run"]
    assert warning["log_level"] == "warning"
    assert warning["subscription"] == "tpu-orchestrator-intake"
    assert "tpu-orchestrator-events-llm-001" in warning["fix"]
    assert sub.paths[0].endswith("/tpu-orchestrator-intake")


def test_message_attribute_job_of_another_run_is_irrelevant():
    """attribute job=other -> irrelevant with the reason; own job or none -> accepted."""
    verdict = relevance(event(), job="llm-001", attributes={"job": "llm-002"})
    assert verdict.decision == "irrelevant" and "llm-002" in verdict.reason
    assert relevance(event(), job="llm-001", attributes={"job": "llm-001"}).accepted
    assert relevance(event(), job="llm-001", attributes={"kind": "preemption_notice"}).accepted


def _publish(*argv: str) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["publish", *argv])
    return code, err.getvalue()


def test_pubsub_publish_without_a_run_is_refused_with_the_fix(monkeypatch, capsys):
    """No --job, no --run-dir: exit 2 naming --job (a job-less `stop` would stop every run)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:9")  # never Google, never reached
    code, err = _publish("--project", "my-proj", "--topic", "events", "--kind", "stop")
    assert code == 2 and "--job RUN_NAME" in err and "--all-jobs" in err
    code, err = _publish("--project", "my-proj", "--topic", "events", "--kind", "stop",
                         "--job", "a", "--all-jobs")
    assert code == 2 and "contradict" in err
    assert capsys.readouterr().out == ""


def test_run_dir_job_from_the_drivers_records(tmp_path):
    """pubsub.json's job, else run.json's job, else its run_id; unreadable -> CliError."""
    assert cli.run_dir_job(tmp_path) is None
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "old-id"}))
    assert cli.run_dir_job(tmp_path) == "old-id"
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "old-id", "job": "llm-001"}))
    assert cli.run_dir_job(tmp_path) == "llm-001"
    (tmp_path / "pubsub.json").write_text(json.dumps({"job": "emulated", "topic": "t"}))
    assert cli.run_dir_job(tmp_path) == "emulated"
    (tmp_path / "pubsub.json").write_text("{not json")
    with pytest.raises(cli.CliError, match="--job"):
        cli.run_dir_job(tmp_path)


def _wait(predicate, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)
