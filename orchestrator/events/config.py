"""Config section ``events``: where events come from and the guarantees around them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from orchestrator.shared.errors import ConfigError

LOCAL_PROJECT = "local-project"  # the embedded emulator's project
METADATA_DEFAULT_ENDPOINT = "http://metadata.google.internal/computeMetadata/v1"
_RESOURCE_ID = re.compile(r"^[A-Za-z][-A-Za-z0-9_.~+%]{2,254}$")


def _positive(setting: str, value: float, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(setting, f"must be > 0, got {value!r}", fix)


def _resource(setting: str, value: str | None) -> None:
    """Pub/Sub ids: 3-255 chars, start with a letter (short form, not projects/...)."""
    if value is None:
        return
    if not _RESOURCE_ID.match(value) or value.lower().startswith("goog"):
        raise ConfigError(
            setting, f"{value!r} is not a valid Pub/Sub id",
            f"set `{setting}` to the short id (3-255 letters, digits, -_.~+%, starting with a "
            "letter, not 'goog'), not the projects/... path",
        )


@dataclass(frozen=True, kw_only=True)
class PubSubConfig:
    """Pub/Sub source. Neither ``subscription`` nor ``topic`` disables it (the inbox still
    works); a topic alone means the run's own subscription ``<topic>-<run.name>``."""

    project: str | None = None
    subscription: str | None = None  # default with a topic: `<topic>-<run.name>` (for_job)
    topic: str | None = None  # where `python -m orchestrator.events publish` sends
    dead_letter_topic: str | None = None
    emulator: bool = False  # start Google's emulator locally (needs gcloud) and use it
    emulator_host: str | None = None  # host:port of a running emulator; else PUBSUB_EMULATOR_HOST
    max_messages: int = 100  # flow control: outstanding messages
    max_bytes: int = 10 * 1024 * 1024  # flow control: outstanding bytes
    max_payload_bytes: int = 1024 * 1024  # larger payloads are dead letters
    filters: dict[str, str] = field(default_factory=dict)  # attributes a message must carry
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0

    def __post_init__(self) -> None:
        p = "events.pubsub"
        for name in ("subscription", "topic", "dead_letter_topic"):
            _resource(f"{p}.{name}", getattr(self, name))
        if (self.subscription or self.topic or self.dead_letter_topic) and not self.project:
            raise ConfigError(f"{p}.project", "is required when a subscription or topic is set",
                              f"set `{p}.project` to the Google Cloud project id")
        if self.project is not None and not re.match(r"^[a-z][-a-z0-9:.]{4,62}$", self.project):
            raise ConfigError(f"{p}.project", f"{self.project!r} is not a project id",
                              f"set `{p}.project` to the project id (lowercase, e.g. my-proj)")
        for name in ("max_messages", "max_bytes", "max_payload_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{p}.{name}", f"must be a positive integer, got {value!r}",
                                  f"set `{p}.{name}` to a whole number >= 1")
        if self.max_payload_bytes > 10 * 1024 * 1024:
            raise ConfigError(f"{p}.max_payload_bytes", "is over Pub/Sub's 10 MB message limit",
                              f"set `{p}.max_payload_bytes` <= 10485760")
        _positive(f"{p}.reconnect_initial_s", self.reconnect_initial_s,
                  f"set `{p}.reconnect_initial_s` to e.g. 0.5")
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ConfigError(f"{p}.reconnect_max_s", "is below reconnect_initial_s",
                              f"set `{p}.reconnect_max_s` >= reconnect_initial_s")
        if self.emulator_host is not None and not re.match(r"^[^\s:/]+:\d{1,5}$",
                                                           self.emulator_host):
            raise ConfigError(f"{p}.emulator_host", f"{self.emulator_host!r} is not host:port",
                              f"set `{p}.emulator_host` like 127.0.0.1:8085")
        for key, value in self.filters.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise ConfigError(f"{p}.filters", f"{key!r}: {value!r} is not string: string",
                                  f"write `{p}.filters` as attribute: value pairs of strings")

    @property
    def enabled(self) -> bool:
        return self.subscription is not None

    def for_job(self, job: str) -> PubSubConfig:
        """The settings one run's driver uses: the embedded emulator's defaults (project
        ``local-project``, topic ``<job>-events``), and with no ``subscription`` the run's own
        ``<topic>-<job>`` (what deploy/terraform/pubsub.tf creates per run), so two runs never
        share a subscription (Pub/Sub hands each message of one to a single consumer)."""
        cfg = self
        if cfg.emulator:
            cfg = replace(cfg, project=cfg.project or LOCAL_PROJECT,
                          topic=cfg.topic or f"{job}-events")
        if cfg.subscription is not None or cfg.topic is None:
            return cfg
        name = run_subscription(cfg.topic, job)
        if not _RESOURCE_ID.match(name):
            raise ConfigError("events.pubsub.subscription",
                              f"the per-run default {name!r} is not a valid Pub/Sub id",
                              "set `events.pubsub.subscription` to the run's subscription, or "
                              "shorten events.pubsub.topic / run.name (255 characters at most)")
        return replace(cfg, subscription=name)

    def shared_subscription_fix(self, job: str) -> str | None:
        """Why a configured subscription looks shared by several runs (its name does not end in
        ``-<job>``), naming the fix; None when it is the run's own."""
        if self.subscription is None or self.subscription.endswith(f"-{job}"):
            return None
        own = run_subscription(self.topic, job) if self.topic else f"<topic>-{job}"
        return (f"events.pubsub.subscription {self.subscription!r} does not end in '-{job}' "
                f"(run.name): if other runs pull it too, each preemption notice reaches only one "
                f"of them. Fix: set it to this run's own subscription ({own}; Terraform creates "
                f"one per entry of `runs`), or leave it unset and set events.pubsub.topic")


