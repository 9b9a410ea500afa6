"""Restart causes: a bounded label value from a lifecycle transition.

Label values become time series; a free-text reason ("host 10.0.0.7 lost at 12:01") would
create a series per restart. The cause is the reason's first word, lower-cased, limited to
[a-z0-9_] and 64 characters ("preempted: host 3" -> "preempted").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_WORD = re.compile(r"[a-z0-9_]+")


def normalize_cause(reason: object) -> str:
    text = str(reason or "").strip().lower().replace("-", "_")
    match = _WORD.match(text)
    return match.group(0)[:64] if match else "unknown"


def restart_cause(t: Mapping[str, Any]) -> str | None:
    """The cause when this transition starts a re-form (FORMING not from PLANNING), else None."""
    if t.get("state") != "FORMING" or t.get("prev") in (None, "PLANNING"):
        return None
    return normalize_cause(t.get("reason"))
