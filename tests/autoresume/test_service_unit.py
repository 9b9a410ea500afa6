"""Service logic without Ray or Pub/Sub: parsing, dead letters, state, budget, auth, backoff.

Ray itself is replaced only through the service's own ``RayJobsApi`` seam (a small in-memory
job table); the real JobSubmissionClient is exercised in test_service_ray.py.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.autoresume.config import AutoresumeConfig, PolicyConfig, RayJobsConfig, load
from orchestrator.autoresume.incidents import incident_from_notification
from orchestrator.autoresume.ray_jobs import RayJobs, SubmissionRefused, auth_headers, belongs_to
from orchestrator.autoresume.resume_only import RecordedCommand
from orchestrator.autoresume.service import AutoresumeService
from orchestrator.events.model import MalformedEvent
from orchestrator.shared.errors import ConfigError
from policies.autoresume import IncidentKind, IncidentState, JobStatus, Submission
from tests.autoresume.notifications import encode, notification


class TableRay:
    """In-memory job table behind the RayJobsApi seam (submit = PENDING, then set by the test)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Submission] = {}
        self.submitted: list[tuple[str, str, dict]] = []
        self.entrypoints: dict[str, str] = {}  # what each job runs, as Ray reports it
        self.runtime_envs: dict[str, dict] = {}  # and with which runtime_env
        self.stopped: list[str] = []
        self.t = 0.0

    def run_submissions(self, run_id, recorded_ids=(), entrypoint=()):
        return tuple(s for k, s in self.jobs.items()
                     if belongs_to(run_id, k, None, recorded_ids, entrypoint,
                                   self.entrypoints.get(k)))

    def submit(self, *, submission_id, entrypoint, runtime_env, metadata):
        if submission_id in self.jobs:
            raise SubmissionRefused(f"Job with submission_id {submission_id} already exists")
        self.submitted.append((submission_id, entrypoint, dict(runtime_env)))
        self.entrypoints[submission_id] = entrypoint
        self.runtime_envs[submission_id] = dict(runtime_env)
        self.jobs[submission_id] = Submission(submission_id=submission_id,
                                              status=JobStatus.PENDING, start_time=self.t)

    def stop(self, submission_id):
        self.stopped.append(submission_id)
        s = self.jobs[submission_id]
        self.jobs[submission_id] = Submission(submission_id=submission_id,
                                              status=JobStatus.STOPPED, start_time=s.start_time)

    def status(self, submission_id):
        return self.jobs[submission_id].status

    def command(self, submission_id):
        if submission_id not in self.entrypoints:
            return None
        return RecordedCommand(submission_id=submission_id,
                               entrypoint=self.entrypoints[submission_id],
                               runtime_env=self.runtime_envs.get(submission_id, {}))

    def record(self, submission_id: str, argv: list[str], runtime_env: dict | None = None,
               status: JobStatus = JobStatus.FAILED, start_time: float | None = None) -> None:
        """A submission Ray knows, with what it ran (as `ray job submit` leaves it)."""
        self.jobs[submission_id] = Submission(submission_id=submission_id, status=status,
                                              start_time=start_time)
        self.entrypoints[submission_id] = shlex.join(argv)
        self.runtime_envs[submission_id] = dict(runtime_env or {})

    def finish(self, sid: str, status: JobStatus) -> None:
        self.jobs[sid] = Submission(submission_id=sid, status=status,
                                    start_time=self.jobs[sid].start_time)


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_run(root: Path, run_id: str = "run-a") -> Path:
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "job": run_id, "incarnation": 0,
        "entrypoint": ["python", "-m", "orchestrator.main", "--config", "tiny yaml.yaml"],
        "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu"}}}))
    return run_dir


def service(tmp_path: Path, ray: TableRay, clock: Clock, **policy) -> AutoresumeService:
    cfg = AutoresumeConfig(state_dir=str(tmp_path / "state"), run_dirs=(str(tmp_path / "runs/*"),),
                           policy=PolicyConfig(**{"startup_grace_s": 0.0, **policy}))
    return AutoresumeService(cfg, ray=ray, clock=clock, sleep=lambda s: None)


def audit(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "state/audit.jsonl").read_text().splitlines()]


def test_real_format_notification_becomes_incident():
    """run id from metric labels, kind from the policy user label, state open."""
    inc, event = incident_from_notification(notification(incident_id="i-1", run_id="run-a"),
                                            now=5.0)
    assert (inc.run_id, inc.kind, inc.state, inc.started_at) == (
        "run-a", IncidentKind.HEARTBEAT_ABSENT, IncidentState.OPEN, 1_700_000_000.0)
    assert event.id == "alert:i-1:open"


