"""Bytes off the wire -> Event, for every accepted format; never raises anything but MalformedEvent.

Order of checks: the bounded JSON parser (size, encoding, JSON, nesting depth: ``bounded.py``,
shared with autoresume), then the shape decides the format (our schema, a Cloud Monitoring
notification, a Cloud Logging entry, or a Pub/Sub push envelope / received message around one of
those). Any unexpected exception from a format parser is turned into MalformedEvent too: a bug
in a parser must cost one dead letter, never the driver.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from orchestrator.events import alerts, bounded, logentries
from orchestrator.events.model import SCHEMA_VERSION, Event, MalformedEvent

DEFAULT_MAX_BYTES = bounded.DEFAULT_MAX_BYTES


def parse_bytes(
    data: bytes | str, *, now: float, source: str, max_bytes: int = DEFAULT_MAX_BYTES,
    notice_s: float = logentries.DEFAULT_NOTICE_S, max_depth: int = bounded.DEFAULT_MAX_DEPTH,
) -> Event:
    """Decode and parse one payload; MalformedEvent carries the reason for the dead letter."""
    value = bounded.loads(data, max_bytes=max_bytes, max_depth=max_depth)
    return parse_value(value, now=now, source=source, notice_s=notice_s)


def parse_value(
    value: Any, *, now: float, source: str, notice_s: float = logentries.DEFAULT_NOTICE_S,
    _depth: int = 0,
) -> Event:
    """Parse an already-decoded JSON value by its shape."""
    try:
        if _depth == 0:
            bounded.check_depth(value)
        return _dispatch(value, now=now, source=source, notice_s=notice_s, depth=_depth)
    except MalformedEvent:
        raise
    except RecursionError:
        raise MalformedEvent("payload is nested too deeply") from None
    except Exception as exc:  # a parser bug must not reach the driver
        raise MalformedEvent(f"parser failed on this payload ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from None


def envelope_message(value: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``message`` of a Pub/Sub push body (``{"message": {...}, "subscription"}``) or of a
    received message as ``gcloud pubsub subscriptions pull --format=json`` prints it
    (``{"ackId", "message"}``); None if ``value`` is neither."""
    message = value.get("message")
    if not isinstance(message, Mapping) or "data" not in message:
        return None
    if "subscription" in value or "ackId" in value or "ack_id" in value or len(value) == 1:
        return message
    return None


def detect_format(value: Any) -> str:
    """Name of the format a decoded payload looks like (for logs and dead letters)."""
    if not isinstance(value, Mapping):
        return "not-an-object"
    if "schema_version" in value or "schemaVersion" in value:
        return "event"
    if alerts.is_alert_notification(value):
        return "monitoring-alert"
    if logentries.is_log_entry(value):
        return "log-entry"
    if envelope_message(value) is not None:
        return "pubsub-push"
    if value.get("kind") == "compute#operation":
        return "compute-operation"
    return "unknown"


def _dispatch(value: Any, *, now: float, source: str, notice_s: float, depth: int) -> Event:
    fmt = detect_format(value)
    if fmt == "not-an-object":
        raise MalformedEvent(f"payload must be a JSON object, got {type(value).__name__}")
    if fmt == "event":
        return Event.from_json(value, now=now)
    if fmt == "monitoring-alert":
        return alerts.parse_alert_notification(value, now=now, require_target=True)
    if fmt == "log-entry":
        return logentries.parse_log_entry(value, now=now, notice_s=notice_s)
    if fmt == "pubsub-push" and depth == 0:
        return _push_envelope(value, now=now, source=source, notice_s=notice_s)
    if fmt == "pubsub-push":
        raise MalformedEvent("a push envelope inside a push envelope is not unwrapped twice")
    if fmt == "compute-operation":
        raise MalformedEvent("a Compute Engine Operation is not a log entry",
                             fix="route the Cloud Logging system_event entries with a log sink, "
                                 "not Operations")
    raise MalformedEvent(
        "unknown payload format",
        fix=f"send an event with schema_version {SCHEMA_VERSION}, a Cloud Logging entry or a "
            "Cloud Monitoring notification (docs/events.md)",
    )


def _push_envelope(value: Mapping[str, Any], *, now: float, source: str, notice_s: float) -> Event:
    """A push subscription's body: ``message.data`` is the base64 of the real payload."""
    message = envelope_message(value) or {}
    data = message.get("data")
    if not isinstance(data, str):
        raise MalformedEvent("push envelope message.data must be a base64 string")
    try:
        inner = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedEvent("push envelope message.data is not valid base64") from None
    decoded = bounded.loads(inner, max_bytes=bounded.PUBSUB_MAX_BYTES)
    return parse_value(decoded, now=now, source=source, notice_s=notice_s, _depth=1)


def envelope_attributes(value: Any) -> dict[str, str]:
    """``message.attributes`` of a push envelope (string values only); {} for anything else."""
    if not isinstance(value, Mapping):
        return {}
    message = envelope_message(value)
    attributes = message.get("attributes") if message else None
    if not isinstance(attributes, Mapping):
        return {}
    return {str(k): v for k, v in attributes.items() if isinstance(v, str)}
