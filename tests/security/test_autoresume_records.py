"""Autoresume's trust boundary, second round (issue 49, findings 2-4 and the lows on names), driven
as an attacker with write access to the runs area would: a run named like another run's restart,
a run.json that is huge, deep or not the run's own, and a record that asks for more than "this
run again". Ray is the in-memory job table behind the service's own seam
(tests/autoresume/test_service_unit.py); no cluster is started.

What must hold: no other run's job is stopped, one bad run.json stops autoresume for no other
run, and a resubmission is the run's own command (as Ray recorded it) and nothing else.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.autoresume.runenv import REDACTED, redact_argv, redact_runtime_env
from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from policies.autoresume import JobStatus, Submission, next_submission_id, restart_of
from tests.autoresume.notifications import encode, notification
from tests.autoresume.test_service_unit import Clock, TableRay, audit, make_run, service


def alert(incident_id: str, run_id: str = "run-a", **kw) -> bytes:
    return encode(notification(incident_id=incident_id, run_id=run_id, **kw))


def stale_heartbeat(run_dir: Path) -> None:
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_time": 0.0}) + "\n")


# ---- finding 2: a run name that is another run's restart id -----------------------------------

@pytest.mark.parametrize("name", ["exp-r1", "exp-r0", "llm-run-7-r12", "a-r007"])
def test_run_name_shaped_like_a_restart_id_is_refused_at_config_load(name):
    """`exp-r1` would be run `exp`'s restart job: the config refuses it, naming the fix; a name
    that only looks close (`exp-r`, `exp-r1x`, `exp-retry1`) still loads."""
    with pytest.raises(ConfigError, match=r"run\.name.*-r<digits>.*Fix: pick a name"):
        load_config(None, [f"run.name={name}"])
    for near in ("exp-r", "exp-r1x", "exp-rr1", "exp-retry1", "r1", "exp_r1"):
        assert load_config(None, [f"run.name={near}"]).run.name == near


def test_alert_for_a_run_named_like_a_restart_stops_nothing(tmp_path):
    """A run directory recorded as `exp-r1` (named before the rule) and run `exp`'s restart job
    `exp-r1`, running but silent: an alert for `exp-r1` stops and submits nothing, audited."""
    stale_heartbeat(make_run(tmp_path, "exp"))
    stale_heartbeat(make_run(tmp_path, "exp-r1"))
    ray, clock = TableRay(), Clock()
    ray.jobs["exp-r1"] = Submission(submission_id="exp-r1", status=JobStatus.RUNNING,
                                    start_time=clock.t - 5000)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "exp-r1", started_at=int(clock.t - 100))) == "nothing"
    assert ray.stopped == [] and ray.submitted == []
    assert "-r<digits>" in audit(tmp_path)[0]["reason"]


# ---- low: a restart number of 5,000 digits ----------------------------------------------------

def test_job_id_with_thousands_of_digits_is_no_restart_and_raises_nothing(tmp_path):
    """`exp-r` + 5,000 digits is no restart of `exp` (Python's int() refuses it): the alert for
    `exp` is handled, and the next restart id is exp-r1."""
    make_run(tmp_path, "exp")
    huge = "exp-r" + "7" * 5000
    ray = TableRay()
    ray.jobs[huge] = Submission(submission_id=huge, status=JobStatus.FAILED)
    ray.jobs["exp-r0"] = Submission(submission_id="exp-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1", "exp")) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["exp-r1"]
    assert restart_of("exp", huge) is None and next_submission_id("exp", (huge,)) == "exp-r1"


# ---- finding 3: one run.json disables autoresume for nobody -----------------------------------

def failed_run(tmp_path: Path, run_id: str = "run-a") -> TableRay:
    make_run(tmp_path, run_id)
    ray = TableRay()
    ray.jobs[f"{run_id}-r0"] = Submission(submission_id=f"{run_id}-r0", status=JobStatus.FAILED)
    return ray


def test_a_run_json_nested_200000_deep_stops_no_other_run(tmp_path):
    """A run.json 200,000 levels deep elsewhere under the runs root: skipped and logged; the
    alert for run-a is handled (it raised RecursionError out of the scan for every alert)."""
    ray = failed_run(tmp_path)
    (tmp_path / "runs" / "zz-deep").mkdir()
    (tmp_path / "runs" / "zz-deep" / "run.json").write_text("[" * 200_000 + "]" * 200_000)
    svc = service(tmp_path, ray, Clock())
    with capture_logs() as logs:
        assert svc.handle_message(alert("i-1")) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1"]
    bad = [r for r in logs if r["event"] == "autoresume_bad_run_json"]
    assert len(bad) == 1 and "nested" in bad[0]["reason"] and "zz-deep" in bad[0]["run_dir"]


def test_an_oversized_run_json_is_refused_by_its_size_unread(tmp_path):
    """A valid run.json padded to 8 MiB (200 MB in the attack: 440 MiB a scan) is refused by
    its size, not read: the scan of an alert allocates under 4 MiB."""
    ray = failed_run(tmp_path)
    big = tmp_path / "runs" / "zz-big"
    big.mkdir()
    (big / "run.json").write_text(json.dumps({"run_id": "big", "entrypoint": ["python"]})
                                  + " " * (8 << 20))
    svc = service(tmp_path, ray, Clock())
    tracemalloc.start()
    try:
        with capture_logs() as logs:
            assert svc.handle_message(alert("i-1")) == "submitted"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert any("over the" in r.get("reason", "") for r in logs
               if r["event"] == "autoresume_bad_run_json")


def test_a_deep_metrics_line_and_a_deep_config_yaml_of_the_run_itself_raise_nothing(tmp_path):
    """The alert's own run with a metrics.jsonl line and a config.yaml nested thousands deep:
    no heartbeat read, the task check refuses, nothing raised out of handle_message."""
    ray = failed_run(tmp_path)
    run_dir = tmp_path / "runs" / "run-a"
    (run_dir / "metrics.jsonl").write_text("[" * 8000 + "]" * 8000 + "\n")
    (run_dir / "config.yaml").write_text("task: " + "[" * 8000 + "]" * 8000 + "\n")
    meta = json.loads((run_dir / "run.json").read_text())
    meta["entrypoint"] += ["task.data.dir=/data"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused"
    assert "recorded no readable config.yaml" in audit(tmp_path)[0]["reason"]


def test_an_unexpected_error_for_one_run_is_dead_lettered_and_the_next_alert_handled(tmp_path):
    """Whatever goes wrong while handling one run's alert is audited and dead-lettered with the
    alert (it used to raise, so intake nacked it and Pub/Sub redelivered it forever)."""
    ray = failed_run(tmp_path)
    svc = service(tmp_path, ray, Clock())
    real_find = svc.registry.find

    def find(run_id):
        if run_id == "cursed":
            raise RecursionError("maximum recursion depth exceeded")
        return real_find(run_id)

    svc.registry.find = find  # type: ignore[method-assign]
    assert svc.handle_message(alert("i-0", "cursed"), message_id="m-0") == "error"
    assert svc.handle_message(alert("i-1")) == "submitted"
    dead = svc.dead_letters.read()
    assert [d["message_id"] for d in dead] == ["m-0"] and "RecursionError" in dead[0]["reason"]
    assert json.loads(dead[0]["payload"])["incident"]["incident_id"] == "i-0"
    assert [a["outcome"] for a in audit(tmp_path)] == ["error", "submitted"]


# ---- finding 4 (the record itself): another user's run.json, an alias of a run directory -----

def test_run_json_of_another_user_is_not_resubmitted(tmp_path):
    """run.json owned by another uid (autoresume runs as root here, the file is nobody's): no
    run is found, nothing submitted, the owner named in the log."""
    ray = failed_run(tmp_path)
    os.chown(tmp_path / "runs" / "run-a" / "run.json", 65534, 65534)
    svc = service(tmp_path, ray, Clock())
    with capture_logs() as logs:
        assert svc.handle_message(alert("i-1")) == "unknown_run"
    assert ray.submitted == []
    assert any("owned by uid 65534" in r.get("reason", "") for r in logs)


@pytest.mark.parametrize("what", ["dir", "file"])
def test_an_alias_of_a_run_is_not_that_run(tmp_path, what):
    """`runs/alias` a link to another folder (holding a run.json for `alias`), or a run.json
    that is a link: neither is a run; nothing is submitted."""
    ray = failed_run(tmp_path, "alias")
    real = tmp_path / "runs" / "alias"
    elsewhere = tmp_path / "elsewhere"
    real.rename(elsewhere)
    if what == "dir":
        real.symlink_to(elsewhere)
    else:
        real.mkdir()
        (real / "run.json").symlink_to(elsewhere / "run.json")
    svc = service(tmp_path, ray, Clock())
    with capture_logs() as logs:
        assert svc.handle_message(alert("i-1", "alias")) == "unknown_run"
    assert ray.submitted == []
    reason = next(r["reason"] for r in logs if r["event"] == "autoresume_bad_run_json")
    assert ("alias, not a run" if what == "dir" else "symbolic link") in reason


# ---- finding 4: a resubmission only resumes ---------------------------------------------------

DRIVER = ["python", "-m", "orchestrator.main"]
SUBMITTED = [*DRIVER, "--config", "/app/configs/v6e-16.yaml", "run.name=run-a",
             "events.pubsub.project=p", "events.pubsub.topic=tpu-orchestrator-events",
             "metrics.cloud_monitoring.project=p"]
ENV = {"env_vars": {"JAX_PLATFORMS": "tpu"}, "working_dir": "gcs://_ray_pkg_00aa.zip"}


def recorded_run(tmp_path: Path, argv: list[str], env: dict | None = None,
                 ray_env: dict | None = None) -> TableRay:
    """run-a as its driver recorded it (run.json: ``argv``, ``env``) and as Ray recorded its
    `--submission-id run-a-r0` (SUBMITTED with ENV, unless ``ray_env``), FAILED."""
    run_dir = make_run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(entrypoint=argv, runtime_env=env or ENV)
    (run_dir / "run.json").write_text(json.dumps(meta))
    ray = TableRay()
    ray.record("run-a-r0", SUBMITTED, ray_env or ENV)
    return ray


def restore_record(tmp_path: Path) -> None:
    run_json = tmp_path / "runs" / "run-a" / "run.json"
    meta = json.loads(run_json.read_text())
    meta.update(entrypoint=SUBMITTED, runtime_env=ENV)
    run_json.write_text(json.dumps(meta))


STEERING = [
    "events.inbox=true", "events.pubsub.emulator=true", "events.pubsub.project=evil",
    "events.pubsub.topic=elsewhere", "metrics.cloud_monitoring.project=evil",
    "cluster.mode=emulate", "run.total_steps=1", "checkpoint.ram.enabled=false",
    "controller.warm.standby_slices=0", "events.metadata.enabled=off",
]


@pytest.mark.parametrize("word", STEERING)
def test_a_word_the_run_was_not_submitted_with_is_refused(tmp_path, word):
    """run.json with one allowed word more than Ray recorded for the run's submission (the
    attack's inbox, emulator, other project, emulate, one step, protection off): nothing
    submitted, the word named; the run's own record, restored, is resumed (nothing lost)."""
    ray = recorded_run(tmp_path, [*SUBMITTED, word])
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused"
    assert ray.submitted == []
    reason = audit(tmp_path)[0]["reason"]
    assert "Ray recorded for run-a-r0" in reason and word in reason
    restore_record(tmp_path)
    assert svc.handle_message(alert("i-2")) == "submitted"
    assert ray.submitted[0][1].split()[:len(SUBMITTED)] == SUBMITTED


@pytest.mark.parametrize("old,new", [
    ("events.pubsub.project=p", "events.pubsub.project=evil"),
    ("metrics.cloud_monitoring.project=p", "metrics.cloud_monitoring.project=evil"),
    ("metrics.cloud_monitoring.project=p", None),
])
def test_a_recorded_word_changed_or_dropped_is_refused(tmp_path, old, new):
    """A destination moved to another project, or dropped (back to the config's): refused."""
    argv = [new if w == old else w for w in SUBMITTED]
    ray = recorded_run(tmp_path, [w for w in argv if w is not None])
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused" and ray.submitted == []


@pytest.mark.parametrize("name,value", [
    ("XLA_FLAGS", "--xla_dump_to=/runs/evil"),
    ("LIBTPU_INIT_ARGS", "--xla_dump_to=/runs/evil"),
])
def test_an_xla_env_var_the_run_was_not_submitted_with_is_refused(tmp_path, name, value):
    """XLA_FLAGS / LIBTPU_INIT_ARGS added by run.json (allowed names): refused, named."""
    ray = recorded_run(tmp_path, SUBMITTED,
                       {**ENV, "env_vars": {**ENV["env_vars"], name: value}})
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused" and ray.submitted == []
    assert f"env var {name}" in audit(tmp_path)[0]["reason"]


def test_another_uploaded_package_is_refused(tmp_path):
    """working_dir swapped for another package uploaded to the cluster (other code): refused."""
    ray = recorded_run(tmp_path, SUBMITTED, {**ENV, "working_dir": "gcs://_ray_pkg_66bb.zip"})
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused" and ray.submitted == []
    assert "working_dir" in audit(tmp_path)[0]["reason"]


def test_without_a_record_in_ray_pinned_settings_and_xla_env_are_refused(tmp_path):
    """Ray lists no command of the run (its job table was lost, or run.json no longer matches
    the id it records): a pinned setting or an XLA env var cannot be shown to be the run's, so
    it is refused; a record with none of them is resumed."""
    ray = recorded_run(tmp_path, [*SUBMITTED, "events.inbox=true"])
    del ray.entrypoints["run-a-r0"]
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused"
    assert "no record of the run's command" in audit(tmp_path)[0]["reason"]
    run_json = tmp_path / "runs" / "run-a" / "run.json"
    meta = json.loads(run_json.read_text())
    meta.update(entrypoint=[*DRIVER, "--config", "/app/configs/v6e-16.yaml"],
                runtime_env={"env_vars": {"XLA_FLAGS": "--xla_dump_to=/runs/evil"}})
    run_json.write_text(json.dumps(meta))
    assert svc.handle_message(alert("i-2")) == "refused"
    assert "XLA_FLAGS" in audit(tmp_path)[1]["reason"]
    meta.update(runtime_env={"env_vars": {"JAX_PLATFORMS": "tpu"}})
    run_json.write_text(json.dumps(meta))
    assert svc.handle_message(alert("i-3")) == "submitted"


def test_the_newest_submission_is_the_record_and_autoresumes_own_restart_passes(tmp_path):
    """r0 (the user's) failed, autoresume resubmitted r1 (the same command, run.run_dir pinned),
    r1 failed: r2 is resubmitted; then run.json is edited and r2 fails: nothing more."""
    ray = recorded_run(tmp_path, SUBMITTED)
    clock = Clock()
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1")) == "submitted"
    for sid, i in (("run-a-r1", "i-2"), ("run-a-r2", "i-3")):
        ray.finish(sid, JobStatus.FAILED)
        clock.t += 3600
        if sid == "run-a-r2":
            run_json = tmp_path / "runs" / "run-a" / "run.json"
            meta = json.loads(run_json.read_text())
            meta["entrypoint"] = [*SUBMITTED, "run.total_steps=1"]
            run_json.write_text(json.dumps(meta))
            assert svc.handle_message(alert(i)) == "refused"
        else:
            assert svc.handle_message(alert(i)) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1", "run-a-r2"]
    assert "Ray recorded for run-a-r2" in audit(tmp_path)[-1]["reason"]


# ---- low: redaction -------------------------------------------------------------------------

GHP = "ghp_" + "A1b2C3d4E5" * 4  # a GitHub token's shape (40 characters)
AZURE = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0a2V5PT0=;"
         "EndpointSuffix=core.windows.net")


def test_secrets_the_first_round_missed_are_redacted():
    """GPG_PASSPHRASE, SLACK_WEBHOOK_URL, AWS_CREDS, NPM_AUTH, PRIVKEY, an Azure AccountKey= and
    a ghp_ token under a neutral name lose their values; knobs keep theirs."""
    env = {"GPG_PASSPHRASE": "p", "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x",
           "AWS_CREDS": "c", "NPM_AUTH": "n", "PRIVKEY": "k", "STORAGE": AZURE, "NOTES": GHP,
           "JAX_PLATFORMS": "tpu", "TPU_PASSES": "3", "RAY_AUTH_MODE": "token", "PATH": "/bin"}
    out = redact_runtime_env({"env_vars": env, "pip": [f"--extra {AZURE}", f"x {GHP}"]})
    assert {k for k, v in out["env_vars"].items() if v == REDACTED} == {
        "GPG_PASSPHRASE", "SLACK_WEBHOOK_URL", "AWS_CREDS", "NPM_AUTH", "PRIVKEY", "STORAGE",
        "NOTES"}
    assert "c2VjcmV0" not in json.dumps(out) and GHP not in json.dumps(out)
    assert "AccountKey=<redacted>" in out["pip"][0]


def test_passphrase_and_webhook_in_the_recorded_argv_are_redacted():
    """`x.passphrase=...`, `--webhook URL`, and a token or AccountKey in any word: redacted."""
    argv = ["python", "-m", "orchestrator.main", "x.passphrase=hunter2", "--webhook",
            "https://hooks.slack.com/services/T/B/x", f"note={GHP}", f"conn={AZURE}"]
    out = redact_argv(argv)
    assert out[3:6] == [f"x.passphrase={REDACTED}", "--webhook", REDACTED]
    assert GHP not in " ".join(out) and "c2VjcmV0" not in " ".join(out)