def run_subscription(topic: str, job: str) -> str:
    """The per-run events subscription: ``<topic>-<run.name>``."""
    return f"{topic}-{job}"


@dataclass(frozen=True, kw_only=True)
class MetadataConfig:
    """GCE metadata watcher run by each host actor."""

    enabled: Literal["auto", "on", "off"] = "auto"  # auto = only when on GCE
    endpoint: str = METADATA_DEFAULT_ENDPOINT
    timeout_s: float = 60.0  # server-side hang of one wait_for_change request
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    preemption_notice_s: float = 30.0  # the platform's preemption notice
    maintenance_notice_s: float = 60.0  # notice assumed for a TERMINATE maintenance event

    def __post_init__(self) -> None:
        p = "events.metadata"
        if not re.match(r"^https?://[^\s/]+(/[^\s]*)?$", self.endpoint):
            raise ConfigError(f"{p}.endpoint", f"{self.endpoint!r} is not an http(s) URL",
                              f"set `{p}.endpoint` like {METADATA_DEFAULT_ENDPOINT}")
        for name in ("timeout_s", "backoff_initial_s", "backoff_max_s", "preemption_notice_s",
                     "maintenance_notice_s"):
            _positive(f"{p}.{name}", getattr(self, name), f"set `{p}.{name}` to a positive number")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(f"{p}.backoff_max_s", "is below backoff_initial_s",
                              f"set `{p}.backoff_max_s` >= backoff_initial_s")


@dataclass(frozen=True, kw_only=True)
class EventsConfig:
    """Section ``events``."""

    pubsub: PubSubConfig = field(default_factory=PubSubConfig)
    metadata: MetadataConfig = field(default_factory=MetadataConfig)
    inbox: bool | None = None
    """RUN_DIR/inbox, written by `python -m orchestrator.events publish`. None: on unless Pub/Sub
    is configured (``inbox_on``); true or false as set."""
    inbox_poll_s: float = 0.2
    ray_drains: bool = True
    """Ray Core's node drains (``ray drain-node``, KubeRay, the autoscaler) read as preemption
    notices. false: only a drained node's death is seen (a job that ignores notices)."""
    dedupe_window: int = 10000  # event ids remembered (persisted in RUN_DIR/event_dedupe.json)
    notice_s: float = 30.0  # notice assumed for log-sink preemption/maintenance entries
    stale_grace_s: float = 0.0  # a notice is stale once now > deadline + grace
    cluster: str | None = None  # this job's cluster (GKE cluster_name): cluster-wide events
    max_payload_depth: int = 32  # JSON nesting limit; deeper payloads are dead letters

    @property
    def inbox_on(self) -> bool:
        """Whether the RUN_DIR/inbox watcher runs. Unset, it is off where Pub/Sub is configured
        (a subscription or topic, not the local emulator): there the run directory is on a
        bucket every job can write, and file ownership cannot tell who wrote a file, so the
        inbox would let any job stop or drain any run. ``events.inbox=true`` turns it on."""
        if self.inbox is not None:
            return self.inbox
        ps = self.pubsub
        return not ((ps.subscription or ps.topic) and not ps.emulator)

    def __post_init__(self) -> None:
        if self.inbox is not None and not isinstance(self.inbox, bool):
            raise ConfigError("events.inbox", f"{self.inbox!r} is not true, false or null",
                              "set `events.inbox` to true, false, or leave it unset (on unless "
                              "Pub/Sub is configured)")
        if not isinstance(self.ray_drains, bool):
            raise ConfigError("events.ray_drains", f"{self.ray_drains!r} is not true or false",
                              "set `events.ray_drains` to true (drains are notices) or false")
        if isinstance(self.dedupe_window, bool) or self.dedupe_window < 1:
            raise ConfigError("events.dedupe_window", f"must be >= 1, got {self.dedupe_window!r}",
                              "set `events.dedupe_window` to e.g. 10000")
        _positive("events.inbox_poll_s", self.inbox_poll_s, "set `events.inbox_poll_s` to e.g. 0.2")
        _positive("events.notice_s", self.notice_s, "set `events.notice_s` to e.g. 30")
        if self.stale_grace_s < 0:
            raise ConfigError("events.stale_grace_s", "must be >= 0",
                              "set `events.stale_grace_s` to 0 or more seconds")
        if self.cluster is not None and (not isinstance(self.cluster, str)
                                         or not self.cluster.strip()):
            raise ConfigError("events.cluster", f"{self.cluster!r} is not a cluster name",
                              "set `events.cluster` to the GKE cluster_name the job runs on, "
                              "or null")
        if isinstance(self.max_payload_depth, bool) or not isinstance(
                self.max_payload_depth, int) or not 4 <= self.max_payload_depth <= 512:
            raise ConfigError("events.max_payload_depth",
                              f"must be an integer in 4..512, got {self.max_payload_depth!r}",
                              "set `events.max_payload_depth` to e.g. 32")
