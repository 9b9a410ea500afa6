"""Autoresume's trust boundary (issue 29, items 2, 7, 8, 10), driven from outside as an attacker
would: a crafted run.json in the runs bucket (every job can write it), a job named like another
run's restart, forged or stray hold signals, floods. Ray is the in-memory job table behind the
service's own seam (tests/autoresume/test_service_unit.py); no cluster is started.

What must hold: nothing is submitted for a steered run.json, no job of another run is stopped,
and a dead run is still resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

import pytest

from orchestrator.autoresume import state as state_mod
from orchestrator.autoresume.config import load
from orchestrator.autoresume.entrypoint import ALLOWED_OVERRIDES, override_allowed
from orchestrator.autoresume.ray_jobs import belongs_to
from orchestrator.autoresume.runenv import (
    REDACTED,
    redact_argv,
    redact_runtime_env,
    secret_name,
)
from orchestrator.autoresume.state import JsonlLog
from orchestrator.config import RunConfig, load_config
from orchestrator.main import Driver
from orchestrator.shared.errors import ClusterUnreachableError, ConfigError
from policies.autoresume import JobStatus, Submission, next_submission_id, restart_of
from tests.autoresume.notifications import encode, notification
from tests.autoresume.test_service_unit import Clock, TableRay, audit, make_run, service

DRIVER = ["python", "-m", "orchestrator.main"]


def write_meta(run_dir: Path, **changes) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(changes)
    (run_dir / "run.json").write_text(json.dumps(meta))


def alert(incident_id: str, run_id: str = "run-a", **kw) -> bytes:
    return encode(notification(incident_id=incident_id, run_id=run_id, **kw))


def stale_heartbeat(run_dir: Path) -> None:
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_time": 0.0}) + "\n")


def config_leaves(cls: type = RunConfig, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += config_leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


# ---- item 2: a look-alike job id is not the run's ---------------------------------------------

def test_look_alike_job_is_not_stopped_and_the_dead_run_is_resumed(tmp_path):
    """Run `llm` died; `llm-run-7-r9` (another run's healthy job) is neither stopped nor counted
    in the next id: `llm` is resubmitted as llm-r1."""
    run_dir = make_run(tmp_path, "llm")
    stale_heartbeat(run_dir)
    ray, clock = TableRay(), Clock()
    ray.jobs["llm-r0"] = Submission(submission_id="llm-r0", status=JobStatus.FAILED,
                                    start_time=clock.t - 9000)
    ray.jobs["llm-run-7-r9"] = Submission(submission_id="llm-run-7-r9", status=JobStatus.RUNNING,
                                          start_time=clock.t - 5000)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "llm", started_at=int(clock.t - 100))) == "submitted"
    assert ray.stopped == [] and ray.jobs["llm-run-7-r9"].status is JobStatus.RUNNING
    assert [s for s, _, _ in ray.submitted] == ["llm-r1"]


def test_look_alike_stopped_job_does_not_read_as_a_deliberate_stop(tmp_path):
    """Another run's STOPPED `llm-run-7-r5`, newer than llm's FAILED r0, does not hold `llm`."""
    make_run(tmp_path, "llm")
    ray, clock = TableRay(), Clock()
    ray.jobs["llm-r0"] = Submission(submission_id="llm-r0", status=JobStatus.FAILED,
                                    start_time=clock.t - 9000)
    ray.jobs["llm-run-7-r5"] = Submission(submission_id="llm-run-7-r5",
                                          status=JobStatus.STOPPED, start_time=clock.t - 100)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "llm")) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["llm-r1"]


@pytest.mark.parametrize("sid,n", [
    ("llm-r0", 0), ("llm-r12", 12), ("llm", None), ("llm-run-7-r0", None), ("llm-r", None),
    ("llm-r1x", None), ("llm-r-1", None), ("llm-r\u0663", None), ("xllm-r1", None),
])
def test_restart_of_matches_the_whole_id(sid, n):
    """Only `<run_id>-r<digits>` exactly; belongs_to and next_submission_id share the rule."""
    assert restart_of("llm", sid) == n
    assert belongs_to("llm", sid, None) is (sid == "llm" or n is not None)
    assert next_submission_id("llm", (sid,)) == f"llm-r{(n or 0) + 1}"


# ---- item 7: run.json cannot steer the resubmission -------------------------------------------

@pytest.mark.parametrize("name", [
    "HOME", "JAX_COMPILATION_CACHE_DIR", "TPU_ORCH_EXECUTABLES_DIR", "TPU_LIBRARY_PATH",
    "OPENSSL_CONF", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "http_proxy",
    "ALL_PROXY", "NO_PROXY", "PYTHONWARNINGS", "PUBSUB_EMULATOR_HOST", "RAY_ADDRESS",
])
def test_env_var_off_the_allow_list_submits_nothing(tmp_path, name):
    """A run.json env var that could steer code, certificates, proxies or caches: refused."""
    run_dir = make_run(tmp_path)
    write_meta(run_dir, runtime_env={"env_vars": {"JAX_PLATFORMS": "tpu", name: "/runs/evil"}})
    ray = TableRay()
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused"
    assert ray.submitted == [] and name in audit(tmp_path)[0]["reason"]


def steering_args(tmp_path: Path) -> list[list[str]]:
    victim = str(tmp_path / "runs" / "victim")
    return [
        ["compile.dir=/runs/evil/executables"],
        [f"run.run_dir={victim}"],
        ["run.run_dir=runs/run-a"],  # relative: wherever the job's cwd is
        [f"run..run_dir={victim}"],  # the driver reads this as run.run_dir
        [f" run.run_dir={victim}"],
        [f"run={{run_dir: {victim}}}"],
        ["run.name=victim"],
        ["--config", f"{victim}/config.yaml"],
        [f"--config={victim}/config.yaml"],
        ["--config", "../../runs/victim/config.yaml"],
        ["--conf", "/app/configs/x.yaml"],  # argparse would take the abbreviation
        ["-h"],
        ["--", "compile.dir=/x"],
        ["cluster.address=ray://evil:10001"],
        ["events.pubsub.subscription=projects/p/subscriptions/tpu-events-victim"],
        ["events.metadata.endpoint=http://evil"],
        ["metrics.cloud_monitoring.job=victim"],
        ["controller.chaos=[{kind: kill, at_step: 1}]"],
        ["stray-word"],
        ["run.run_dir=/runs/run-a\x00"],
    ]


@pytest.mark.parametrize("index", range(20))
def test_steering_override_submits_nothing(tmp_path, index):
    """Words after `-m orchestrator.main` that point the run elsewhere: refused, audited."""
    args = steering_args(tmp_path)[index]
    run_dir = make_run(tmp_path)
    write_meta(run_dir, entrypoint=[*DRIVER, *args])
    ray = TableRay()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused"
    assert ray.submitted == [] and audit(tmp_path)[0]["outcome"] == "refused"


def test_deploy_style_entrypoint_is_resubmitted_as_is(tmp_path):
    """The README's submission (image config, run name and dir, project settings), as Ray
    recorded it for `--submission-id llm-001-r0`, passes."""
    run_dir = make_run(tmp_path, "llm-001")
    argv = [*DRIVER, "--config", "/app/configs/v6e-16.yaml", "run.name=llm-001",
            f"run.run_dir={run_dir}", "events.pubsub.project=p",
            "events.pubsub.topic=tpu-orchestrator-events", "events.metadata.enabled=off",
            "metrics.cloud_monitoring.enabled=true", "metrics.cloud_monitoring.project=p"]
    write_meta(run_dir, entrypoint=argv)
    ray = TableRay()
    ray.record("llm-001-r0", argv)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1", "llm-001")) == "submitted"
    assert ray.submitted[0][1].split() == argv


def test_symlinked_run_dir_naming_another_run_is_refused(tmp_path):
    """run.run_dir through a symlink to the victim's folder is not this folder."""
    victim = make_run(tmp_path, "victim")
    run_dir = make_run(tmp_path)
    (run_dir / "alias").symlink_to(victim)
    write_meta(run_dir, entrypoint=[*DRIVER, f"run.run_dir={run_dir / 'alias'}"])
    ray = TableRay()
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "refused" and ray.submitted == []


def copied_victim(tmp_path: Path, victim_argv: list[str]) -> tuple[TableRay, Clock]:
    """The victim runs `victim-job`; the attacker's run.json copies its argv and its job id."""
    victim = make_run(tmp_path, "victim")
    write_meta(victim, entrypoint=victim_argv, ray_job_submission_id="victim-job")
    evil = make_run(tmp_path, "evil")
    write_meta(evil, entrypoint=victim_argv, ray_job_submission_id="victim-job")
    stale_heartbeat(evil)
    ray, clock = TableRay(), Clock()
    ray.jobs["victim-job"] = Submission(submission_id="victim-job", status=JobStatus.RUNNING,
                                        start_time=clock.t - 5000)
    ray.entrypoints["victim-job"] = " ".join(victim_argv)
    return ray, clock


def test_copied_run_json_with_the_victims_run_dir_stops_nothing(tmp_path):
    """The victim's argv names its own run.run_dir: the attacker's copy is refused, not acted on,
    and the victim's job keeps running."""
    argv = [*DRIVER, f"run.run_dir={tmp_path / 'runs' / 'victim'}", "run.total_steps=9"]
    ray, clock = copied_victim(tmp_path, argv)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "evil", started_at=int(clock.t - 100))) == "refused"
    assert ray.stopped == [] and ray.submitted == []


