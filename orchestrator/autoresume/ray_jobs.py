"""The one seam to the Ray job API (``ray.job_submission.JobSubmissionClient``).

Everything the service asks Ray goes through ``RayJobs``; failures to reach the cluster become
``ClusterUnreachableError`` (retryable: the service backs off), so no Ray or HTTP exception type
leaks into the decision code. Ray's client sets no HTTP timeout, so every call (the client's
construction probes the head too) runs bounded by ``ray.request_timeout_s``. Ray 2.60 requires a
token by default: see ``auth_headers``.

A submission belongs to a run only if Ray says so: tagged with the run id in its metadata, named
``<run_id>`` / ``<run_id>-r<n>``, or recorded in run.json *and* running the run's own entrypoint.
An id run.json lists is never enough alone: run.json is writable by every job, and autoresume may
stop the submissions it believes are the run's.
"""

from __future__ import annotations

import os
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from orchestrator.autoresume.config import RayJobsConfig
from orchestrator.autoresume.resume_only import RecordedCommand
from orchestrator.shared.errors import ClusterUnreachableError, ConfigError
from policies.autoresume import JobStatus, Submission, restart_of

log = structlog.get_logger(__name__)

RUN_ID_METADATA = "tpu_orchestrator_run_id"
INCIDENT_METADATA = "tpu_orchestrator_incident"


class SubmissionRefused(Exception):
    """Ray refused the submission id: someone already submitted it (a duplicate, not an error)."""


class RayJobsApi(Protocol):
    """What the service needs from Ray; the real one is ``RayJobs``."""

    def run_submissions(
        self, run_id: str, recorded_ids: tuple[str, ...] = (), entrypoint: Sequence[str] = ()
    ) -> tuple[Submission, ...]: ...
    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: Mapping[str, Any],
               metadata: Mapping[str, str]) -> None: ...
    def stop(self, submission_id: str) -> None: ...
    def status(self, submission_id: str) -> JobStatus: ...
    def command(self, submission_id: str) -> RecordedCommand | None: ...


