"""Bytes off the wire -> Event, for every accepted format; never raises anything but MalformedEvent.

Order of checks: size, encoding, JSON, then the shape decides the format (our schema, a Cloud
Monitoring notification, a Cloud Logging entry, or a Pub/Sub push envelope around one of those).
Any unexpected exception from a format parser is turned into MalformedEvent too: a bug in a
parser must cost one dead letter, never the driver.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from orchestrator.events import alerts, logentries
from orchestrator.events.model import SCHEMA_VERSION, Event, MalformedEvent

DEFAULT_MAX_BYTES = 1 << 20


def parse_bytes(
    data: bytes | str, *, now: float, source: str, max_bytes: int = DEFAULT_MAX_BYTES,
    notice_s: float = logentries.DEFAULT_NOTICE_S,
) -> Event:
    """Decode and parse one payload; MalformedEvent carries the reason for the dead letter."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedEvent(f"payload must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise MalformedEvent(f"payload is {len(data)} bytes, over the {max_bytes}-byte limit",
                             fix="send events, not data: keep payloads small")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedEvent(f"payload is not UTF-8 ({exc.reason} at byte {exc.start})",
                             fix="encode the JSON as UTF-8") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise MalformedEvent("payload JSON is nested too deeply") from None
    except ValueError as exc:
        raise MalformedEvent(f"payload is not JSON ({str(exc)[:120]})",
                             fix="send a JSON object") from None
    return parse_value(value, now=now, source=source, notice_s=notice_s)


def parse_value(
    value: Any, *, now: float, source: str, notice_s: float = logentries.DEFAULT_NOTICE_S,
    _depth: int = 0,
) -> Event:
    """Parse an already-decoded JSON value by its shape."""
    try:
        return _dispatch(value, now=now, source=source, notice_s=notice_s, depth=_depth)
    except MalformedEvent:
        raise
    except RecursionError:
        raise MalformedEvent("payload is nested too deeply") from None
    except Exception as exc:  # a parser bug must not reach the driver
        raise MalformedEvent(f"parser failed on this payload ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from None


def detect_format(value: Any) -> str:
    """Name of the format a decoded payload looks like (for logs and dead letters)."""
    if not isinstance(value, Mapping):
        return "not-an-object"
    if "schema_version" in value:
        return "event"
    if alerts.is_alert_notification(value):
        return "monitoring-alert"
    if logentries.is_log_entry(value):
        return "log-entry"
    if isinstance(value.get("message"), Mapping) and "subscription" in value:
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
        return alerts.parse_alert_notification(value, now=now)
    if fmt == "log-entry":
        return logentries.parse_log_entry(value, now=now, notice_s=notice_s)
    if fmt == "pubsub-push" and depth == 0:
        return _push_envelope(value, now=now, source=source, notice_s=notice_s)
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
    """A push subscription's body (``{"message": {"data": base64, ...}, "subscription"}``)."""
    data = value["message"].get("data")
    if not isinstance(data, str):
        raise MalformedEvent("push envelope message.data must be a base64 string")
    try:
        inner = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedEvent("push envelope message.data is not valid base64") from None
    try:
        decoded = json.loads(inner.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedEvent("push envelope message.data is not UTF-8 JSON") from None
    return parse_value(decoded, now=now, source=source, notice_s=notice_s, _depth=1)