def test_copied_run_json_without_a_run_dir_stops_nothing(tmp_path):
    """The victim's argv names no run dir: the id it records is contested, so it is not the
    attacker's; the attacker's run is resubmitted pinned to its own folder, the victim runs on.
    (A pinned setting such as run.total_steps in the copy would be refused: Ray records no
    command of the attacker's run, tests/security/test_autoresume_records.py.)"""
    ray, clock = copied_victim(tmp_path, [*DRIVER, "run.seed=9"])
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "evil", started_at=int(clock.t - 100))) == "submitted"
    assert ray.stopped == [] and ray.jobs["victim-job"].status is JobStatus.RUNNING
    sid, line, _ = ray.submitted[0]
    assert sid == "evil-r1" and line.endswith(f"run.run_dir={tmp_path / 'runs' / 'evil'}")


def test_config_roots_must_be_absolute_directories():
    """A relative config root would trust wherever the job's cwd is: refused, setting named."""
    with pytest.raises(ConfigError, match=r"config_roots\[1\]"):
        load(None, ["config_roots=[/app/configs, configs]"])
    assert load(None, ["config_roots=[/etc/runs]"]).config_roots == ("/etc/runs",)


def test_override_allow_list_names_real_settings_and_no_paths():
    """Every allowed entry is a RunConfig section or setting; path/URL/identity keys are not."""
    leaves = config_leaves()
    for entry in ALLOWED_OVERRIDES:
        assert any(k == entry or k.startswith(entry + ".") for k in leaves), entry
    for key in ("compile.dir", "cluster.address", "events.pubsub.subscription",
                "events.pubsub.emulator_host", "events.pubsub.filters", "events.metadata.endpoint",
                "metrics.cloud_monitoring.endpoint", "metrics.cloud_monitoring.job",
                "controller.chaos", "run"):
        assert not override_allowed(key), key


