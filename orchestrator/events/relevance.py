"""Pure decisions about one event: is it for this job, and is it still current?

No clock, no I/O: ``now``, the mesh's hosts and the incarnation are passed in, so these rules
are tested on synthetic inputs and shared with anything that replays an event log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.events.model import Event
from orchestrator.hosts import HostRef


@dataclass(frozen=True)
class Verdict:
    """``accept`` or a short machine-readable ``decision`` plus a human ``reason``."""

    decision: str  # "accepted" | "irrelevant" | "stale"
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.decision == "accepted"


ACCEPT = Verdict("accepted")


def relevance(event: Event, *, job: str, attributes: Mapping[str, str] | None = None,
              filters: Mapping[str, str] | None = None) -> Verdict:
    """Only events for this job (target.job or a ``job`` label) that match the attribute filters."""
    if event.target.job is not None and event.target.job != job:
        return Verdict("irrelevant", f"for job {event.target.job!r}, not {job!r}")
    label_job = event.labels.get("job")
    if event.target.job is None and label_job is not None and label_job != job:
        return Verdict("irrelevant", f"labelled job {label_job!r}, not {job!r}")
    for key, want in (filters or {}).items():
        have = (attributes or {}).get(key, event.labels.get(key))
        if have != want:
            return Verdict("irrelevant", f"filter {key}={want!r} not matched (got {have!r})")
    return ACCEPT


def staleness(event: Event, *, hosts: Sequence[HostRef], incarnation: int, now: float,
              grace_s: float = 0.0) -> Verdict:
    """Stale when for an older incarnation, a notice past its deadline, or outside the mesh."""
    if event.incarnation is not None and event.incarnation < incarnation:
        return Verdict("stale", f"for incarnation {event.incarnation}, now {incarnation}")
    if event.kind.is_notice and event.deadline is not None and now > event.deadline + grace_s:
        return Verdict("stale", f"deadline passed {now - event.deadline:.1f}s ago")
    target = event.target
    if target.host is not None:
        matching = [h for h in hosts if h.matches(target.host)]
        if target.slice is not None:
            matching = [h for h in matching if h.slice_name == target.slice]
        if not matching:
            where = f" in slice {target.slice!r}" if target.slice else ""
            return Verdict("stale", f"host {target.host!r}{where} is not in the mesh")
    elif target.slice is not None and not any(h.slice_name == target.slice for h in hosts):
        return Verdict("stale", f"slice {target.slice!r} is not in the mesh")
    return ACCEPT


def target_hosts(event: Event, hosts: Sequence[HostRef]) -> list[HostRef]:
    """The mesh hosts an event is about (all of them for a job-wide event)."""
    target = event.target
    if target.host is not None:
        return [h for h in hosts if h.matches(target.host)
                and (target.slice is None or h.slice_name == target.slice)]
    if target.slice is not None:
        return [h for h in hosts if h.slice_name == target.slice]
    return list(hosts)