def auth_headers(cfg: RayJobsConfig, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Bearer token header for auth_mode=token; {} otherwise (auto lets Ray add its own)."""
    if cfg.auth_mode != "token":
        return {}
    env = os.environ if env is None else env
    token = ""
    source = ""
    for path, what in ((cfg.token_file, "ray.token_file"),):
        if path:
            token, source = _read_token(path, what), what
    if not token and env.get("RAY_AUTH_TOKEN", "").strip():
        token, source = env["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    if not token and env.get("RAY_AUTH_TOKEN_PATH"):
        token, source = _read_token(env["RAY_AUTH_TOKEN_PATH"], "RAY_AUTH_TOKEN_PATH"), "path"
    default = os.path.expanduser("~/.ray/auth_token")
    if not token and os.path.isfile(default):
        token, source = _read_token(default, default), default
    if not token:
        raise ConfigError("ray.auth_mode", "is token but no Ray auth token was found",
                          "set ray.token_file, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (the token "
                          "of the cluster: `ray get-auth-token` / its <cluster>-ray-auth-token "
                          "Secret), or "
                          "ray.auth_mode=disabled if the cluster runs with RAY_AUTH_MODE=disabled")
    log.debug("autoresume_ray_token", source=source)
    return {"Authorization": f"Bearer {token}"}


def _read_token(path: str, what: str) -> str:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ConfigError("ray.token_file", f"cannot read the token from {what} ({exc})",
                          "point it at a readable file holding the cluster's token") from None
    if not token:
        raise ConfigError("ray.token_file", f"{what} is empty", "write the token into it")
    return token


def _status(value: object) -> JobStatus:
    text = str(getattr(value, "value", value)).upper()
    try:
        return JobStatus(text)
    except ValueError:
        return JobStatus.UNKNOWN


def _seconds(ms: object) -> float | None:
    return float(ms) / 1000.0 if isinstance(ms, (int, float)) and ms > 0 else None


def same_program(job_entrypoint: object, argv: Sequence[str]) -> bool:
    """The job's shell line runs ``argv`` (the interpreter's name may differ: python/python3)."""
    if not isinstance(job_entrypoint, str) or len(argv) < 2:
        return False
    try:
        words = shlex.split(job_entrypoint)
    except ValueError:
        return False
    return len(words) >= 2 and words[1:] == list(argv[1:])


def belongs_to(run_id: str, submission_id: str | None, metadata: Mapping[str, str] | None,
               recorded_ids: tuple[str, ...] = (), entrypoint: Sequence[str] = (),
               job_entrypoint: object = None) -> bool:
    """Tagged with the run id, named exactly <run_id> or <run_id>-r<n> (``restart_of``: the
    whole id, so ``llm-run-7-r0`` is not run ``llm``'s), or recorded in run.json and running
    the run's entrypoint. A job name is no alias: names are not unique."""
    if (metadata or {}).get(RUN_ID_METADATA) == run_id:
        return True
    if not submission_id:
        return False
    if submission_id == run_id or restart_of(run_id, submission_id) is not None:
        return True
    return submission_id in recorded_ids and same_program(job_entrypoint, entrypoint)


class RayJobs:
    """``JobSubmissionClient`` behind the ``RayJobsApi`` seam; the client is made lazily."""

    client_factory: Callable[..., Any] | None = None  # tests may swap the factory

    def __init__(self, cfg: RayJobsConfig) -> None:
        self._cfg = cfg
        self._headers = auth_headers(cfg)
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            factory = self.client_factory
            if factory is None:
                from ray.job_submission import JobSubmissionClient
                factory = JobSubmissionClient
            try:  # the client probes /api/version on construction
                self._client = self._bounded(
                    "connect", lambda: factory(self._cfg.address, headers=dict(self._headers)))
            except ClusterUnreachableError:
                raise
            except Exception as exc:
                raise self._unreachable(exc) from None
        return self._client

    def _bounded(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` on a daemon thread, given up after request_timeout_s (the thread of a hung
        request is left to finish or die with the process; it holds no lock of ours)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        worker = threading.Thread(target=run, name=f"ray-job-api-{what}", daemon=True)
        worker.start()
        worker.join(self._cfg.request_timeout_s)
        if worker.is_alive():
            self._client = None
            raise ClusterUnreachableError(
                f"Ray job API at {self._cfg.address}: {what} got no answer within "
                f"{self._cfg.request_timeout_s:g}s",
                fix="check the head's health (it may be overloaded or hung); raise "
                    "ray.request_timeout_s if it is just slow")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _unreachable(self, exc: BaseException) -> ClusterUnreachableError:
        self._client = None
        return ClusterUnreachableError(
            f"Ray job API at {self._cfg.address} failed: {type(exc).__name__}: {exc}",
            fix="check ray.address (kubectl port-forward svc/<cluster>-head-svc 8265), the "
                "cluster's health, and ray.auth_mode / the token",
        )

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        client = self._connect()
        try:
            return self._bounded(what, lambda: fn(client))
        except ClusterUnreachableError:
            raise
        except RuntimeError as exc:
            if what == "submit" and "already" in str(exc).lower():
                raise SubmissionRefused(str(exc)) from None
            raise self._unreachable(exc) from None
        except Exception as exc:
            raise self._unreachable(exc) from None

    def run_submissions(
        self, run_id: str, recorded_ids: tuple[str, ...] = (), entrypoint: Sequence[str] = ()
    ) -> tuple[Submission, ...]:
        jobs = self._call("list", lambda c: c.list_jobs())
        out = []
        for job in jobs:
            sid = getattr(job, "submission_id", None)
            if sid and belongs_to(run_id, sid, getattr(job, "metadata", None), recorded_ids,
                                  entrypoint, getattr(job, "entrypoint", None)):
                out.append(Submission(submission_id=sid, status=_status(job.status),
                                      start_time=_seconds(getattr(job, "start_time", None)),
                                      end_time=_seconds(getattr(job, "end_time", None))))
        return tuple(out)

    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: Mapping[str, Any],
               metadata: Mapping[str, str]) -> None:
        self._call("submit", lambda c: c.submit_job(
            entrypoint=entrypoint, submission_id=submission_id,
            runtime_env=dict(runtime_env) or None, metadata=dict(metadata)))

    def stop(self, submission_id: str) -> None:
        self._call("stop", lambda c: c.stop_job(submission_id))

    def status(self, submission_id: str) -> JobStatus:
        return _status(self._call("status", lambda c: c.get_job_status(submission_id)))

    def command(self, submission_id: str) -> RecordedCommand | None:
        """What Ray recorded for the submission (``resume_only``); None if it names none."""
        info = self._call("info", lambda c: c.get_job_info(submission_id))
        entrypoint, env = getattr(info, "entrypoint", None), getattr(info, "runtime_env", None)
        if not isinstance(entrypoint, str):
            return None
        return RecordedCommand(submission_id=submission_id, entrypoint=entrypoint,
                               runtime_env=dict(env) if isinstance(env, Mapping) else {})