# ---- item 8: bounded logs, cheap checks first, bounded retries, forged signals ---------------

def test_audit_and_dead_letters_rotate_by_size(tmp_path):
    """A flood of garbage keeps dead_letters.jsonl and its rotations under the bound."""
    svc = service(tmp_path, TableRay(), Clock())
    svc.dead_letters = JsonlLog(svc.dead_letters.path, max_bytes=4096, keep=2)
    for i in range(300):
        assert svc.handle_message(b"{garbage " + b"x" * 100, message_id=f"m{i}") == "dead_letter"
    files = svc.dead_letters.files()
    assert len(files) == 3 and all(os.path.getsize(f) <= 4096 for f in files)
    assert svc.dead_letters.read()[-1]["message_id"] == "m299"
    assert state_mod.LOG_MAX_BYTES > 0 and svc.audit.max_bytes == state_mod.LOG_MAX_BYTES


def test_duplicate_is_answered_before_scanning_runs_or_asking_ray(tmp_path):
    """A redelivered incident costs no glob of run.json files and no Ray job listing."""
    make_run(tmp_path)
    ray = TableRay()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "submitted"
    calls: list[str] = []
    svc.registry.find = lambda run_id: calls.append("find")  # type: ignore[method-assign]
    ray.run_submissions = lambda *a: calls.append("list")  # type: ignore[method-assign]
    assert svc.handle_message(alert("i-1")) == "nothing"
    assert calls == [] and "duplicate" in audit(tmp_path)[-1]["reason"]


def test_pending_retries_are_capped_per_run(tmp_path):
    """Ray down and a flood of incidents for one run: a few retries are kept, the rest audited."""
    make_run(tmp_path)
    ray = TableRay()

    def down(*a):
        raise ClusterUnreachableError("down")

    ray.run_submissions = down  # type: ignore[method-assign]
    svc = service(tmp_path, ray, Clock())
    for i in range(40):
        assert svc.handle_message(alert(f"i-{i}")) == "ray_unreachable"
    assert len(svc.state.pending) == state_mod.MAX_PENDING_PER_RUN
    assert any(a.get("outcome") == "not_scheduled" for a in audit(tmp_path))


def test_forged_closed_for_a_dead_run_blocks_nothing(tmp_path):
    """A CLOSED that Ray contradicts (the run is dead) is not honoured: the OPEN still resumes."""
    make_run(tmp_path)
    ray = TableRay()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1", state="closed")) == "closed_unverified"
    assert svc.handle_message(alert("i-1")) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1"]


def test_forged_closed_does_not_drop_a_scheduled_resume(tmp_path):
    """During backoff a CLOSED for the dead run leaves the scheduled resubmission in place."""
    make_run(tmp_path)
    ray, clock = TableRay(), Clock()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, clock, backoff_base_s=30.0)
    assert svc.handle_message(alert("i-1")) == "submitted"
    ray.finish("run-a-r1", JobStatus.FAILED)
    clock.t += 5
    assert svc.handle_message(alert("i-2")) == "scheduled"
    assert svc.handle_message(alert("i-2", state="closed")) == "closed_unverified"
    clock.t += 30
    assert svc.process_due() == 1
    assert [s for s, _, _ in ray.submitted] == ["run-a-r1", "run-a-r2"]


