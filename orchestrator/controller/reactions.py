"""Events in, pending drains out: the intake's clean events, resolved to hosts, decided by the
one reaction policy (``policies.reaction``), applied to the run.

Metadata-watcher notices come from a driver-owned queue (``WorkerGroup.notices``), so a notice
survives the host that sent it. Events an earlier driver accepted but never settled (no outcome
recorded: ``EventIntake.replay_unhandled``) are decided again before the first mesh is planned,
so their hosts stay out of it; hosts an earlier driver drained for a notice that has not expired
stay out too (``EventIntake.replay_kept_out``). Every decision is recorded as it is made
(``outcome: false``) and settled once it took effect (``settle``: saved, drained, stopped, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.controller import stopping
from orchestrator.controller.context import Pending, Run, log
from orchestrator.controller.seam import HostsLost
from orchestrator.shared.hosts import HostRef
from policies.causes import StopCause
from policies.health import HealthReport
from policies.reaction import Reaction, ReactionKind, merge

if TYPE_CHECKING:
    from orchestrator.events.model import Event

_HOSTS_TTL_S = 1.0


class Reactions:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.health_reports: list[HealthReport] = []
        self.last_health_drain_at: float | None = None
        self._deferred: list[Event] = []  # noted "not yet" (e.g. no step time): decided again
        self._hosts: tuple[float, list[HostRef]] | None = None
        self._merged: tuple[Any, list[HostRef]] | None = None  # (plan, cluster + mesh hosts)
        self._last_hosts: frozenset[str] = frozenset()  # an earlier driver's mesh (replay)

    # ---- intake ---------------------------------------------------------------------------

    def replay_unhandled(self) -> None:
        """Before the first mesh: decide again the events an earlier driver accepted but never
        settled (it died between the decision and its outcome), as between meshes: a drain
        keeps its hosts out of the mesh about to be planned; keep out the hosts it drained for
        notices still pending."""
        run = self.run
        if run.intake is None:
            return
        try:
            kept = run.intake.replay_kept_out(run.now())
            events = run.intake.replay_unhandled(run.now())
        except Exception as exc:  # the log is evidence; a bad one must not stop the run
            log.error("event_replay_failed", error=str(exc))
            return
        if kept:
            run.placement.excluded |= set(kept)
            log.info("hosts_kept_out_by_earlier_driver", hosts=sorted(kept))
        if events:
            log.info("events_replayed", count=len(events),
                     ids=[e.id for e in events])
            self._last_hosts = _topology_hosts(run)
        for ev in events:
            try:
                self.handle(ev, in_mesh=False)
            except Exception as exc:
                log.exception("event_handling_failed", event_id=ev.id, error=repr(exc))
                self.record(ev, "error", reason=repr(exc)[:300])

    def poll(self, *, in_mesh: bool) -> None:
        """Take in notices and events; never raises."""
        run = self.run
        stopping.take_signal(run)
        self.collect_notices()
        events: list[Event] = []
        if in_mesh and self._deferred and run.ledger.median_step_s() is not None:
            events, self._deferred = events + self._deferred, []
        if run.intake is not None:
            try:
                taken = run.intake.poll(self._known_hosts(), run.ledger.incarnation)
            except Exception as exc:  # the intake must never take the run down
                log.error("event_poll_failed", error=str(exc))
                taken = []
            for ev in taken if run.listeners.wants("on_event") else ():  # marked beside the
                run.listeners.notify(  # transitions (TensorBoard's lifecycle/events)
                    "on_event", {**ev.to_json(with_raw=False), "at": run.now()})
            events += taken
        for ev in events:
            try:
                self.handle(ev, in_mesh=in_mesh)
            except Exception as exc:
                log.exception("event_handling_failed", event_id=ev.id, error=repr(exc))
                self.record(ev, "error", reason=repr(exc)[:300])

    def collect_notices(self) -> None:
        """Move the hosts' metadata notices into the intake (also right after a failure,
        before the group is torn down: the notice of a host that died is still there)."""
        if self.run.group is None:
            return
        try:
            for payload in self.run.group.notices():
                self.submit(payload, source="metadata")
        except Exception as exc:
            log.error("notice_poll_failed", error=str(exc))

    def submit(self, payload: dict, *, source: str) -> None:
        """A payload from inside the driver (metadata queue, chaos): through the intake when
        there is one (recorded, deduplicated), else handled at once."""
        if self.run.intake is not None:
            self.run.intake.submit(payload, source=source)
            return
        from orchestrator.events.model import Event

        self.handle(Event.from_json(payload, now=self.run.now()), in_mesh=True)

    def _known_hosts(self) -> list[HostRef]:
        """Mesh hosts plus every host the cluster shows (cached ~1 s): a notice for a spare
        host must keep it out of the next mesh, not be dropped as stale."""
        now = self.run.now()
        if self._hosts is None or now - self._hosts[0] > _HOSTS_TTL_S:
            try:
                cluster = list(self.run.cluster.hosts())
            except Exception as exc:
                log.warning("cluster_view_failed", error=str(exc))
                cluster = []
            self._hosts = (now, cluster)
            self._merged = None
        plan = self.run.plan
        if self._merged is None or self._merged[0] is not plan:
            hosts = {h.node_id: h for h in self._hosts[1]}
            for h in plan.hosts if plan else ():
                hosts[h.node_id] = h
            self._merged = (plan, list(hosts.values()))
        return self._merged[1]

    # ---- deciding -------------------------------------------------------------------------

    def handle(self, ev: Event, *, in_mesh: bool) -> None:
        from orchestrator.events.observation import RunFacts, build_observation, health_reports_for
        from orchestrator.events.targeting import resolve_targets

        run = self.run
        now = run.now()
        plan = run.plan
        mesh = frozenset(h.node_id for h in plan.hosts) if (plan and in_mesh) else frozenset()
        targeting = resolve_targets(ev, self._known_hosts(),
                                    id_to_name=run.intake.id_to_name if run.intake else None,
                                    cluster=run.cfg.events.cluster)
        self.health_reports += health_reports_for(ev, targeting, now=now)
        led = run.ledger
        reaction = run.policies.reaction.decide(build_observation(ev, targeting, RunFacts(
            mesh_hosts=mesh,
            job_hosts=frozenset(h.node_id for h in plan.hosts) if plan else self._last_hosts,
            step=led.step, step_time_s=led.median_step_s(), expected_save_s=led.median_save_s(),
            health_reports=tuple(self.health_reports),
            cordoned=frozenset(run.placement.cordoned),
            last_health_drain_at=self.last_health_drain_at), now=now))
        self.apply(reaction, ev, in_mesh=in_mesh)

    def apply(self, reaction: Reaction, ev: Event, *, in_mesh: bool) -> None:
        run = self.run
        p = run.placement
        p.cordoned |= set(reaction.cordon)
        p.excluded |= set(reaction.cordon)
        details: dict[str, Any] = {"reason": reaction.reason}
        if reaction.doomed:
            details["hosts"] = sorted(reaction.doomed)
        if not reaction.drains:
            later = reaction.kind is ReactionKind.NOTE and reaction.deadline is not None
            if later:
                self._deferred.append(ev)  # a decision for later (a window days ahead)
            elif reaction.kind is ReactionKind.NOTE and reaction.doomed:
                p.excluded |= set(reaction.doomed)  # outside the mesh: keep out of the next
            self.record(ev, reaction.kind.value, outcome=not later, **details)
            return
        if not in_mesh and reaction.kind is not ReactionKind.STOP:
            p.excluded |= set(reaction.doomed)  # nothing to drain: keep them out of the next
            self.record(ev, "excluded", outcome=True, **details)
            return
        before = run.pending.reaction if run.pending is not None else None
        merged = reaction if before is None else merge(before, reaction)
        if before is not None:
            details["merged_with"] = run.pending.event_id
        self._set_pending(merged, ev)
        if reaction.kind is ReactionKind.CORDON_AND_REPLACE:
            self.last_health_drain_at = run.now()
        self.record(ev, reaction.kind.value, outcome=False, **details)  # settled by the drain

    def _set_pending(self, r: Reaction, ev: Event) -> None:
        run = self.run
        prev = run.pending
        at_step = r.at_step if r.kind is ReactionKind.DRAIN_AT_STEP else None
        if r.not_before is not None and r.not_before > run.now() and at_step is None:
            st = run.ledger.median_step_s() or 1.0
            at_step = run.ledger.step + max(1, int((r.not_before - run.now()) / st))
        run.pending = Pending(
            cause=r.cause or StopCause.OPERATOR, reason=r.reason,
            event_id=prev.event_id if prev and prev.event_id else ev.id,
            deadline=r.deadline, at_step=at_step, doomed=r.doomed,
            stop=r.kind is ReactionKind.STOP or bool(prev and prev.stop),
            noticed_at=prev.noticed_at if prev and prev.noticed_at else run.now(),
            event=prev.event if prev and prev.event is not None else ev,
            events=(*(prev.events if prev else ()), ev), reaction=r,
            # a handover under way goes on (its bound is checked against the merged deadline)
            handover_started=prev.handover_started if prev else None,
            handover_until=prev.handover_until if prev else None,
            handover=prev.handover if prev else "")

    def carry_over(self, pending: Pending, *, fulfilled: bool = False) -> None:
        """A failure came before this event's drain: a drain due now keeps its hosts out of
        the next mesh; one planned at a step (a window ahead) is decided again on the next
        mesh, from the step time then. ``fulfilled``: the failure was the noticed hosts dying
        inside the window (the preemption itself)."""
        events = pending.events or (pending.event,)
        if fulfilled or pending.at_step is None:
            self.run.placement.excluded |= set(pending.doomed)
            reason = ("the noticed hosts died inside their notice window (or as it ended): "
                      "the preemption itself" if fulfilled else "the group failed before the drain")
            for ev in events:
                self.record(ev, "excluded", outcome=True, reason=reason,
                            hosts=sorted(pending.doomed))
            return
        for ev in events:
            self._deferred.append(ev)
            self.record(ev, "deferred", outcome=False, reason="the group failed before the "
                        f"drain step {pending.at_step}; decided again on the next mesh")

    def settle(self, pending: Pending, outcome: str, **details: Any) -> None:
        """The drain behind ``pending`` took effect: record ``outcome`` (saved, drained) for
        every event merged into it, with the hosts it kept out; until then a driver that dies
        leaves them for the next one to replay. A stop is settled once, ``stopped``, when the
        run ends."""
        if pending.stop and outcome != "stopped":
            return
        if pending.doomed:
            details.setdefault("hosts", sorted(pending.doomed))
        for ev in pending.events:
            self.record(ev, outcome, outcome=True, **details)
        pending.events = ()

    # ---- recording ------------------------------------------------------------------------

    def record(self, event: Event | str | None, action: str, *, outcome: bool = True,
               **details: Any) -> None:
        """What the controller did about an event (or a drain's id when it had none): in
        events.jsonl and the log; never raises. ``outcome`` False: a decision whose effect is
        still to come (see ``settle``)."""
        plain = event is None or isinstance(event, str)
        log.info("event_action", event_id=event if plain else event.id, action=action,
                 outcome=outcome, **details)
        if self.run.intake is None or plain:
            return
        try:
            self.run.intake.record_action(event, action, outcome=outcome, **details)
        except Exception as exc:
            log.error("event_record_failed", error=str(exc))

    def record_host_lost(self, host: HostRef, status: HostsLost) -> None:
        """A lost host as a HOST_LOST record in the event log (evidence, not fed back)."""
        if self.run.intake is None:
            return
        try:
            from orchestrator.events.model import Event, EventKind, Target

            ev = Event(kind=EventKind.HOST_LOST, source="ray",
                       target=Target(job=self.run.cfg.run.name, host=host.instance,
                                     slice=host.slice_name),
                       id=f"ray-{status.kind.value}-{host.node_id}-inc{self.run.ledger.incarnation}",
                       observed_at=self.run.now(), incarnation=self.run.ledger.incarnation,
                       message=status.message[:500])
            self.run.intake.record_action(ev, "group_failure", cause=status.kind.value,
                                          error=status.message[:500])
        except Exception as exc:  # recording must never stop the recovery
            log.error("host_lost_record_failed", error=str(exc))


def _topology_hosts(run: Run) -> frozenset[str]:
    """The node ids of the mesh an earlier driver formed last (RUN_DIR/topology.json): what a
    replayed job-wide notice dooms before this driver has a mesh. Empty if unreadable."""
    import json

    try:
        data = json.loads((run.run_dir / "topology.json").read_text())
        return frozenset(str(h["node_id"]) for h in data.get("hosts", []))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return frozenset()
