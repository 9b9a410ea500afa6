"""The ``metrics`` config section: which sinks run and how Cloud Monitoring is reached.

Defaults give a local run console progress, ``metrics.jsonl``, TensorBoard event files and Ray
metrics; Cloud Monitoring is opt-in because it needs a project (and, in tests, a local endpoint).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orchestrator.shared.errors import ConfigError

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_]{0,99}$")
_PREFIXES = ("custom.googleapis.com/", "workload.googleapis.com/", "external.googleapis.com/")
RESERVED_METRIC_LABELS = frozenset({"cause", "slice", "peak_source"})


@dataclass(frozen=True, kw_only=True)
class CloudMonitoringConfig:
    """Export to Cloud Monitoring (``metrics.cloud_monitoring``)."""

    enabled: bool = False
    project: str | None = None
    endpoint: str | None = None
    """None: Google's endpoint with application-default credentials (production only).
    "127.0.0.1:PORT": an insecure local channel (tests, the local MetricService)."""
    metric_prefix: str = "custom.googleapis.com/tpu_orchestrator"
    window_s: float = 10.0
    """Aggregation window: one point per series per window (the API allows one per 5 s)."""
    queue_size: int = 20_000
    """Step records buffered for this sink while it is exporting; beyond it they are dropped."""
    location: str = "global"
    """generic_task ``location``: the zone or region of the TPUs."""
    namespace: str = "tpu-orchestrator"
    """generic_task ``namespace``."""
    job: str | None = None
    """generic_task ``job``; None uses ``run.name``."""
    task_id: str | None = None
    """generic_task ``task_id``; None uses "driver" (the process that exports)."""
    extra_labels: dict[str, str] = field(default_factory=dict)
    """Metric labels added to every series (e.g. team: research)."""
    timeout_s: float = 10.0
    max_attempts: int = 5

    def __post_init__(self) -> None:
        p = "metrics.cloud_monitoring"
        if self.enabled and not self.project:
            raise ConfigError(f"{p}.project", "is required when export is enabled",
                              f"set {p}.project to your GCP project id or {p}.enabled=false")
        if self.endpoint is not None and not re.fullmatch(r"[\w.\-\[\]:]+:\d{1,5}", self.endpoint):
            raise ConfigError(f"{p}.endpoint", f"{self.endpoint!r} is not host:port",
                              f"set {p}.endpoint like 127.0.0.1:8085, or leave it unset")
        prefix = self.metric_prefix.rstrip("/")
        if not prefix.startswith(_PREFIXES) or prefix in (x.rstrip("/") for x in _PREFIXES):
            raise ConfigError(f"{p}.metric_prefix",
                              f"{self.metric_prefix!r} is not a user-defined metric domain "
                              "with a path",
                              f"use e.g. {_PREFIXES[0]}tpu_orchestrator")
        if self.window_s < 5.0:
            raise ConfigError(f"{p}.window_s", f"must be >= 5 s, got {self.window_s}",
                              "Cloud Monitoring accepts one point per series every 5 s; use >= 5")
        if self.queue_size < 1:
            raise ConfigError(f"{p}.queue_size", "must be >= 1", "set a positive queue size")
        if self.timeout_s <= 0:
            raise ConfigError(f"{p}.timeout_s", "must be > 0", "set a positive timeout")
        if self.max_attempts < 1:
            raise ConfigError(f"{p}.max_attempts", "must be >= 1", "set 1 or more attempts")
        for name in ("location", "namespace"):
            value = getattr(self, name)
            if not value or len(value) > 1024:
                raise ConfigError(f"{p}.{name}", "must be 1..1024 characters", f"set {p}.{name}")
        if len(self.extra_labels) > 10:
            raise ConfigError(f"{p}.extra_labels", "more than 10 labels",
                              "keep extra labels few: every label multiplies series")
        for key, value in self.extra_labels.items():
            if not _LABEL_KEY.match(str(key)) or key in RESERVED_METRIC_LABELS:
                raise ConfigError(f"{p}.extra_labels.{key}",
                                  "keys must match [a-z][a-z0-9_]{0,99} and not be "
                                  f"{sorted(RESERVED_METRIC_LABELS)}", "rename the label")
            if len(str(value)) > 1024:
                raise ConfigError(f"{p}.extra_labels.{key}", "value longer than 1024 characters",
                                  "shorten the value")


_LOG_NAME = re.compile(r"[A-Za-z0-9/_.\-]{1,511}")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Section ``metrics``: sinks for per-step metrics, transitions and events."""

    console_every_steps: int = 10
    """Print a progress line every N steps (0 = never)."""
    jsonl: bool = True
    """Write RUN_DIR/metrics.jsonl (the report reads it)."""
    ray_metrics: bool = True
    """Publish gauges through ray.util.metrics (Ray dashboard / Prometheus)."""
    tensorboard: bool = True
    """Write TensorBoard event files to RUN_DIR/tensorboard/ (``tensorboard --logdir RUN_DIR``):
    step metrics, goodput, lifecycle transitions, eval results (docs/metrics.md)."""
    cloud_monitoring: CloudMonitoringConfig = field(default_factory=CloudMonitoringConfig)
    cpu_peak_flops_per_device: float | None = None
    """Peak FLOP/s per device to use for MFU instead of the chip table or a CPU measurement."""
    queue_size: int = 10_000
    """Records buffered per local sink before drops are counted."""
    rolling_window_s: float = 300.0
    """Window of the rolling goodput."""
    goodput_recorder: str | None = None
    """A Cloud Logging log name: Google's ml-goodput-measurement recorder writes the run's job,
    TPU-init, preparation and step markers there (the ``goodput`` extra; docs/metrics.md)."""

    def __post_init__(self) -> None:
        if self.console_every_steps < 0:
            raise ConfigError("metrics.console_every_steps", "must be >= 0", "use 0 to turn it off")
        if self.cpu_peak_flops_per_device is not None and self.cpu_peak_flops_per_device <= 0:
            raise ConfigError("metrics.cpu_peak_flops_per_device", "must be > 0",
                              "set the device's peak FLOP/s, or leave it unset to measure it")
        if self.queue_size < 1:
            raise ConfigError("metrics.queue_size", "must be >= 1", "set a positive queue size")
        if self.rolling_window_s <= 0:
            raise ConfigError("metrics.rolling_window_s", "must be > 0", "set e.g. 300")
        if self.goodput_recorder is not None and not _LOG_NAME.fullmatch(self.goodput_recorder):
            raise ConfigError("metrics.goodput_recorder",
                              f"{self.goodput_recorder!r} is not a Cloud Logging log name",
                              "use up to 511 letters, digits, '/', '_', '-' or '.' (e.g. "
                              "goodput_my_job), or leave it unset")