def held_run(tmp_path: Path) -> tuple[Path, TableRay]:
    run_dir = make_run(tmp_path)
    ray = TableRay()
    ray.jobs["run-a-r0"] = Submission(submission_id="run-a-r0", status=JobStatus.FAILED)
    return run_dir, ray


def test_stray_marker_in_a_folder_others_can_write_is_ignored(tmp_path):
    """DO_NOT_RESUME in a world-writable run directory could be anyone's: resumed, audited."""
    run_dir, ray = held_run(tmp_path)
    (run_dir / "DO_NOT_RESUME").write_text("gotcha")
    run_dir.chmod(0o777)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "submitted"
    assert "writable by others" in audit(tmp_path)[0]["reason"]


def test_symlinked_marker_is_ignored(tmp_path):
    """A DO_NOT_RESUME that is a symlink (to any file) does not hold the run."""
    run_dir, ray = held_run(tmp_path)
    (tmp_path / "elsewhere").write_text("x")
    (run_dir / "DO_NOT_RESUME").symlink_to(tmp_path / "elsewhere")
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "submitted"


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_marker_of_another_user_is_ignored(tmp_path):
    """A DO_NOT_RESUME owned by someone other than the run's user does not hold the run."""
    run_dir, ray = held_run(tmp_path)
    (run_dir / "DO_NOT_RESUME").write_text("not yours")
    os.chown(run_dir / "DO_NOT_RESUME", 65534, 65534)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1")) == "submitted"
    assert "not the run's user" in audit(tmp_path)[0]["reason"]


# ---- item 10: redaction, in one place ---------------------------------------------------------

def test_secret_env_names_and_url_credentials_are_redacted():
    """*_PASS, *_PAT, JWT, *_SAS and credentials in any URL of a value lose their values."""
    env = {"DB_PASS": "p", "GITHUB_PAT": "ghp_x", "JWT": "j", "MY_JWT": "j",
           "AZURE_STORAGE_SAS": "sv=1", "PIP_EXTRA_INDEX_URL":
           "https://pypi.example/simple https://user:secret@host/simple",
           "GIT_URL": "https://ghp_abc@github.example/x.git", "JAX_PLATFORMS": "tpu",
           "LD_LIBRARY_PATH": "/usr/lib", "PATH": "/bin", "TPU_PASSES": "3"}
    out = redact_runtime_env({"env_vars": env})["env_vars"]
    assert {k for k, v in out.items() if v == REDACTED} == {
        "DB_PASS", "GITHUB_PAT", "JWT", "MY_JWT", "AZURE_STORAGE_SAS", "PIP_EXTRA_INDEX_URL",
        "GIT_URL"}


def test_pip_index_url_credentials_anywhere_in_the_runtime_env_are_redacted():
    """Credentials in a pip option list (not an env var) are scrubbed, the rest kept."""
    env = {"pip": ["--index-url https://user:secret@host/simple", "numpy"],
           "working_dir": "gcs://_ray_pkg_ab.zip"}
    out = redact_runtime_env(env)
    assert "secret" not in json.dumps(out)
    assert out["pip"] == [f"--index-url https://{REDACTED}@host/simple", "numpy"]
    assert out["working_dir"] == env["working_dir"]


def test_secret_overrides_and_flags_in_the_recorded_entrypoint_are_redacted(tmp_path):
    """run.json as the driver writes it holds no `foo.password=`, `--token X` or URL secret."""
    argv = ["foo.password=hunter2", "--token", "tok123", "--api-key=k3y", "model.num_layers=2",
            "x.index=https://u:s3cr3t@host/simple"]
    cfg = load_config(None, ["run.name=llm-1", f"run.run_dir={tmp_path / 'run'}"])
    Driver(cfg, argv=argv)._prepare_run_dir()
    text = (tmp_path / "run" / "run.json").read_text()
    for secret in ("hunter2", "tok123", "k3y", "s3cr3t"):
        assert secret not in text
    meta = json.loads(text)
    assert meta["entrypoint"][3:] == [
        f"foo.password={REDACTED}", "--token", REDACTED, f"--api-key={REDACTED}",
        "model.num_layers=2", f"x.index=https://{REDACTED}@host/simple"]
    assert redact_argv(meta["entrypoint"]) == meta["entrypoint"]


def test_no_real_setting_looks_secret():
    """Redacting the argv never hides a real config setting (a resumed run keeps its config)."""
    assert [k for k in config_leaves() if secret_name(k)] == []