def test_kind_falls_back_to_metric_type():
    """A policy without the kind label still maps .../mfu to mfu_low."""
    payload = notification(incident_id="i-2", run_id="run-a", metric="mfu")
    del payload["incident"]["policy_user_labels"]["kind"]
    assert incident_from_notification(payload, now=0)[0].kind is IncidentKind.MFU_LOW


def test_notification_without_run_is_malformed():
    """No run label anywhere -> MalformedEvent naming the grouping fix."""
    payload = notification(incident_id="i-3", run_id="run-a")
    payload["incident"]["metric"]["labels"] = {}
    payload["incident"]["resource"]["labels"] = {}
    with pytest.raises(MalformedEvent, match="names no run"):
        incident_from_notification(payload, now=0)


def test_dead_job_resubmitted_with_same_entrypoint_and_env(tmp_path):
    """FAILED r0 -> submit r1 with run.json's argv (pinned to its run directory) and
    runtime_env; duplicate does nothing."""
    run_dir = make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, clock)
    msg = encode(notification(incident_id="i-1", run_id="run-a"))
    assert svc.handle_message(msg) == "submitted"
    assert ray.submitted == [("run-a-r1",
                              "python -m orchestrator.main --config 'tiny yaml.yaml' "
                              f"run.run_dir={run_dir}",
                              {"env_vars": {"JAX_PLATFORMS": "cpu"}})]
    assert svc.handle_message(msg) == "nothing"
    assert len(ray.submitted) == 1
    # a restarted service (same state dir) also treats it as a duplicate
    assert service(tmp_path, ray, clock).handle_message(msg) == "nothing"
    assert [a["outcome"] for a in audit(tmp_path)] == ["submitted", "nothing", "nothing"]
    assert "duplicate" in audit(tmp_path)[-1]["reason"]


def test_closed_before_open_does_nothing(tmp_path):
    """Reordered delivery: the closed notification arrives first (Ray confirms the run is live);
    the open one, though the run's heartbeat looks stalled, is then ignored."""
    make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r1"] = Submission(submission_id="run-a-r1", status=JobStatus.RUNNING,
                                      start_time=clock.t - 5000)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(encode(notification(incident_id="i-9", run_id="run-a",
                                                  state="closed"))) == "closed"
    assert svc.handle_message(encode(notification(incident_id="i-9", run_id="run-a"))) == "nothing"
    assert ray.submitted == [] and ray.stopped == []


@pytest.mark.parametrize("data,reason", [
    (b"\xff\xfe", "not JSON"),
    (b"{not json", "not JSON"),
    (json.dumps({"hello": 1}).encode(), "incident"),
    (json.dumps({"version": "1.2", "incident": {"incident_id": "x", "state": "weird"}}).encode(),
     "state"),
])
def test_malformed_is_dead_lettered(tmp_path, data, reason):
    """Bad payloads go to dead_letters.jsonl with a reason; nothing is submitted."""
    ray = TableRay()
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(data, message_id="m1") == "dead_letter"
    text = (tmp_path / "state/dead_letters.jsonl").read_text()
    letters = [json.loads(x) for x in text.splitlines() if x]
    assert len(letters) == 1 and reason in letters[0]["reason"] and letters[0]["message_id"] == "m1"
    assert ray.submitted == []


def test_unknown_run_does_nothing(tmp_path):
    """An incident for a run we have no directory for is recorded and ignored."""
    make_run(tmp_path)
    ray = TableRay()
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="other"))) == (
        "unknown_run")
    assert ray.submitted == []


def test_budget_spent_gives_up_with_final_log_line(tmp_path):
    """Each new incident restarts once; after max_restarts the run is given up, loudly, for good."""
    make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, clock, max_restarts=2, backoff_base_s=0.0)
    outcomes = []
    with capture_logs() as logs:
        for i in range(4):
            clock.t += 60
            outcomes.append(svc.handle_message(encode(notification(incident_id=f"i-{i}",
                                                                   run_id="run-a"))))
            for sid in list(ray.jobs):
                if ray.jobs[sid].status is JobStatus.PENDING:
                    ray.finish(sid, JobStatus.FAILED)
    assert outcomes == ["submitted", "submitted", "gave_up", "nothing"]
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1", "run-a-r2"]
    final = [e for e in logs if e["event"] == "autoresume_gave_up"]
    assert len(final) == 1 and "will not resubmit" in final[0]["message"]
    svc.reset_run("run-a")
    clock.t += 60
    assert svc.handle_message(encode(notification(incident_id="i-9", run_id="run-a"))) == (
        "submitted")


