"""The one typed event model every source feeds, and our own versioned JSON form of it.

Sources (Pub/Sub, the metadata watcher, Ray, the operator CLI) speak different formats; they all
become an ``Event`` here so the controller reasons about one shape. ``from_json`` validates
strictly and raises ``MalformedEvent`` with a reason: the intake turns that into a dead letter.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from orchestrator.shared.errors import OrchestratorError

SCHEMA_VERSION = 1
MAX_ID_CHARS = 512
MAX_TEXT_CHARS = 4096


class MalformedEvent(OrchestratorError):
    """A payload is not an event we accept. ``reason`` says what is wrong, for the dead letter."""

    def __init__(self, reason: str, *, fix: str = "") -> None:
        self.reason = reason
        super().__init__(
            f"malformed event: {reason}",
            fix=fix or "send one of the formats documented in docs/events.md",
        )


class EventKind(StrEnum):
    """Closed set of things that can change a run."""

    PREEMPTION_NOTICE = "preemption_notice"
    MAINTENANCE_SCHEDULED = "maintenance_scheduled"
    HOST_UNHEALTHY = "host_unhealthy"
    HOST_LOST = "host_lost"
    SLICE_LOST = "slice_lost"
    ALERT_FIRING = "alert_firing"
    ALERT_RESOLVED = "alert_resolved"
    OPERATOR_DRAIN = "operator_drain"
    OPERATOR_RESUME = "operator_resume"
    OPERATOR_STOP = "operator_stop"
    LIVE_MIGRATION = "live_migration"  # the VM keeps running: noted, never drained
    MAINTENANCE_CANCELLED = "maintenance_cancelled"  # a scheduled window was withdrawn: noted

    @classmethod
    def parse(cls, text: object) -> EventKind:
        """Accept the value ("preemption_notice"), the name, or a short alias ("preemption")."""
        if not isinstance(text, str):
            raise MalformedEvent(f"kind must be a string, got {type(text).__name__}")
        key = text.strip().lower().replace("-", "_")
        key = _KIND_ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise MalformedEvent(
                f"unknown kind {text[:80]!r}",
                fix=f"use one of: {', '.join(k.value for k in cls)}",
            ) from None

    @property
    def is_notice(self) -> bool:
        """Notices carry a deadline after which they are useless (the loss itself follows)."""
        return self in (EventKind.PREEMPTION_NOTICE, EventKind.MAINTENANCE_SCHEDULED,
                        EventKind.OPERATOR_DRAIN)


_KIND_ALIASES = {
    "preemption": "preemption_notice",
    "preempt": "preemption_notice",
    "maintenance": "maintenance_scheduled",
    "unhealthy": "host_unhealthy",
    "host_down": "host_lost",
    "lost": "host_lost",
    "alert": "alert_firing",
    "resolved": "alert_resolved",
    "drain": "operator_drain",
    "resume": "operator_resume",
    "stop": "operator_stop",
    "migration": "live_migration",
    "migrate": "live_migration",
}

# How ``Target.host`` names a host. Third-party parsers always say which field they read, so a
# GCE instance called "3" never matches mesh index 3; ``None`` (our own schema, the CLI) keeps the
# operator's convenience of "any of instance, Ray node id, IP or mesh index".
HOST_KINDS = ("instance", "instance_id", "node_name", "tpu_worker", "ray_node", "ip", "index")


@dataclass(frozen=True, kw_only=True)
class Target:
    """What an event is about. ``None`` means "any": a job-wide event has no slice and no host.

    ``host_kind`` says which name ``host`` is (``HOST_KINDS``: a GCE instance name, a numeric
    instance id, a GKE node name, a TPU worker id within ``slice``, a Ray node id, an IP, a mesh
    index); ``None`` means any of instance, Ray node id, IP or mesh index (operator input).
    ``cluster`` is the cluster the source resource belongs to (GKE ``cluster_name``); an event
    naming no host is job-wide only for this job's own cluster (``events.targeting``).
    """

    job: str | None = None
    slice: str | None = None
    host: str | None = None
    host_kind: str | None = None
    cluster: str | None = None

    def to_json(self) -> dict[str, str | None]:
        out = {"job": self.job, "slice": self.slice, "host": self.host}
        if self.host_kind is not None:
            out["host_kind"] = self.host_kind
        if self.cluster is not None:
            out["cluster"] = self.cluster
        return out

    @classmethod
    def from_json(cls, data: object) -> Target:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise MalformedEvent(f"target must be an object, got {type(data).__name__}")
        data = normalize_keys(data, _TARGET_FIELDS, "target")
        unknown = sorted(str(k) for k in data if k not in _TARGET_FIELDS)
        if unknown:
            raise MalformedEvent(f"target has unknown field {unknown[0][:80]!r}",
                                 fix=f"target takes only {', '.join(_TARGET_FIELDS)}")
        host_kind = _opt_name(data.get("host_kind"), "target.host_kind")
        if host_kind is not None and host_kind not in HOST_KINDS:
            raise MalformedEvent(f"target.host_kind {host_kind[:40]!r} is unknown",
                                 fix=f"use one of: {', '.join(HOST_KINDS)} (or leave it out)")
        return cls(
            job=_opt_name(data.get("job"), "target.job"),
            slice=_opt_name(data.get("slice"), "target.slice"),
            host=_opt_name(data.get("host"), "target.host", allow_int=True),
            host_kind=host_kind,
            cluster=_opt_name(data.get("cluster"), "target.cluster"),
        )


_TARGET_FIELDS = ("job", "slice", "host", "host_kind", "cluster")


@dataclass(frozen=True, kw_only=True)
class Event:
    """One thing that happened (or will happen, by ``deadline``) to the run.

    ``id`` is the dedupe key: the same real-world occurrence must get the same id from every
    redelivery. ``observed_at`` is when we first saw it; ``occurred_at`` when the source says it
    happened; ``deadline`` (unix s) is when the notice runs out (for scheduled maintenance: when
    its window starts, the time a drain must meet). ``window_start``/``window_end`` carry a
    maintenance window. ``raw`` keeps the payload as received for the record; it is never
    interpreted after parsing.
    """

    kind: EventKind
    target: Target
    source: str
    id: str
    observed_at: float
    deadline: float | None = None
    occurred_at: float | None = None
    incarnation: int | None = None
    message: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    raw: Any = None
    window_start: float | None = None
    window_end: float | None = None

    def __hash__(self) -> int:  # labels is a dict; identity of an event is its id
        return hash(self.id)

    def to_json(self, *, with_raw: bool = True) -> dict[str, Any]:
        """Our own schema (docs/events.md), version ``SCHEMA_VERSION``."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "kind": self.kind.value,
            "target": self.target.to_json(),
            "source": self.source,
            "observed_at": self.observed_at,
            "deadline": self.deadline,
            "occurred_at": self.occurred_at,
            "incarnation": self.incarnation,
            "message": self.message,
            "labels": dict(self.labels),
        }
        if self.window_start is not None or self.window_end is not None:
            out["window_start"] = self.window_start
            out["window_end"] = self.window_end
        if with_raw and self.raw is not None:
            out["raw"] = self.raw
        return out

    @classmethod
    def from_json(cls, data: object, *, now: float | None = None) -> Event:
        """Validate our own schema (snake_case or lowerCamelCase keys, like proto3 JSON);
        ``now`` fills a missing ``observed_at``."""
        if not isinstance(data, Mapping):
            raise MalformedEvent(f"event must be a JSON object, got {type(data).__name__}")
        data = normalize_keys(data, _EVENT_FIELDS, "event")
        version = data.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise MalformedEvent("schema_version must be an integer",
                                 fix=f"set schema_version to {SCHEMA_VERSION}")
        if version != SCHEMA_VERSION:
            raise MalformedEvent(f"unsupported schema_version {version}",
                                 fix=f"send schema_version {SCHEMA_VERSION}")
        known = set(_EVENT_FIELDS)
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise MalformedEvent(f"unknown field {unknown[0][:80]!r}",
                                 fix=f"use only: {', '.join(sorted(known))}")
        observed = _opt_time(data.get("observed_at"), "observed_at")
        if observed is None:
            if now is None:
                raise MalformedEvent("observed_at is missing")
            observed = now
        event_id = data.get("id")
        if event_id is None:
            raise MalformedEvent("id is missing", fix="give every event a unique string id")
        incarnation = data.get("incarnation")
        if incarnation is not None and (isinstance(incarnation, bool)
                                        or not isinstance(incarnation, int) or incarnation < 0):
            raise MalformedEvent("incarnation must be a non-negative integer or null")
        message = data.get("message", "")
        if not isinstance(message, str):
            raise MalformedEvent("message must be a string")
        source = data.get("source", "unknown")
        return cls(
            kind=EventKind.parse(data.get("kind")),
            target=Target.from_json(data.get("target")),
            source=_name(source, "source"),
            id=_name(event_id, "id", limit=MAX_ID_CHARS),
            observed_at=observed,
            deadline=_opt_time(data.get("deadline"), "deadline"),
            occurred_at=_opt_time(data.get("occurred_at"), "occurred_at"),
            incarnation=incarnation,
            message=message[:MAX_TEXT_CHARS],
            labels=parse_labels(data.get("labels"), "labels"),
            raw=data.get("raw"),
            window_start=_opt_time(data.get("window_start"), "window_start"),
            window_end=_opt_time(data.get("window_end"), "window_end"),
        )

    def with_observed(self, observed_at: float) -> Event:
        return replace(self, observed_at=observed_at)


