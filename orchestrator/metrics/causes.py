"""Restart causes: a bounded label value from a lifecycle transition.

Label values become time series; a free-text reason ("host 10.0.0.7 lost at 12:01") would
create a series per restart. The cause is the word after "after " when the reason says so (the
driver writes "re-forming after spot_preemption: ..."), else the reason's first word;
lower-cased, limited to [a-z0-9_] and 64 characters ("preempted: host 3" -> "preempted").
A re-form is a transition into PLANNING from any state, or into FORMING from anything but
PLANNING (the first PLANNING of a run has no previous state).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_WORD = re.compile(r"[a-z0-9_]+")
_AFTER = re.compile(r"\bafter ([a-z0-9_]+)")


def normalize_cause(reason: object) -> str:
    text = str(reason or "").strip().lower().replace("-", "_")
    match = _AFTER.search(text) or _WORD.match(text)
    if match is None:
        return "unknown"
    return (match.group(1) if match.re is _AFTER else match.group(0))[:64]


def restart_cause(t: Mapping[str, Any]) -> str | None:
    """The cause when this transition starts a re-form, else None."""
    state, prev = t.get("state"), t.get("prev")
    if state == "PLANNING" and prev is not None:
        return normalize_cause(t.get("reason"))
    if state == "FORMING" and prev not in (None, "PLANNING"):
        return normalize_cause(t.get("reason"))
    return None


def restore_tier(t: Mapping[str, Any]) -> str | None:
    """The tier a restore read (ram, copy, durable) when this transition ends one, else None
    (a fresh start from the seed is not a restore)."""
    payload = t.get("payload") or {}
    if t.get("state") != "COMPILING" or payload.get("type") != "Compiling":
        return None
    tier = payload.get("tier")
    return str(tier) if tier and tier != "seed" else None
