"""RFC 3339 timestamps as Google writes them: with or without fractional seconds (up to
nanoseconds), ``Z``, a ``+hh:mm`` offset, or no offset at all (read as UTC). A time outside
[2000, 2100) is rejected as implausible: it is a unit or format mistake, never a real notice."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from orchestrator.events.model import MalformedEvent

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r"(Z|z|[+-]\d{2}:?\d{2})?$"
)
MIN_YEAR, MAX_YEAR = 2000, 2099


def parse_rfc3339(text: object, where: str) -> float:
    """Unix seconds from an RFC 3339 string; MalformedEvent naming ``where`` otherwise."""
    if not isinstance(text, str):
        raise MalformedEvent(f"{where} must be an RFC 3339 timestamp string")
    match = _RFC3339.match(text.strip())
    if not match:
        raise MalformedEvent(f"{where} is not an RFC 3339 timestamp: {text[:40]!r}",
                             fix="send times like 2025-03-17T06:00:14.413Z")
    year, month, day, hour, minute, second, frac, zone = match.groups()
    if not MIN_YEAR <= int(year) <= MAX_YEAR:
        raise MalformedEvent(f"{where} year {year} is not plausible ({text[:40]!r})")
    if zone is None or zone in ("Z", "z"):
        tz = UTC
    else:
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:])
        if hours > 23 or minutes > 59:
            raise MalformedEvent(f"{where} has an invalid UTC offset")
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute),
                          min(int(second), 59), tzinfo=tz)
    except ValueError as exc:
        raise MalformedEvent(f"{where} is not a valid date: {exc}") from None
    fraction = float(f"0.{frac}") if frac else 0.0
    return moment.timestamp() + fraction
