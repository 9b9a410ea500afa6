"""Pure decisions about one event: is it for this job, and is it still current?

No clock, no I/O: ``now``, the mesh's hosts and the incarnation are passed in, so these rules
are tested on synthetic inputs and shared with the intake, ``explain`` and anything that replays
an event log. Which hosts an event names is ``targeting.resolve_targets`` (one rule everywhere).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.events.model import Event, EventKind
from orchestrator.events.targeting import Targeting, resolve_targets
from orchestrator.shared.hosts import HostRef


@dataclass(frozen=True)
class Verdict:
    """``accept`` or a short machine-readable ``decision`` plus a human ``reason``."""

    decision: str  # "accepted" | "irrelevant" | "stale" | "duplicate"
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.decision == "accepted"


ACCEPT = Verdict("accepted")


def relevance(event: Event, *, job: str, attributes: Mapping[str, str] | None = None,
              filters: Mapping[str, str] | None = None) -> Verdict:
    """Only events for this job (target.job, a ``job`` message attribute, or a ``job`` label)
    that match the attribute filters (a filter key is read from the message attributes, else
    from the event's labels, which hold an alert's user labels under their own keys). The
    attribute is what a per-run subscription filters on; checking it here too keeps a run from
    acting on another run's operator event when its subscription has no filter."""
    attr_job = (attributes or {}).get("job")
    if attr_job is not None and attr_job != job:
        return Verdict("irrelevant", f"message attribute job={attr_job!r}, not {job!r}")
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


def expires_at(event: Event) -> float | None:
    """When a notice stops mattering: a maintenance window's end, else its deadline; None for
    kinds that never expire (alerts, losses, operator stop)."""
    if not event.kind.is_notice:
        return None
    if event.kind is EventKind.MAINTENANCE_SCHEDULED and event.window_end is not None:
        return event.window_end
    return event.deadline


def staleness(event: Event, *, hosts: Sequence[HostRef], incarnation: int, now: float,
              grace_s: float = 0.0, id_to_name: Mapping[str, str] | None = None,
              cluster: str | None = None) -> Verdict:
    """Stale when for an older incarnation, a notice past its deadline (a maintenance window
    past its end), or naming no host of the mesh and not the job as a whole."""
    return judge_targets(event, hosts=hosts, incarnation=incarnation, now=now, grace_s=grace_s,
                         id_to_name=id_to_name, cluster=cluster)[0]


def judge_targets(event: Event, *, hosts: Sequence[HostRef], incarnation: int, now: float,
                  grace_s: float = 0.0, id_to_name: Mapping[str, str] | None = None,
                  cluster: str | None = None) -> tuple[Verdict, Targeting | None]:
    """``staleness`` plus the targeting it used (None when judged stale before targeting)."""
    if event.incarnation is not None and event.incarnation < incarnation:
        return Verdict("stale", f"for incarnation {event.incarnation}, now {incarnation}"), None
    expiry = expires_at(event)
    if expiry is not None and now > expiry + grace_s:
        what = "window ended" if expiry != event.deadline else "deadline passed"
        return Verdict("stale", f"{what} {now - expiry:.1f}s ago"), None
    targeting = resolve_targets(event, hosts, id_to_name=id_to_name, cluster=cluster)
    if not targeting.for_this_mesh:
        return Verdict("stale", targeting.reason), targeting
    return ACCEPT, targeting


def judge(event: Event, *, job: str, hosts: Sequence[HostRef], incarnation: int, now: float,
          seen: Container[str] = (), attributes: Mapping[str, str] | None = None,
          filters: Mapping[str, str] | None = None, grace_s: float = 0.0,
          id_to_name: Mapping[str, str] | None = None, cluster: str | None = None,
          ) -> tuple[Verdict, Targeting | None]:
    """The intake's whole verdict in its order: relevance, dedupe (``seen`` = ids already
    handled), then staleness and targeting. Used by ``explain`` to say what the intake would do."""
    verdict = relevance(event, job=job, attributes=attributes, filters=filters)
    if not verdict.accepted:
        return verdict, None
    if event.id in seen:
        return Verdict("duplicate", "already recorded"), None
    return judge_targets(event, hosts=hosts, incarnation=incarnation, now=now, grace_s=grace_s,
                         id_to_name=id_to_name, cluster=cluster)


def target_hosts(event: Event, hosts: Sequence[HostRef],
                 id_to_name: Mapping[str, str] | None = None) -> list[HostRef]:
    """The mesh hosts an event is about (all of them for a job-wide event)."""
    targeting = resolve_targets(event, hosts, id_to_name=id_to_name)
    if targeting.job_wide:
        return list(hosts)
    return [h for h in hosts if h.node_id in targeting.node_ids]
