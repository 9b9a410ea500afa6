"""HANDING_OVER: a notice that leaves time — train on while the next mesh's new hosts warm up,
then drain. The re-form then takes warm processes (``controller.warm``) instead of starting
cold ones; if they are not warm by the last safe moment, the drain goes ahead anyway and the
re-form starts what is missing cold (the reason says so).

A notice that dooms the whole mesh while no replacement slice exists yet trains on too, until
one joins (then it warms up as above) or the last safe moment: draining at once would only
wait for capacity with the steps the notice still allowed thrown away.
"""

from __future__ import annotations

from orchestrator.controller.context import Next, Pending, Run, log
from orchestrator.controller.planning import complete_slices, usable_hosts
from orchestrator.controller.seam import WarmStandby
from orchestrator.lifecycle import HandingOver, RunState
from orchestrator.shared.hosts import HostRef

S = RunState

DRAIN_MARGIN_S = 2.0
"""Kept free before a notice's deadline on top of the expected save, for the drain itself."""


def begin(run: Run) -> Next | None:
    """A drain is due: warm the replacement first when a notice leaves time for it, else None
    (drain now)."""
    p, group = run.pending, run.group
    max_s = run.ctl.warm.handover_max_s
    if (p is None or not isinstance(group, WarmStandby) or max_s <= 0 or p.stop or p.final
            or p.regrow or p.handover or p.deadline is None or not p.doomed):
        return None  # a group that keeps no warm processes drains at once
    now = run.now()
    until = min(now + max_s, _last_safe(run, p.deadline))
    if until <= now + 0.5:
        return None
    hosts = replacement_hosts(run)
    if not hosts and _awaits_capacity(run):
        until = _last_safe(run, p.deadline)
        p.handover_started, p.handover_until, p.awaiting_capacity = now, until, True
        log.info("handover_awaiting_capacity", event_id=p.event_id, until_s=round(until - now, 2))
        return Next(S.HANDING_OVER, "no replacement slice yet: training on until one joins "
                    f"(drain within {until - now:.1f}s)",
                    HandingOver(event_id=p.event_id, hosts=(), until=until))
    if not hosts:  # standbys wait there already: train on while they still warm or pre-form
        hosts = next_standby(run)
        if not hosts or not _warm_up(group, hosts) or _ready(group):
            return None  # a shrink, or the replacement is ready: drain now
    elif not _warm_up(group, hosts):
        return None
    p.handover_started, p.handover_until = now, until
    log.info("handover_started", event_id=p.event_id, hosts=[h.instance for h in hosts],
             until_s=round(until - now, 2))
    return Next(S.HANDING_OVER, f"training on while {len(hosts)} replacement host(s) warm up "
                f"(drain within {until - now:.1f}s)",
                HandingOver(event_id=p.event_id, hosts=tuple(h.instance for h in hosts),
                            until=until))


def drain_now(run: Run) -> bool:
    """During HANDING_OVER: whether to drain now (the replacement is warm, or time is up)."""
    p, group = run.pending, run.group
    if p is None or p.handover_until is None or p.handover:
        return True
    if p.awaiting_capacity:
        _capacity_joined(run, p, group)
    try:
        ready = (not p.awaiting_capacity and isinstance(group, WarmStandby)
                 and group.warm_ready())
    except Exception as exc:
        log.warning("handover_probe_failed", error=str(exc))
        ready = False
    latest = p.handover_until
    if p.deadline is not None:  # a notice merged in meanwhile may have brought it forward
        latest = min(latest, _last_safe(run, p.deadline))
    if ready:
        p.handover = "ready"
    elif run.now() >= latest and p.awaiting_capacity:
        p.handover = ("no replacement joined during the notice: drained at the last safe "
                      "moment, after training on")
        log.info("handover_no_capacity", event_id=p.event_id)
    elif run.now() >= latest:
        p.handover = ("not ready: the replacement was not warm at the last safe moment; the "
                      "re-form starts cold processes for it")
        log.warning("handover_fallback", event_id=p.event_id, reason=p.handover)
    return bool(p.handover)


def _ready(group: WarmStandby) -> bool:
    try:
        return bool(group.warm_ready())
    except Exception as exc:  # cannot tell: drain now, as without standbys
        log.warning("handover_probe_failed", error=str(exc))
        return True


def _warm_up(group: WarmStandby, hosts: list[HostRef]) -> bool:
    try:
        return bool(group.warm_up(hosts))
    except Exception as exc:  # warming is an optimisation: drain as before
        log.warning("handover_warm_up_failed", error=str(exc))
        return False


def _capacity_joined(run: Run, p: Pending, group: WarmStandby) -> None:
    """While awaiting capacity: a replacement slice that joined is warmed up (or is warm
    already: then the drain is due)."""
    if not _spare_slices(run):
        return
    hosts = replacement_hosts(run)
    if hosts and not _warm_up(group, hosts):
        return  # it cannot be warmed: keep training until the last safe moment
    p.awaiting_capacity = False
    log.info("handover_capacity_joined", event_id=p.event_id,
             hosts=[h.instance for h in hosts], warm_already=not hosts)


def _awaits_capacity(run: Run) -> bool:
    """The notice dooms every slice of the mesh and no complete spare slice exists."""
    plan, pending = run.plan, run.pending
    if plan is None or pending is None:
        return False
    doomed = set(pending.doomed)
    lost = {h.slice_name for h in plan.hosts if h.node_id in doomed}
    return lost == {h.slice_name for h in plan.hosts} and not _spare_slices(run)


def _spare_slices(run: Run) -> list[str]:
    """Complete slices outside the mesh that the notice does not doom."""
    plan, pending = run.plan, run.pending
    if plan is None or pending is None:
        return []
    doomed = set(pending.doomed)
    hosts = [h for h in usable_hosts(run) if h.node_id not in doomed]
    mesh = {h.slice_name for h in plan.hosts}
    return [s for s in complete_slices(hosts, run.placement.hosts_per_slice or 1)
            if s not in mesh]


def _last_safe(run: Run, deadline: float) -> float:
    """The latest moment to start the drain: the deadline less a margin and twice the
    expected save."""
    return deadline - DRAIN_MARGIN_S - 2 * (run.ledger.median_save_s() or 2.0)


def next_standby(run: Run) -> list[HostRef]:
    """The standby hosts (``placement.standby``) of the spare slices the next mesh takes."""
    spare = _next_spare(run)
    return [h for h in run.placement.standby if h.slice_name in spare]


def replacement_hosts(run: Run) -> list[HostRef]:
    """Hosts the next mesh would add: the first complete slices that are not doomed, not in
    the current mesh and have no standby yet, as many as the doomed slices leave missing."""
    spare = _next_spare(run)
    if not spare:
        return []
    skip = set(run.pending.doomed) | {h.node_id for h in run.placement.standby}
    return [h for h in usable_hosts(run) if h.slice_name in spare and h.node_id not in skip]


def _next_spare(run: Run) -> set[str]:
    """The spare slices the next mesh takes: as many as the notice's doomed slices leave
    missing."""
    plan, pending = run.plan, run.pending
    if plan is None or pending is None:
        return set()
    doomed = set(pending.doomed)
    missing = len({h.slice_name for h in plan.hosts if h.node_id in doomed})
    return set(_spare_slices(run)[:missing]) if missing else set()
