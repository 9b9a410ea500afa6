"""Reading third-party JSON objects the way proto3 JSON is written, strict only where it matters.

Google's JSON may spell a field ``resourceName`` or ``resource_name`` (proto3 JSON parsers accept
both), so every lookup tries both. A field that decides an event's kind, target or deadline is
read *strictly*: a wrong type raises MalformedEvent (the event is dead-lettered with the reason).
Every other field is read *softly*: a wrong type is noted (``Fields.notes``, logged by the intake
and kept in the event's ``parse.ignored`` label) and treated as absent, so one odd optional field
never costs a real preemption notice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.events.model import Event, EventKind, MalformedEvent, Target, camel
from orchestrator.events.timefmt import parse_rfc3339

MAX_NOTES = 8


class Fields:
    """One JSON object at path ``where``; ``notes`` is shared with the objects read from it.
    ``snake``: the format's own spelling is snake_case (alert notifications), else camelCase
    (proto3 JSON); it only names absent fields in messages."""

    def __init__(self, data: object, where: str, notes: list[str] | None = None, *,
                 snake: bool = False) -> None:
        self.data: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        self.where = where
        self.notes = notes if notes is not None else []
        self.snake = snake

    def key(self, name: str) -> str:
        """The spelling of ``name`` this payload uses (lowerCamelCase when absent)."""
        if name in self.data or (self.snake and camel(name) not in self.data):
            return name
        return camel(name)

    def path(self, name: str) -> str:
        key = self.key(name)
        return f"{self.where}.{key}" if self.where else key

    def has(self, name: str) -> bool:
        return name in self.data or camel(name) in self.data

    def get(self, name: str) -> Any:
        """The value under the snake_case name or its lowerCamelCase alias (None if neither)."""
        if name in self.data:
            return self.data[name]
        return self.data.get(camel(name))

    def note(self, name: str, problem: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(f"{self.path(name)} {problem}; ignored")

    # ---- objects -------------------------------------------------------------------------
    def obj(self, name: str, *, strict: bool = False) -> Fields:
        """A nested object (empty when absent); a non-object is an error only if ``strict``."""
        value = self.get(name)
        if value is not None and not isinstance(value, Mapping):
            if strict:
                raise MalformedEvent(f"{self.path(name)} must be an object")
            self.note(name, f"is a {type(value).__name__}, not an object")
            value = None
        return Fields(value, self.path(name), self.notes, snake=self.snake)

    def labels(self, name: str = "labels") -> dict[str, str]:
        """A string map (resource/metric labels): non-string values are dropped with a note."""
        value = self.get(name)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.note(name, f"is a {type(value).__name__}, not an object")
            return {}
        out: dict[str, str] = {}
        for key, item in value.items():
            if isinstance(key, str) and isinstance(item, str):
                out[key[:256]] = item[:1024]
            elif isinstance(key, str) and isinstance(item, (int, float)) \
                    and not isinstance(item, bool):
                out[key[:256]] = str(item)
            else:
                self.note(f"{name}.{str(key)[:40]}", "is not a string")
        return out

    # ---- scalars -------------------------------------------------------------------------
    def text(self, name: str, *, strict: bool = False, required: bool = False,
             numbers: bool = True) -> str | None:
        """A non-empty string; numbers are accepted and stringified (ids often are numbers)
        unless ``numbers`` is False (a resource path or a method name is never a number)."""
        value = self.get(name)
        if value is None or value == "":
            if required:
                raise MalformedEvent(f"{self.path(name)} is missing")
            return None
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            if strict or required:
                raise MalformedEvent(f"{self.path(name)} must be a string")
            self.note(name, f"is a {type(value).__name__}, not a string")
            return None
        return value

    def flag(self, name: str) -> bool | None:
        """A boolean (also "true"/"false" strings); anything else noted and treated as absent."""
        value = self.get(name)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self.note(name, f"is {str(value)[:20]!r}, not a boolean")
        return None

    def time(self, name: str, *, strict: bool = False) -> float | None:
        """An RFC 3339 timestamp as unix seconds; implausible or broken ones raise only if
        ``strict`` (the time decides a deadline), else are noted and treated as absent."""
        value = self.get(name)
        if value is None or value == "":
            return None
        try:
            return parse_rfc3339(value, self.path(name))
        except MalformedEvent as exc:
            if strict:
                raise
            self.note(name, exc.reason.removeprefix(self.path(name)).strip())
            return None


def build_event(*, kind: EventKind, target: Target, key: str, occurred: float | None,
                now: float, deadline: float | None, message: str, source: str,
                labels: dict[str, str], raw: Any, notes: list[str],
                window: tuple[float | None, float | None] = (None, None)) -> Event:
    """The Event for a parsed entry; soft-field notes ride along in ``parse.ignored``."""
    if notes:
        labels = {**labels, "parse.ignored": "; ".join(notes)[:1024]}
    return Event(kind=kind, target=target, source=source, id=key, observed_at=now,
                 deadline=deadline, occurred_at=occurred, message=message[:4096], labels=labels,
                 raw=dict(raw), window_start=window[0], window_end=window[1])
