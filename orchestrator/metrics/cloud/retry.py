"""How long to wait before retrying a failed Cloud Monitoring call (pure policy).

Transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ABORTED) back off exponentially
from 1 s; quota errors (RESOURCE_EXHAUSTED) start at 10 s because retrying soon only burns more
quota; anything else (INVALID_ARGUMENT, PERMISSION_DENIED, ...) is permanent: no retry.
"""

from __future__ import annotations

TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "ABORTED"})
QUOTA = frozenset({"RESOURCE_EXHAUSTED"})


def retry_delay(code: str, attempt: int, *, max_delay_s: float = 120.0) -> float | None:
    """Seconds to wait before attempt ``attempt + 1`` (attempt counts from 0), None = give up."""
    if code in TRANSIENT:
        return min(max_delay_s, 1.0 * 2.0**attempt)
    if code in QUOTA:
        return min(max_delay_s, 10.0 * 2.0**attempt)
    return None