def test_backoff_schedules_and_process_due_acts(tmp_path):
    """A quick second death waits backoff_base_s, then process_due resubmits."""
    make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, clock, backoff_base_s=30.0)
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "submitted")
    ray.finish("run-a-r1", JobStatus.FAILED)
    clock.t += 5
    assert svc.handle_message(encode(notification(incident_id="i-2", run_id="run-a"))) == (
        "scheduled")
    assert svc.next_due() == pytest.approx(clock.t + 25)
    assert svc.process_due() == 0
    clock.t += 26
    assert svc.process_due() == 1
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1", "run-a-r2"]


def test_stalled_running_job_is_stopped_then_resubmitted(tmp_path):
    """RUNNING but the heartbeat (metrics.jsonl) is old -> stop r1, submit r2."""
    run_dir = make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r1"] = Submission(submission_id="run-a-r1", status=JobStatus.RUNNING,
                                      start_time=clock.t - 5000)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 7, "wall_time": clock.t - 4000})
                                           + "\n")
    svc = service(tmp_path, ray, clock, stall_after_s=900.0)
    msg = notification(incident_id="i-1", run_id="run-a", started_at=int(clock.t - 100))
    assert svc.handle_message(encode(msg)) == "submitted"
    assert ray.jobs["run-a-r1"].status is JobStatus.STOPPED
    assert ray.submitted[0][0] == "run-a-r2"


def test_unreachable_ray_retries_with_backoff_never_raises(tmp_path):
    """Real RayJobs against a closed port: scheduled retries, doubling delay, no exception."""
    make_run(tmp_path)
    clock = Clock()
    cfg = AutoresumeConfig(state_dir=str(tmp_path / "state"), run_dirs=(str(tmp_path / "runs/*"),),
                           ray=RayJobsConfig(address="http://127.0.0.1:9", auth_mode="disabled",
                                             retry_base_s=5.0, retry_max_s=15.0))
    svc = AutoresumeService(cfg, ray=RayJobs(cfg.ray), clock=clock)
    with capture_logs() as logs:
        assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
            "ray_unreachable")
        delays = []
        for _ in range(3):
            due = svc.next_due()
            delays.append(due - clock.t)
            clock.t = due
            assert svc.process_due() == 1
    assert delays == [5.0, 10.0, 15.0]
    warned = [e for e in logs if e["event"] == "autoresume_ray_unreachable"]
    assert [e["attempt"] for e in warned] == [1, 2, 3, 4]


def test_recorded_submission_id_is_the_runs_when_it_runs_the_runs_entrypoint(tmp_path):
    """run.json's ray_job_submission_id (a user-chosen name) counts when Ray runs our argv."""
    run_dir = make_run(tmp_path, "run-a")
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(ray_job_submission_id="raysubmit_x")
    (run_dir / "run.json").write_text(json.dumps(meta))
    ray, clock = TableRay(), Clock()
    ray.jobs["raysubmit_x"] = Submission(submission_id="raysubmit_x", status=JobStatus.RUNNING,
                                         start_time=clock.t - 10)
    ray.entrypoints["raysubmit_x"] = "python3 -m orchestrator.main --config 'tiny yaml.yaml'"
    svc = service(tmp_path, ray, clock, startup_grace_s=600.0)
    assert svc.handle_message(encode(notification(incident_id="i-1", run_id="run-a"))) == (
        "nothing")
    ray.finish("raysubmit_x", JobStatus.FAILED)
    assert svc.handle_message(encode(notification(incident_id="i-2", run_id="run-a"))) == (
        "submitted")
    assert ray.submitted[0][0] == "run-a-r1"


def test_auth_headers_modes(tmp_path):
    """token mode reads token_file, then RAY_AUTH_TOKEN; missing token names the fix."""
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    assert auth_headers(RayJobsConfig(auth_mode="token", token_file=str(tok)), env={}) == {
        "Authorization": "Bearer s3cret"}
    assert auth_headers(RayJobsConfig(auth_mode="token"), env={"RAY_AUTH_TOKEN": "abc"}) == {
        "Authorization": "Bearer abc"}
    assert auth_headers(RayJobsConfig(auth_mode="disabled"), env={"RAY_AUTH_TOKEN": "x"}) == {}
    with pytest.raises(ConfigError, match=r"ray\.token_file"):
        auth_headers(RayJobsConfig(auth_mode="token", token_file=str(tmp_path / "nope")), env={})


def test_config_errors_name_the_setting(tmp_path):
    """Bad settings raise ConfigError with the dotted path."""
    with pytest.raises(ConfigError, match=r"ray\.address"):
        load(None, ["ray.address=127.0.0.1:8265"])
    with pytest.raises(ConfigError, match=r"policy.act_on\[0\]"):
        load(None, ["policy.act_on=[bogus]"])
    with pytest.raises(ConfigError, match="subscription"):
        load(None, ["subscription=alerts"])
    cfg = load(None, ["policy.max_restarts=2", "ray.auth_mode=disabled"])
    assert cfg.policy.rules().max_restarts == 2
