"""The autoresume service: one incident in, at most one resubmission out, everything recorded.

``handle_message`` takes a Pub/Sub payload (bytes) and always returns (the caller then acks):
malformed input goes to the dead letters with its reason; an unreachable Ray cluster schedules a
retry with backoff; a decision with a delay (policy backoff) schedules a re-evaluation;
``process_due`` runs what is due; an unexpected error while handling one run (a malformed file in
its directory) is audited and dead-lettered with the alert, and the next alert is handled as
usual. State is written before a message is acknowledged, so a restart of the service repeats
nothing it already did. One lock serialises all of it: the service is small and correctness
beats throughput here.

Cheap things first: a duplicate, closed or ignored incident is answered from the state alone,
before run directories are scanned or Ray is asked. A CLOSED notification is honoured (its
incident ends, a scheduled retry of it is dropped, a late OPEN of it is ignored) only when Ray
agrees the run needs no resume (``policies.autoresume.confirms_close``): a CLOSED for a run
that is dead is audited as ``closed_unverified`` and blocks nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from orchestrator.autoresume import resume_only
from orchestrator.autoresume.config import AutoresumeConfig
from orchestrator.autoresume.entrypoint import vet_entrypoint
from orchestrator.autoresume.incidents import (
    incident_from_json,
    incident_from_notification,
    incident_to_json,
)
from orchestrator.autoresume.ray_jobs import (
    INCIDENT_METADATA,
    RUN_ID_METADATA,
    RayJobsApi,
    SubmissionRefused,
)
from orchestrator.autoresume.runenv import RefusedResubmission, vet_runtime_env
from orchestrator.autoresume.runs import (
    AmbiguousRunError,
    RunRecord,
    RunRegistry,
    check_hold,
    last_heartbeat,
)
from orchestrator.autoresume.state import JsonlLog, Pending, StateStore
from orchestrator.events.model import MalformedEvent
from orchestrator.shared.errors import ClusterUnreachableError
from policies.autoresume import (
    Action,
    Decision,
    Incident,
    IncidentState,
    Observation,
    Submission,
    confirms_close,
    decide,
    precheck,
)

log = structlog.get_logger(__name__)

STOP_POLL_S = 1.0


class AutoresumeService:
    """Observe, decide (policies.autoresume), act, record. Side effects come in as seams."""

    def __init__(
        self,
        cfg: AutoresumeConfig,
        *,
        ray: RayJobsApi,
        registry: RunRegistry | None = None,
        state: StateStore | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cfg = cfg
        self.rules = cfg.policy.rules()
        self.ray = ray
        self.registry = registry or RunRegistry(cfg.run_dirs)
        self.state = state or StateStore(cfg.state_dir)
        self.audit = JsonlLog(f"{cfg.state_dir}/audit.jsonl")
        self.dead_letters = JsonlLog(f"{cfg.state_dir}/dead_letters.jsonl")
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.RLock()

    # ---- intake -------------------------------------------------------------------------

    def handle_message(self, data: bytes, *, message_id: str = "") -> str:
        """Process one notification; return what was done (for logs and tests). Never raises on
        bad input: the caller acks after this returns."""
        with self._lock:
            now = self.clock()
            try:
                payload = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                return self._dead_letter(data, f"not JSON: {exc}", message_id, now)
            try:
                incident, _event = incident_from_notification(
                    payload, now=now, origin=self.cfg.origin.as_kwargs())
            except MalformedEvent as exc:
                return self._dead_letter(data, exc.reason, message_id, now)
            log.info("autoresume_incident", incident_id=incident.incident_id,
                     run=incident.run_id, state=incident.state.value, kind=incident.kind.value,
                     message_id=message_id)
            try:
                return self._consider(incident, attempts=0, message_id=message_id)
            except Exception as exc:  # one run's files or state never nack the alert stream
                return self._failed(incident, exc, data, message_id, now)

    def process_due(self) -> int:
        """Re-evaluate scheduled incidents whose time has come; return how many ran."""
        with self._lock:
            now = self.clock()
            due = sorted((p.not_before, key) for key, p in self.state.pending.items()
                         if p.not_before <= now)
            for _, key in due:
                pending = self.state.pending.pop(key)
                self.state.save()
                incident = incident_from_json(pending.incident)
                try:
                    self._consider(incident, attempts=pending.attempts)
                except Exception as exc:  # the other due incidents still run
                    self._failed(incident, exc, json.dumps(pending.incident).encode(), "", now)
            return len(due)

    def next_due(self) -> float | None:
        with self._lock:
            return min((p.not_before for p in self.state.pending.values()), default=None)

    # ---- decision -----------------------------------------------------------------------

    def _consider(self, incident: Incident, *, attempts: int, message_id: str = "") -> str:
        now = self.clock()
        hist = self.state.history(incident.run_id)
        if incident.state is IncidentState.CLOSED:
            if incident.incident_id in hist.closed_incidents | hist.handled_incidents:
                self._record(incident, Decision(
                    action=Action.NOTHING, reason="incident already closed or handled"),
                    now, message_id=message_id)
                return "nothing"
        else:
            early = precheck(incident, hist, self.rules)
            if early is not None:
                self._record(incident, early, now, message_id=message_id)
                return "nothing"
        try:
            run = self.registry.find(incident.run_id)
        except AmbiguousRunError as exc:
            self._record(incident, Decision(action=Action.NOTHING, reason=str(exc)), now,
                         message_id=message_id, outcome="ambiguous_run")
            log.error("autoresume_ambiguous_run", run=incident.run_id, reason=str(exc))
            return "ambiguous_run"
        if run is None:
            where = list(self.cfg.run_dirs)
            self._record(incident, Decision(
                action=Action.NOTHING,
                reason=f"no run directory with run_id {incident.run_id!r} under {where}"),
                now, message_id=message_id)
            return "unknown_run"
        incident = replace(incident, run_id=run.run_id)
        try:
            submissions = self._submissions(run)
        except ClusterUnreachableError as exc:
            if incident.state is IncidentState.CLOSED:
                return self._close(incident, (), now, message_id, unreachable=str(exc))
            return self._retry_unreachable(incident, attempts, exc, now, message_id)
        if incident.state is IncidentState.CLOSED:
            return self._close(incident, submissions, now, message_id)
        hold = check_hold(run.run_dir)
        obs = Observation(incident=incident, submissions=submissions,
                          history=self.state.history(run.run_id),
                          heartbeat=last_heartbeat(run.run_dir), now=now, hold=hold.reason)
        decision = decide(obs, self.rules)
        if hold.ignored:
            decision = replace(decision, reason=f"{decision.reason} ({hold.ignored})")
        if decision.action in (Action.RESUBMIT, Action.STOP_AND_RESUBMIT) and decision.delay_s > 0:
            self._schedule(incident, now + decision.delay_s, 0, f"backoff: {decision.reason}")
            self._record(incident, decision, now, message_id=message_id, outcome="scheduled")
            return "scheduled"
        return self._act(run, incident, decision, attempts, now, message_id, submissions)

    def _submissions(self, run: RunRecord) -> tuple[Submission, ...]:
        """The run's Ray submissions. Ids run.json records count only when its entrypoint is one
        autoresume would resubmit for this directory (a copied run.json claims nothing)."""
        try:
            self._vet_entrypoint(run)
            entrypoint = run.entrypoint
        except RefusedResubmission:
            entrypoint = ()
        return self.ray.run_submissions(run.run_id, run.submission_ids if entrypoint else (),
                                        entrypoint)

    def _vet_entrypoint(self, run: RunRecord) -> str:
        return vet_entrypoint(run.entrypoint, run_dir=run.run_dir, run_id=run.run_id,
                              config_roots=self.cfg.config_roots)

    def _close(self, incident: Incident, submissions: tuple[Submission, ...], now: float,
               message_id: str, unreachable: str = "") -> str:
        """Honour a CLOSED only when Ray confirms the run needs no resume (module docstring)."""
        if unreachable or not confirms_close(submissions):
            why = (f"Ray could not be asked ({unreachable})" if unreachable else
                   "Ray shows no live or succeeded submission of the run")
            self._record(incident, Decision(
                action=Action.NOTHING,
                reason=f"CLOSED not honoured: {why}, so the run may still need a resume; a "
                       "later OPEN of this incident is still acted on"),
                now, message_id=message_id, outcome="closed_unverified")
            log.warning("autoresume_close_unverified", run=incident.run_id,
                        incident_id=incident.incident_id, reason=why)
            return "closed_unverified"
        hist = self.state.history(incident.run_id)
        self.state.pending.pop(incident.incident_id, None)  # saved by the update below
        self.state.update(incident.run_id,
                          closed_incidents=hist.closed_incidents | {incident.incident_id})
        self._record(incident, Decision(action=Action.NOTHING, reason="incident is closed"),
                     now, message_id=message_id)
        return "closed"

    # ---- actions ------------------------------------------------------------------------

    def _act(self, run: RunRecord, incident: Incident, decision: Decision, attempts: int,
             now: float, message_id: str, submissions: tuple[Submission, ...] = ()) -> str:
        hist = self.state.history(run.run_id)
        if decision.action is Action.NOTHING:
            self._record(incident, decision, now, message_id=message_id)
            return "nothing"
        if decision.action is Action.GIVE_UP:
            self.state.update(run.run_id, gave_up=True,
                              handled_incidents=hist.handled_incidents | {incident.incident_id})
            self._record(incident, decision, now, message_id=message_id)
            log.error("autoresume_gave_up", run=run.run_id, incident_id=incident.incident_id,
                      reason=decision.reason,
                      message=f"run {run.run_id}: restart budget spent ({decision.reason}); "
                              "autoresume will not resubmit it again. Fix: find why it keeps "
                              "dying (audit log, Ray job logs), then `python -m "
                              f"orchestrator.autoresume --config ... --reset-run {run.run_id}`")
            return "gave_up"
        assert decision.submission_id is not None
        try:
            entrypoint, runtime_env = self._vet_resubmission(run, submissions)
        except ClusterUnreachableError as exc:
            return self._retry_unreachable(incident, attempts, exc, now, message_id)
        except RefusedResubmission as exc:
            self.state.update(run.run_id,
                              handled_incidents=hist.handled_incidents | {incident.incident_id})
            self._record(incident, replace(decision, action=Action.NOTHING,
                                           reason=f"run.json refused: {exc}"),
                         now, message_id=message_id, outcome="refused")
            log.error("autoresume_refused", run=run.run_id, run_dir=run.run_dir, reason=str(exc))
            return "refused"
        try:
            if decision.stop_submission_id and not self._stop(run.run_id,
                                                              decision.stop_submission_id):
                self._schedule(incident, now + self.cfg.ray.retry_base_s, attempts + 1,
                               f"{decision.stop_submission_id} did not stop in time")
                self._record(incident, decision, now, message_id=message_id,
                             outcome="stop_timed_out")
                return "stop_timed_out"
            self.ray.submit(
                submission_id=decision.submission_id,
                entrypoint=entrypoint,
                runtime_env=runtime_env,
                metadata={RUN_ID_METADATA: run.run_id, INCIDENT_METADATA: incident.incident_id},
            )
        except SubmissionRefused as exc:
            self.state.update(run.run_id,
                              handled_incidents=hist.handled_incidents | {incident.incident_id})
            self._record(incident, replace(decision, action=Action.NOTHING,
                                           reason=f"submission id already used: {exc}"),
                         now, message_id=message_id)
            return "duplicate_submission"
        except ClusterUnreachableError as exc:
            return self._retry_unreachable(incident, attempts, exc, now, message_id)
        self.state.update(
            run.run_id,
            submissions=(*hist.submissions, decision.submission_id),
            restart_times=(*hist.restart_times, now),
            last_action_at=now,
            handled_incidents=hist.handled_incidents | {incident.incident_id},
        )
        self._record(incident, decision, now, message_id=message_id, outcome="submitted")
        log.info("autoresume_resubmitted", run=run.run_id, submission_id=decision.submission_id,
                 stopped=decision.stop_submission_id, incident_id=incident.incident_id,
                 reason=decision.reason)
        return "submitted"

    def _vet_resubmission(self, run: RunRecord, submissions: tuple[Submission, ...]
                          ) -> tuple[str, dict[str, Any]]:
        """The shell line and runtime_env to resubmit: allow-listed (entrypoint.py, runenv.py)
        and the run's own recorded command (resume_only.py); RefusedResubmission otherwise."""
        entrypoint = self._vet_entrypoint(run)
        runtime_env = vet_runtime_env(run.runtime_env)
        recorded = resume_only.newest_recorded(submissions, self.ray.command)
        resume_only.check(run.entrypoint, runtime_env, recorded)
        return entrypoint, runtime_env

    def _stop(self, run_id: str, submission_id: str) -> bool:
        """Stop a stalled submission and wait (bounded) until Ray says it is no longer live.
        Recorded first as stopped by us: a STOPPED job is otherwise an operator's decision."""
        hist = self.state.history(run_id)
        if submission_id not in hist.stopped:
            self.state.update(run_id, stopped=(*hist.stopped, submission_id))
        self.ray.stop(submission_id)
        deadline = self.clock() + self.cfg.ray.stop_timeout_s
        while self.clock() < deadline:
            if not self.ray.status(submission_id).live:
                return True
            self.sleep(STOP_POLL_S)
        return not self.ray.status(submission_id).live

    def _retry_unreachable(self, incident: Incident, attempts: int, exc: Exception, now: float,
                           message_id: str) -> str:
        delay = min(self.cfg.ray.retry_max_s, self.cfg.ray.retry_base_s * 2.0 ** attempts)
        self._schedule(incident, now + delay, attempts + 1, f"ray unreachable: {exc}")
        log.warning("autoresume_ray_unreachable", run=incident.run_id,
                    incident_id=incident.incident_id, attempt=attempts + 1, retry_in_s=delay,
                    error=str(exc))
        self.audit.write({"at": now, "incident_id": incident.incident_id,
                          "run_id": incident.run_id, "action": "RETRY",
                          "outcome": "ray_unreachable",
                          "reason": str(exc), "attempt": attempts + 1, "retry_in_s": delay,
                          "message_id": message_id})
        return "ray_unreachable"

    def _schedule(self, incident: Incident, at: float, attempts: int, why: str) -> None:
        full = self.state.add_pending(incident.incident_id, Pending(
            incident=incident_to_json(incident), not_before=at, attempts=attempts, why=why))
        if full:
            self.audit.write({"at": self.clock(), "incident_id": incident.incident_id,
                              "run_id": incident.run_id, "action": "NOTHING",
                              "outcome": "not_scheduled", "reason": f"{full}; {why}"})
            log.error("autoresume_not_scheduled", run=incident.run_id,
                      incident_id=incident.incident_id, reason=full,
                      fix="find why the run's incidents pile up (Ray unreachable? audit log); "
                          "the next notification of the run is acted on as usual")

    # ---- records ------------------------------------------------------------------------

    def _record(self, incident: Incident, decision: Decision, now: float, *, message_id: str = "",
                outcome: str = "") -> None:
        entry: dict[str, Any] = {
            "at": now, "incident_id": incident.incident_id, "run_id": incident.run_id,
            "incident_state": incident.state.value, "kind": incident.kind.value,
            "action": decision.action.value, "reason": decision.reason,
            "delay_s": decision.delay_s, "submission_id": decision.submission_id,
            "stop_submission_id": decision.stop_submission_id, "outcome": outcome or
            decision.action.value.lower(), "message_id": message_id,
        }
        self.audit.write(entry)
        log.info("autoresume_decision", **{k: v for k, v in entry.items() if k != "at"})

    def _failed(self, incident: Incident, exc: Exception, data: bytes, message_id: str,
                now: float) -> str:
        """An unexpected error while handling one run: audited, dead-lettered with the alert
        (an operator can replay it), logged with the traceback; the caller acks."""
        reason = f"error handling run {incident.run_id[:100]!r}: {type(exc).__name__}: " \
                 f"{str(exc)[:300]}"
        log.error("autoresume_run_failed", run=incident.run_id,
                  incident_id=incident.incident_id, reason=reason, exc_info=exc,
                  fix="read the run's directory (run.json, config.yaml, metrics.jsonl) for what "
                      "is malformed; other runs are unaffected")
        self.audit.write({"at": now, "incident_id": incident.incident_id,
                          "run_id": incident.run_id, "action": "NOTHING", "outcome": "error",
                          "reason": reason, "message_id": message_id})
        self._dead_letter(data, reason, message_id, now)
        return "error"

    def _dead_letter(self, data: bytes, reason: str, message_id: str, now: float) -> str:
        self.dead_letters.write({"at": now, "reason": reason, "message_id": message_id,
                                 "payload": data.decode("utf-8", errors="replace")[:65536]})
        log.warning("autoresume_dead_letter", reason=reason, message_id=message_id)
        return "dead_letter"

    def reset_run(self, run_id: str) -> None:
        """Operator override after a GIVE_UP: clear the budget so the run may be resumed again."""
        with self._lock:
            self.state.update(run_id, gave_up=False, restart_times=(), last_action_at=None)
            self.audit.write({"at": self.clock(), "run_id": run_id, "action": "RESET",
                              "reason": "operator reset the restart budget"})
