"""Configuration of the autoresume service (its own YAML, separate from a run's config).

Each section validates itself and names the dotted setting to change, as every config here does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from policies.autoresume import AutoresumeRules, IncidentKind

_SUBSCRIPTION_RE = re.compile(r"^projects/[^/]+/subscriptions/[^/]+$")


def _positive(setting: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(setting, f"must be > 0, got {value}",
                          f"set `{setting}` to a positive value")


@dataclass(frozen=True, kw_only=True)
class RayJobsConfig:
    """Where the Ray job API is and how to authenticate to it (Ray 2.60 token auth)."""

    address: str = "http://127.0.0.1:8265"
    auth_mode: Literal["auto", "token", "disabled"] = "auto"
    """auto: Ray's own RAY_AUTH_MODE/RAY_AUTH_TOKEN handling; token: send a bearer token read from
    token_file, else RAY_AUTH_TOKEN, else RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; disabled:
    send none."""
    token_file: str = ""
    retry_base_s: float = 5.0
    """First retry delay when the cluster is unreachable; doubles per attempt up to retry_max_s."""
    retry_max_s: float = 300.0
    stop_timeout_s: float = 120.0
    """How long to wait for a stalled job to stop before resubmitting (STOP_AND_RESUBMIT)."""
    request_timeout_s: float = 30.0
    """Bound of every job API call (the Ray client sets none): a hung head is 'unreachable'."""

    def __post_init__(self) -> None:
        if not self.address.startswith(("http://", "https://")):
            raise ConfigError("ray.address", f"{self.address!r} is not an http(s) URL",
                              "point it at the Ray dashboard/job API, e.g. http://127.0.0.1:8265 "
                              "(kubectl port-forward svc/<cluster>-head-svc 8265)")
        for name in ("retry_base_s", "retry_max_s", "stop_timeout_s", "request_timeout_s"):
            _positive(f"ray.{name}", getattr(self, name))
        if self.retry_max_s < self.retry_base_s:
            raise ConfigError("ray.retry_max_s", "is below ray.retry_base_s",
                              "set ray.retry_max_s >= ray.retry_base_s")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Restart budget, backoff and what counts as stalled (see policies/autoresume.py)."""

    max_restarts: int = 5
    window_s: float = 6 * 3600.0
    backoff_base_s: float = 30.0
    backoff_max_s: float = 900.0
    startup_grace_s: float = 600.0
    stall_after_s: float = 900.0
    act_on: tuple[str, ...] = ("heartbeat_absent", "job_failed", "step_stalled")

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError("policy.max_restarts", "must be >= 0",
                              "set it to 0 (never resubmit) or more")
        for name in ("window_s", "backoff_max_s", "stall_after_s"):
            _positive(f"policy.{name}", getattr(self, name))
        for name in ("backoff_base_s", "startup_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"policy.{name}", "must be >= 0",
                                  f"set policy.{name} to 0 or more")
        known = {k.value for k in IncidentKind}
        for i, kind in enumerate(self.act_on):
            if kind not in known:
                raise ConfigError(f"policy.act_on[{i}]", f"unknown incident kind {kind!r}",
                                  f"use some of: {', '.join(sorted(known))}")

    def rules(self) -> AutoresumeRules:
        return AutoresumeRules(
            max_restarts=self.max_restarts, window_s=self.window_s,
            backoff_base_s=self.backoff_base_s, backoff_max_s=self.backoff_max_s,
            startup_grace_s=self.startup_grace_s, stall_after_s=self.stall_after_s,
            act_on=frozenset(IncidentKind(k) for k in self.act_on),
        )


@dataclass(frozen=True, kw_only=True)
class OriginConfig:
    """Which alerts may resume runs: anything else is dead-lettered with the reason."""

    project: str = ""
    """The incident's scoping_project_id must equal it (required when subscription is set)."""
    metric_prefix: str = "custom.googleapis.com/tpu_orchestrator"
    """The incident's metric type must be under it."""
    user_labels: dict[str, str] = field(default_factory=lambda: {"app": "tpu-orchestrator"})
    """User labels the alert policy must carry (deploy/terraform/monitoring.tf sets them)."""

    def __post_init__(self) -> None:
        if not self.metric_prefix:
            raise ConfigError("origin.metric_prefix", "is empty",
                              "set the orchestrator's metric prefix, e.g. "
                              "custom.googleapis.com/tpu_orchestrator")
        for key, value in self.user_labels.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise ConfigError("origin.user_labels", f"{key!r}: {value!r} is not string: "
                                  "string", "write origin.user_labels as label: value pairs")

    def as_kwargs(self) -> dict:
        return {"project": self.project, "metric_prefix": self.metric_prefix,
                "user_labels": dict(self.user_labels)}


@dataclass(frozen=True, kw_only=True)
class AutoresumeConfig:
    """The whole service."""

    subscription: str = ""
    """Full path projects/P/subscriptions/S of the alerts subscription (terraform output)."""
    state_dir: str = "autoresume-state"
    """Holds state.json (per-run history, handled incidents), audit.jsonl, dead_letters.jsonl."""
    run_dirs: tuple[str, ...] = ("runs/*",)
    """Globs of run directories; each holds the run.json the driver writes."""
    tick_s: float = 1.0
    """How often scheduled retries (backoff, unreachable cluster) are looked at."""
    config_roots: tuple[str, ...] = ("/app/configs",)
    """Absolute, read-only directories (the image's) a resubmitted run's ``--config`` may lie in;
    a relative --config (inside the job's working directory) is always allowed."""
    ray: RayJobsConfig = field(default_factory=RayJobsConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    origin: OriginConfig = field(default_factory=OriginConfig)

    def __post_init__(self) -> None:
        if self.subscription and not _SUBSCRIPTION_RE.match(self.subscription):
            raise ConfigError("subscription", f"{self.subscription!r} is not a full subscription "
                              "path", "write projects/<project>/subscriptions/<name> "
                              "(terraform output alerts_subscription)")
        if self.subscription and not self.origin.project:
            raise ConfigError("origin.project", "is not set",
                              "set it to the project whose alert policies notify the alerts "
                              "topic; incidents from any other project are refused")
        if not self.state_dir:
            raise ConfigError("state_dir", "is empty", "set a writable directory")
        if not self.run_dirs:
            raise ConfigError("run_dirs", "is empty",
                              "list the globs of run directories, e.g. [/runs/*]")
        _positive("tick_s", self.tick_s)
        for i, root in enumerate(self.config_roots):
            if not root.startswith("/") or root.rstrip("/") == "":
                raise ConfigError(f"config_roots[{i}]", f"{root!r} is not an absolute directory "
                                  "below /", "list read-only directories of the image that hold "
                                  "run configs, e.g. [/app/configs]")


def load(path: str | None, overrides: list[str]) -> AutoresumeConfig:
    """YAML file (optional) + dotted overrides -> validated config."""
    data = configtools.load_yaml(path) if path else {}
    data = configtools.apply_overrides(data, overrides)
    return configtools.build(AutoresumeConfig, data)