_EVENT_FIELDS = ("schema_version", "id", "kind", "target", "source", "observed_at", "deadline",
                 "occurred_at", "incarnation", "message", "labels", "raw", "window_start",
                 "window_end")


def camel(name: str) -> str:
    """``observed_at`` -> ``observedAt`` (the proto3 JSON name of a snake_case field)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def normalize_keys(data: Mapping[str, Any], names: tuple[str, ...] | list[str],
                   where: str) -> dict[str, Any]:
    """``data`` with lowerCamelCase spellings of ``names`` renamed to snake_case. Both spellings
    of one field with different values is an error (which one was meant is unknowable)."""
    out = dict(data)
    for name in names:
        alias = camel(name)
        if alias == name or alias not in out:
            continue
        value = out.pop(alias)
        if name in out and out[name] != value:
            raise MalformedEvent(f"{where} has both {name!r} and {alias!r} with different values",
                                 fix=f"send only {name!r}")
        out[name] = value
    return out


def new_event_id(prefix: str = "evt") -> str:
    """A fresh id for events that have no natural one (operator commands)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def parse_labels(data: object, where: str) -> dict[str, str]:
    """String-to-string labels; numbers and booleans are stringified, anything else rejected."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise MalformedEvent(f"{where} must be an object of strings")
    out: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise MalformedEvent(f"{where} keys must be non-empty strings")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)) and math.isfinite(value):
            value = str(value)
        if not isinstance(value, str):
            raise MalformedEvent(f"{where}.{key[:80]} must be a string")
        out[key[:256]] = value[:1024]
    return out


def _name(value: object, where: str, *, limit: int = 256, allow_int: bool = False) -> str:
    if allow_int and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise MalformedEvent(f"{where} must be a non-empty string")
    if len(value) > limit:
        raise MalformedEvent(f"{where} is longer than {limit} characters")
    if any(ord(c) < 32 for c in value):
        raise MalformedEvent(f"{where} contains control characters")
    return value


def _opt_name(value: object, where: str, *, allow_int: bool = False) -> str | None:
    return None if value is None else _name(value, where, allow_int=allow_int)


# Unix seconds before 2100-01-01: a millisecond timestamp read as seconds (year ~57000) is not.
MAX_UNIX_S = 4_102_444_800.0


def plausible_unix(value: object, where: str) -> float:
    """A finite number of unix seconds in [0, 2100); MalformedEvent naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedEvent(f"{where} must be unix seconds (a number)")
    try:
        number = float(value)
    except OverflowError:
        raise MalformedEvent(f"{where} is not a plausible unix time") from None
    if not math.isfinite(number) or number < 0:
        raise MalformedEvent(f"{where} is not a plausible unix time: {str(value)[:40]}")
    if number >= MAX_UNIX_S:
        hint = " (milliseconds sent as seconds?)" if number / 1000 < MAX_UNIX_S else ""
        raise MalformedEvent(f"{where} {str(value)[:40]} is after the year 2100{hint}",
                             fix=f"send {where} as unix seconds")
    return number


def _opt_time(value: object, where: str) -> float | None:
    """Unix seconds as a plausible number (or null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedEvent(f"{where} must be unix seconds (a number) or null")
    return plausible_unix(value, where)
