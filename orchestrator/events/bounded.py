"""The one bounded JSON parser for untrusted messages (the event intake and autoresume).

Limits are checked in the order that keeps a hostile message cheap: size before decoding, UTF-8
before JSON, nesting depth without recursion. ``json.loads`` itself recurses in C and raises
RecursionError on deep input; that, and every other failure, becomes MalformedEvent with a reason,
so a poison message is dead-lettered and acknowledged instead of redelivered forever.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.events.model import MalformedEvent

DEFAULT_MAX_BYTES = 1 << 20
PUBSUB_MAX_BYTES = 10 * 1024 * 1024  # Pub/Sub's own message limit
DEFAULT_MAX_DEPTH = 32  # real payloads nest < 10 levels (a push envelope + LogEntry: 6)


def loads(data: bytes | bytearray | memoryview | str, *, max_bytes: int = DEFAULT_MAX_BYTES,
          max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Decode one JSON message within ``max_bytes`` and ``max_depth``; MalformedEvent otherwise."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedEvent(f"payload must be bytes, got {type(data).__name__}")
    size = len(data)
    if size > max_bytes:
        raise MalformedEvent(f"payload is {size} bytes, over the {max_bytes}-byte limit",
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
    check_depth(value, max_depth)
    return value


def check_depth(value: Any, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise MalformedEvent if containers nest deeper than ``max_depth`` (iterative walk)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise MalformedEvent(f"payload JSON is nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))

