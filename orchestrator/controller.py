"""The run controller: drives the lifecycle state machine over a Ray cluster.

One handler per state; each returns after exactly one transition (or none while waiting). The
handlers do the side effects through seams (``WorkerGroup`` for Ray actors, ``ClusterView`` for
topology, the event intake, the metrics pipeline, the clock) and ask ``policies`` for every
decision. Survivors of a lost peer cannot continue (FACTS.md), so any group failure tears the
whole group down and re-forms from the last committed checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray
import structlog

from orchestrator.config import RunConfig
from orchestrator.controller_config import ControllerConfig
from orchestrator.errors import (
    BarrierTimeout,
    CheckpointError,
    GroupFailure,
    OrchestratorError,
    TopologyError,
)
from orchestrator.hosts import HostRef
from orchestrator.lifecycle import (
    Backoff,
    Checkpointing,
    Draining,
    Failed,
    Lifecycle,
    Releasing,
    Restoring,
    RunState,
    WaitingForCapacity,
)
from orchestrator.plan import MeshPlan, plan_mesh
from orchestrator.worker_group import WorkerGroup
from policies.causes import StopCause, StopObservation
from policies.chaos import FaultKind
from policies.checkpoint_interval import SaveObservation
from policies.health import HealthObservation, HealthReport
from policies.preemption import (
    DrainKind,
    DrainObservation,
    GrowKind,
    GrowObservation,
    PlacementKind,
    PlacementObservation,
)
from policies.resize import BatchPlan, ResizeObservation
from policies.restart_budget import GiveUp, RestartObservation, RestartRecord

log = structlog.get_logger(__name__)

S = RunState


class ClusterView(Protocol):
    """What the controller needs to know about the cluster: the TPU hosts alive now."""

    def hosts(self) -> list[HostRef]: ...

    def platform(self) -> str: ...

    def unreachable(self, node_ids: Collection[str]) -> set[str]: ...


class RayClusterView:
    """``ray.nodes()`` read as TPU hosts."""

    probe_timeout_s: float = 2.0

    def hosts(self) -> list[HostRef]:
        from orchestrator.topology import hosts_from_nodes

        return hosts_from_nodes(ray.nodes())

    def platform(self) -> str:
        from orchestrator.topology import platform_of

        return platform_of(ray.nodes())

    def unreachable(self, node_ids: Collection[str]) -> set[str]:
        """Nodes that are gone even if the GCS has not noticed yet (it marks a vanished node
        dead only after its health checks fail, ~16 s here): dead, unknown, or their raylet
        refuses a TCP connection."""
        wanted = set(node_ids)
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["NodeID"] in wanted}
        gone = wanted - set(nodes)
        for node_id, n in nodes.items():
            if not n.get("Alive") or not _accepts(n.get("NodeManagerAddress", ""),
                                                  int(n.get("NodeManagerPort", 0)),
                                                  self.probe_timeout_s):
                gone.add(node_id)
        return gone


def _accepts(host: str, port: int, timeout_s: float) -> bool:
    if not host or port <= 0:
        return True  # nothing to probe: trust the GCS
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class DrainRequest:
    """Why the group must stop at the next step boundary, and whom it concerns."""

    cause: StopCause
    reason: str
    event_id: str
    deadline: float | None
    doomed_nodes: frozenset[str] = frozenset()
    regrow: bool = False
    stop: bool = False
    event: Any = None
    noticed_at: float | None = None


@dataclass
class RunSummary:
    """What the run did; printed at the end and written to RUN_DIR/summary.json."""

    state: str
    reason: str
    step: int
    total_steps: int
    lost_steps: int
    restarts: dict[str, int]
    phases_s: dict[str, float]
    wall_s: float
    first_loss: float | None
    last_loss: float | None
    median_step_s: float | None
    compile_s: list[float]
    recoveries: list[dict]
    goodput: float | None = None
    exit_code: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class _Progress:
    step: int = 0
    max_step_reached: int = 0
    last_committed: int | None = None
    step_times: list[float] = field(default_factory=list)
    save_costs: list[float] = field(default_factory=list)
    first_loss: float | None = None
    last_loss: float | None = None


class RunController:
    """Owns one run from PLANNING to SUCCEEDED/FAILED."""

    group_cls: type[WorkerGroup] = WorkerGroup
    """Seam: the Ray worker group implementation."""

    poll_interval_s: float = 0.1
    peak_resolver: Callable[[Callable[[], float]], tuple[float, str]] | None = None
    """Seam: resolves the MFU peak, given a way to measure one device (CPU runs)."""

    def __init__(self, cfg: RunConfig, ctl: ControllerConfig, *, run_dir: Path,
                 cluster: ClusterView, intake: Any = None, metrics: Any = None,
                 on_step: Callable[[dict, dict], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 peak: tuple[float, str] | None = None,
                 on_final_group: Callable[[WorkerGroup], None] | None = None) -> None:
        self.cfg = cfg
        self.ctl = ctl
        self.policies = ctl.build_policies()
        self.run_dir = Path(run_dir)
        self.cluster = cluster
        self.intake = intake
        self.metrics = metrics
        self.on_step = on_step
        self.clock = clock
        self.sleep = sleep
        self.peak = peak
        self.on_final_group = on_final_group
        self.lifecycle = Lifecycle(run_dir=self.run_dir, clock=clock,
                                   listeners=[_MetricsListener(metrics)] if metrics else ())
        self.group: WorkerGroup | None = None
        self.plan: MeshPlan | None = None
        self.incarnation = 0
        self.progress = _Progress()
        self.excluded: set[str] = set()  # node ids never to place on again (doomed, cordoned)
        self.cordoned: set[str] = set()
        self.health_reports: list[HealthReport] = []
        self.last_health_drain_at: float | None = None
        self.restart_history: list[RestartRecord] = []
        self.lost_steps = 0
        self.hosts_per_slice: int | None = None
        self.target_slices = self._initial_target_slices()
        self.drain: DrainRequest | None = None
        self.pending_cause: StopCause | None = None
        self.pending_reason = ""
        self.waiting_since: float | None = None
        self.last_resize_at: float | None = None
        self.fired_faults: set[tuple[int, int, str]] = set()
        self.compile_times: list[float] = []
        self.recoveries: list[dict] = []
        self._last_interval: int | None = None
        self._chunk_started_at: float | None = None
        self.restores: list[dict] = []  # per incarnation: which checkpoint step was restored
        self._recovery: dict | None = None
        self.batch_plan: BatchPlan | None = None
        self.flops: float | None = None
        self.started_at = clock()
        self.final_reason = ""
        self.stop_requested = False

    # ---- the loop -----------------------------------------------------------------------

    def run(self) -> RunSummary:
        handlers = {
            S.PLANNING: self._planning, S.FORMING: self._forming, S.RESTORING: self._restoring,
            S.COMPILING: self._compiling, S.RUNNING: self._running, S.DRAINING: self._draining,
            S.CHECKPOINTING: self._checkpointing, S.RELEASING: self._releasing,
            S.WAITING_FOR_CAPACITY: self._waiting, S.BACKOFF: self._backoff,
        }
        try:
            while not self.lifecycle.terminal:
                handlers[self.lifecycle.state]()
        except KeyboardInterrupt:
            self._fail("interrupted (Ctrl-C or SIGTERM); checkpoints are intact",
                       StopCause.OPERATOR)
        except OrchestratorError as exc:
            if not exc.retryable:
                self._fail(str(exc), None)
            else:
                raise
        finally:
            self._teardown_group(graceful=False)
        return self._summary()

    # ---- state handlers -----------------------------------------------------------------

    def _planning(self) -> None:
        hosts = [h for h in self.cluster.hosts() if h.node_id not in self.excluded]
        hps = self.hosts_per_slice or self._hosts_per_slice(hosts)
        complete = _complete_slices(hosts, hps)
        now = self.clock()
        decision = self.policies.placement.decide(PlacementObservation(
            now=now, available_slices=tuple(complete), target_slices=self.target_slices,
            waiting_since=self.waiting_since))
        if decision.kind in (PlacementKind.FORM, PlacementKind.SHRINK):
            chosen = [h for h in hosts if h.slice_name in decision.slices]
            try:
                plan = plan_mesh(self.cfg_for(len(decision.slices), hps), chosen,
                                 platform=self.cluster.platform(), hosts_per_slice=hps)
            except TopologyError as exc:
                self._fail(str(exc), None)
                return
            if self.plan is not None and plan.num_slices != self.plan.num_slices:
                self.last_resize_at = now
            self.plan = plan
            self.hosts_per_slice = hps
            self.waiting_since = None
            self._transition(S.FORMING, decision.reason)
        elif decision.kind is PlacementKind.WAIT_FOR_REPLACEMENT:
            if self.waiting_since is None:
                self.waiting_since = now
            self._transition(S.WAITING_FOR_CAPACITY, decision.reason,
                             payload=WaitingForCapacity(deadline=decision.until or now,
                                                        needed_slices=decision.needed))
        else:
            self._fail(decision.reason, self.pending_cause)

    def _forming(self) -> None:
        self.incarnation += 1
        plan = self.plan
        assert plan is not None
        group = self.group_cls(self.cfg_for(plan.num_slices, plan.hosts_per_slice), plan,
                               run_dir=self.run_dir, incarnation=self.incarnation)
        self.group = group
        try:
            group.start()
            self._arm_init_faults()
            group.initialize()
            accum = self.batch_plan.accum_steps if self.batch_plan else 1
            group.call_all("build", group.cfg, plan, str(self.run_dir / "checkpoints"), accum,
                           timeout_s=self.cfg.timeouts.restore_s, phase="restore")
            watching = group.call_all("start_metadata_watcher",
                                      dataclasses.asdict(self.cfg.events.metadata),
                                      timeout_s=30.0, phase="init")
            log.info("metadata_watchers", active=sum(bool(w) for w in watching))
        except GroupFailure as exc:
            self._group_failed(exc)
            return
        self._transition(S.RESTORING, f"group of {plan.num_processes} hosts formed",
                         payload=Restoring(step=self.progress.last_committed or 0))

    def _restoring(self) -> None:
        assert self.group is not None
        try:
            out = self.group.call_all("restore", timeout_s=self.cfg.timeouts.restore_s,
                                      phase="restore")
        except CheckpointError:
            raise
        except GroupFailure as exc:
            self._group_failed(exc)
            return
        step = out[0]["step"]
        restored = out[0]["restored_step"]
        lost = max(0, self.progress.max_step_reached - step)
        if lost:
            self.lost_steps += lost
            log.warning("steps_lost", lost=lost, restored_step=restored,
                        reached=self.progress.max_step_reached)
        if self._recovery is not None:
            self._recovery["lost_steps"] = self._recovery.get("lost_steps", 0) + lost
        self.restores.append({"incarnation": self.incarnation, "restored_step": restored,
                              "step": step, "lost_steps": lost,
                              "restore_s": round(out[0]["restore_s"], 3)})
        if self._recovery is not None:
            self._recovery["restored_step"] = restored
        self.progress.step = step
        self.progress.last_committed = restored
        reason = f"restored step {restored}" if restored is not None else "fresh start (seed)"
        self._transition(S.COMPILING, reason)

    def _compiling(self) -> None:
        assert self.group is not None
        try:
            out = self.group.compile()
        except GroupFailure as exc:
            self._group_failed(exc)
            return
        c = out[0]
        if self.peak is None and self.peak_resolver is not None:
            actor = self.group.actors[0]
            try:
                self.peak = self.peak_resolver(
                    lambda: ray.get(actor.measure_peak_flops.remote(), timeout=60))
            except OrchestratorError as exc:
                log.warning("mfu_peak_unknown", error=str(exc))
                self.peak = (0.0, "unknown")
        self.compile_times.append(c["compile_s"])
        self.flops = c["flops_xla"] or c["flops_analytic"]
        log.info("compiled", compile_s=round(c["compile_s"], 3), flops_xla=c["flops_xla"],
                 flops_analytic=c["flops_analytic"],
                 xla_vs_analytic=(c["flops_xla"] / c["flops_analytic"]
                                  if c["flops_xla"] else None))
        self._transition(S.RUNNING, "step compiled")

    def _running(self) -> None:
        group = self.group
        assert group is not None and self.plan is not None
        total = self.cfg.run.total_steps
        while True:
            if self.progress.step >= total:
                self.drain = DrainRequest(cause=StopCause.OPERATOR, reason="target reached",
                                          event_id="final", deadline=None, stop=True)
                self._transition(S.CHECKPOINTING, f"reached step {total}: final save",
                                 payload=Checkpointing(purpose="final"))
                return
            if self.drain is not None:
                self._enter_drain()
                return
            every = self.cfg_interval()
            until = self._chunk_end(every)
            self._arm_faults(until)
            self._poll_events(in_mesh=True)
            if self.drain is not None:
                continue
            self._chunk_started_at = self.clock()
            refs = group.run_steps(until, checkpoint_every=every)
            try:
                results = self._wait_chunk(refs, steps=until - self.progress.step)
            except GroupFailure as exc:
                self._group_failed(exc)
                return
            self._absorb(results, every)
            self._finish_recovery()
            self._check_grow()

    def _draining(self) -> None:
        d = self.drain
        assert d is not None
        now = self.clock()
        # The hosts already stopped at a step boundary (chunk end): no step is in flight.
        save_s = (statistics.median(self.progress.save_costs[-5:]) if self.progress.save_costs
                  else 2.0)
        decision = self.policies.deadline.decide(DrainObservation(
            now=now, deadline=d.deadline if d.deadline is not None else now + 3600.0,
            expected_save_s=save_s, expected_step_s=0.0, step=self.progress.step,
            last_committed_step=self.progress.last_committed))
        log.info("drain_decision", kind=decision.kind.value, reason=decision.reason,
                 step=self.progress.step, event_id=d.event_id)
        self._record_action(d.event or d.event_id, f"drain:{decision.kind.value}",
                            reason=decision.reason, step=self.progress.step)
        if decision.kind in (DrainKind.SAVE, DrainKind.SAVE_ANYWAY):
            self._transition(S.CHECKPOINTING, decision.reason, payload=Checkpointing(
                purpose="drain", save_anyway=decision.kind is DrainKind.SAVE_ANYWAY))
        else:
            self._transition(S.RELEASING, decision.reason,
                             payload=Releasing(cause=d.cause, lost_steps=decision.lost_steps))

    def _checkpointing(self) -> None:
        group = self.group
        assert group is not None
        d = self.drain
        t0 = time.perf_counter()
        try:
            out = group.save(wait=True)
        except GroupFailure as exc:
            self._group_failed(exc)
            return
        cost = time.perf_counter() - t0
        self.progress.save_costs.append(cost)
        self.progress.last_committed = out[0]["step"]
        if self._recovery is not None:
            self._recovery["saved_step"] = out[0]["step"]
            self._recovery["save_s"] = cost
        if d is not None and d.stop and self.progress.step >= self.cfg.run.total_steps:
            if self.on_final_group is not None:
                try:
                    self.on_final_group(group)
                except Exception as exc:  # a test/export hook must never fail the run
                    log.error("final_group_hook_failed", error=str(exc))
            self._teardown_group(graceful=True)
            self._transition(S.SUCCEEDED, f"reached step {self.progress.step}")
            return
        if d is not None and d.stop:
            self._teardown_group(graceful=True)
            self._fail(d.reason + f"; checkpoint at step {self.progress.step} is intact",
                       StopCause.OPERATOR)
            return
        self._transition(S.RELEASING, f"checkpoint at step {out[0]['step']} committed",
                         payload=Releasing(cause=d.cause if d else None, lost_steps=0))

    def _releasing(self) -> None:
        d = self.drain
        t0 = time.perf_counter()
        self._teardown_group(graceful=d is not None)
        if self._recovery is not None:
            self._recovery["teardown_s"] = time.perf_counter() - t0
        if d is not None:
            self.excluded |= d.doomed_nodes
            self.drain = None
            cause = d.cause
            reason = d.reason
        else:
            cause = self.pending_cause or StopCause.HOST_LOST
            reason = self.pending_reason
        if d is not None and d.regrow:
            self._transition(S.PLANNING, "re-forming on more slices")
            return
        decision = self.policies.budget.decide(RestartObservation(
            cause=cause, now=self.clock(), history=tuple(self.restart_history)))
        if isinstance(decision, GiveUp):
            self._fail(decision.reason, cause)
            return
        self.restart_history.append(RestartRecord(cause=cause, at=self.clock()))
        if decision.delay_s <= 0:
            self._transition(S.PLANNING, f"re-forming after {cause.value}: {reason}")
        else:
            self._transition(S.BACKOFF, f"backing off {decision.delay_s:.1f}s after {cause.value}",
                             payload=Backoff(until=decision.until, cause=cause,
                                             attempt=decision.attempt))

    def _waiting(self) -> None:
        payload = self.lifecycle.payload
        deadline = payload.deadline if isinstance(payload, WaitingForCapacity) else self.clock()
        while self.clock() < deadline:
            self._poll_events(in_mesh=False)
            hosts = [h for h in self.cluster.hosts() if h.node_id not in self.excluded]
            if len(_complete_slices(hosts, self.hosts_per_slice or 1)) >= self.target_slices:
                break
            self.sleep(0.5)
        self._transition(S.PLANNING, "capacity changed or wait bound reached")

    def _backoff(self) -> None:
        payload = self.lifecycle.payload
        until = payload.until if isinstance(payload, Backoff) else self.clock()
        while self.clock() < until:
            self.sleep(min(0.2, max(0.0, until - self.clock())))
        self._transition(S.PLANNING, "backoff over")

    # ---- running details ----------------------------------------------------------------

    def _chunk_end(self, every: int) -> int:
        step = self.progress.step
        total = self.cfg.run.total_steps
        per_call = self.cfg.run.steps_per_call
        if not per_call:
            recent = self.progress.step_times[-10:]
            st = statistics.median(recent) if recent else 0.2
            per_call = max(1, min(100, int(1.0 / max(st, 1e-3))))
        # End chunks on save steps: a grow waits for a committed step at a chunk boundary.
        until = min(total, step + per_call, (step // every + 1) * every)
        for f in self.policies.chaos.faults:  # stop exactly at a chaos step
            if f.kind is FaultKind.HANG_INIT:
                continue
            if step < f.at_step < until and f.key not in self.fired_faults:
                until = f.at_step
        return until

    def _arm_faults(self, until: int) -> None:
        """Deterministic faults keyed by (host, step): kill/hang armed in the actor, notices
        sent."""
        assert self.group is not None
        step = self.progress.step
        for f in self.policies.chaos.faults:
            if f.key in self.fired_faults or f.at_step < step or f.at_step >= until + 1:
                continue
            if f.host >= len(self.group.actors):
                continue
            in_actor = ((f.kind in (FaultKind.KILL, FaultKind.HANG) and step <= f.at_step < until)
                        or (f.kind is FaultKind.KILL_IN_SAVE and step < f.at_step <= until))
            if in_actor:
                self.fired_faults.add(f.key)
                self._arm_in_actor(f)
            elif f.kind in (FaultKind.PREEMPT, FaultKind.UNHEALTHY) and f.at_step == step:
                self.fired_faults.add(f.key)
                self._inject_notice(f)

    def _arm_init_faults(self) -> None:
        """``hang_init`` faults: a host of the group being formed never joins the JAX group."""
        assert self.group is not None
        for f in self.policies.chaos.faults:
            if (f.kind is FaultKind.HANG_INIT and f.key not in self.fired_faults
                    and f.at_step <= self.progress.step and f.host < len(self.group.actors)):
                self.fired_faults.add(f.key)
                self._arm_in_actor(f)

    def _arm_in_actor(self, fault: Any) -> None:
        """Set the fault in the actor before the next call (its calls may run concurrently)."""
        assert self.group is not None
        log.info("chaos_armed", kind=fault.kind.value, host=fault.host, step=fault.at_step)
        ref = self.group.actors[fault.host].inject_fault.remote(
            {"at_step": fault.at_step, "kind": fault.kind.value})
        try:
            ray.get(ref, timeout=30)
        except Exception as exc:  # a dying actor: the next wait reports its death
            log.warning("chaos_arm_failed", error=str(exc))

    def _inject_notice(self, fault: Any) -> None:
        assert self.plan is not None
        host = self.plan.hosts[fault.host]
        kind = "preemption_notice" if fault.kind is FaultKind.PREEMPT else "host_unhealthy"
        payload = {"schema_version": 1, "kind": kind,
                   "id": f"chaos-{fault.at_step}-{fault.host}-{kind}",
                   "target": {"job": self.cfg.run.name, "host": host.instance},
                   "deadline": self.clock() + fault.deadline_s, "source": "chaos"}
        log.info("chaos_notice", kind=kind, host=host.instance, step=fault.at_step)
        if self.intake is not None:
            self.intake.submit(payload, source="chaos")
        else:
            self._handle_event_dict(payload)

    def _wait_chunk(self, refs: list[Any], *, steps: int) -> list[dict]:
        """Wait for a chunk of ``steps`` steps while polling events; bounded by
        ``steps × timeouts.step_s``. Hosts that finished before a peer failed tell how far the
        group got, so the lost steps of an unannounced failure are counted from there."""
        assert self.group is not None
        n = max(1, steps)
        deadline = self.clock() + self.cfg.timeouts.step_s * n
        pending = list(refs)
        last_host_poll = 0.0
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending),
                                     timeout=self.poll_interval_s)
            failure: GroupFailure | None = None
            for ref in done:
                try:
                    out = self.group.result_of(refs, ref)  # GroupFailure on death / error
                except GroupFailure as exc:
                    failure = failure or exc
                    continue
                p = self.progress
                p.max_step_reached = max(p.max_step_reached, int(out["step"]))
            if failure is not None:
                raise failure
            now = self.clock()
            self._poll_events(in_mesh=True)
            if now - last_host_poll > 1.0:
                last_host_poll = now
                self._poll_host_watchers()
            if pending and now > deadline:  # stacks are dumped by _group_failed
                raise BarrierTimeout("step", self.cfg.timeouts.step_s * n,
                                     hosts=tuple(i for i, r in enumerate(refs) if r in pending))
        return ray.get(list(refs))

    def _absorb(self, results: list[dict], every: int) -> None:
        steps = {r["step"] for r in results}
        if len(steps) != 1:
            raise GroupFailure(f"hosts stopped at different steps {sorted(steps)}")
        p = self.progress
        p.step = steps.pop()
        p.max_step_reached = max(p.max_step_reached, p.step)
        for rec in results[0]["records"]:
            p.step_times.append(rec["step_time_s"])
            if p.first_loss is None:
                p.first_loss = rec["loss"]
            p.last_loss = rec["loss"]
            if rec["step"] % every == 0:
                p.last_committed = rec["step"]  # async: committed once the next save starts
            if rec["checkpoint_blocking_s"]:
                p.save_costs.append(rec["checkpoint_blocking_s"])
            if self.on_step is not None:
                try:
                    self.on_step(rec, self._step_context())
                except Exception as exc:  # a metric must never stop training
                    log.error("metric_record_failed", error=str(exc))
        del p.step_times[:-200]

    def cfg_interval(self) -> int:
        """Steps between periodic saves, from the save policy (fixed or Young/Daly).

        Young/Daly adapts to the measured step time, save cost and the interruptions seen so
        far (every restart counts); hosts save at multiples of the interval.
        """
        p = self.progress
        now = self.clock()
        decision = self.policies.save.decide(SaveObservation(
            step=p.step, last_save_step=p.last_committed, now=now,
            step_time_s=statistics.median(p.step_times[-20:]) if p.step_times else None,
            save_cost_s=statistics.median(p.save_costs[-5:]) if p.save_costs else None,
            interruptions=len(self.restart_history), observed_s=now - self.started_at))
        every = decision.interval_steps or self.ctl.checkpoint_interval.every_steps
        if every != self._last_interval:
            log.info("checkpoint_interval", every_steps=every, reason=decision.reason,
                     kind=self.ctl.checkpoint_interval.kind)
            self._last_interval = every
        return every

    def _step_context(self) -> dict:
        assert self.plan is not None
        return {"devices": self.plan.devices, "flops": self.flops, "incarnation": self.incarnation,
                "slices": self.plan.num_slices,
                "tokens": self.cfg_for(self.plan.num_slices, self.plan.hosts_per_slice
                                       ).train.global_batch * (self.cfg.model.seq_len - 1),
                "peak": self.peak}

    def _check_grow(self) -> None:
        assert self.plan is not None
        if self.drain is not None or self.plan.num_slices >= self.target_slices:
            return
        hosts = [h for h in self.cluster.hosts() if h.node_id not in self.excluded]
        spare = [s for s in _complete_slices(hosts, self.plan.hosts_per_slice)
                 if s not in self.plan.slice_names]
        decision = self.policies.grow.decide(GrowObservation(
            now=self.clock(), current_slices=self.plan.slice_names, spare_slices=tuple(spare),
            target_slices=self.target_slices, step=self.progress.step,
            last_committed_step=self.progress.last_committed, last_resize_at=self.last_resize_at))
        if decision.kind is GrowKind.HOLD:
            return
        log.info("grow", reason=decision.reason, slices=list(decision.slices))
        self.drain = DrainRequest(cause=StopCause.OPERATOR, reason=decision.reason,
                                  event_id=f"grow-{self.progress.step}", deadline=None, regrow=True)

    def _enter_drain(self) -> None:
        d = self.drain
        assert d is not None
        self._recovery = {"kind": "announced", "cause": d.cause.value, "event_id": d.event_id,
                          "notice_at": d.noticed_at or self.clock(),
                          "boundary_step": self.progress.step, "t_boundary": self.clock()}
        self._transition(S.DRAINING, d.reason, payload=Draining(
            event_id=d.event_id, deadline=d.deadline,
            doomed_hosts=tuple(sorted(d.doomed_nodes)), cause=d.cause))

    def _finish_recovery(self) -> None:
        r = self._recovery
        if r is None:
            return
        r["first_step_at"] = self.clock()
        start = r.get("notice_at") or r.get("failed_at")
        if start is not None:
            r["to_first_step_s"] = r["first_step_at"] - start
        r["phases_s"] = self._phases_since(r.get("t_boundary") or r.get("failed_at") or start)
        self.recoveries.append(r)
        log.info("recovered", **{k: v for k, v in r.items() if k != "phases_s"},
                 phases=r["phases_s"])
        self._recovery = None

    def _phases_since(self, t0: float | None) -> dict[str, float]:
        if t0 is None:
            return {}
        out: dict[str, float] = {}
        for t in self.lifecycle.timeline:
            if t.at >= t0 and t.prev is not None and t.prev is not S.RUNNING:
                out[t.prev.value] = out.get(t.prev.value, 0.0) + t.prev_duration_s
        return {k: round(v, 3) for k, v in out.items()}

    # ---- events -------------------------------------------------------------------------

    def _poll_events(self, *, in_mesh: bool) -> None:
        if self.intake is None:
            return
        hosts = list(self.plan.hosts) if (self.plan and in_mesh) else []
        try:
            events = self.intake.poll(hosts, self.incarnation)
        except Exception as exc:  # the intake must never take the run down
            log.error("event_poll_failed", error=str(exc))
            return
        for ev in events:
            self._handle_event(ev)

    def _poll_host_watchers(self) -> None:
        if self.group is None:
            return
        refs = [a.poll_events.remote() for a in self.group.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
        for ref in ready:
            try:
                for payload in ray.get(ref):
                    if self.intake is not None:
                        self.intake.submit(payload, source="metadata")
            except Exception as exc:  # a dying actor: its death is handled by the chunk wait
                log.debug("host_poll_failed", error=str(exc))

    def _handle_event_dict(self, payload: dict) -> None:
        from orchestrator.events.model import Event

        self._handle_event(Event.from_json(payload, now=self.clock()))

    def _handle_event(self, ev: Any) -> None:
        """Turn a clean event into a drain request (or nothing), recording what was done."""
        kind = ev.kind.value
        if kind in ("alert_firing", "alert_resolved", "operator_resume"):
            self._record_action(ev, "noted", reason="no driver action for this kind")
            return
        doomed = self._targets(ev)
        if kind == "operator_stop":
            self.drain = DrainRequest(cause=StopCause.OPERATOR, reason="stop requested by operator",
                                      event_id=ev.id, deadline=ev.deadline, stop=True, event=ev,
                                      noticed_at=self.clock())
            self._record_action(ev, "stop")
            return
        if kind == "host_unhealthy":
            if not doomed:
                self._record_action(ev, "ignored", reason="host not in this run")
                return
            for node in doomed:
                self.health_reports.append(HealthReport(host=node, at=self.clock(), healthy=False))
                decision = self.policies.health.decide(HealthObservation(
                    now=self.clock(), host=node, reports=tuple(self.health_reports),
                    cordoned=frozenset(self.cordoned), in_mesh=True,
                    last_health_drain_at=self.last_health_drain_at))
                if decision.cordon:
                    self.cordoned.add(node)
                    self.excluded.add(node)
                if decision.drain and self.drain is None:
                    self.last_health_drain_at = self.clock()
                    self.drain = DrainRequest(cause=StopCause.HARDWARE_HEALTH,
                                              reason=decision.reason, event_id=ev.id,
                                              deadline=ev.deadline, doomed_nodes=frozenset({node}),
                                              event=ev, noticed_at=self.clock())
                self._record_action(ev, f"health:{decision.kind.value}", reason=decision.reason)
            return
        if kind in ("host_lost", "slice_lost") and not doomed:
            self._record_action(ev, "ignored", reason="target not in the mesh")
            return
        if kind in ("host_lost",):
            self.excluded |= doomed
            self._record_action(ev, "excluded", reason="host lost; the chunk wait tears down")
            return
        cause = StopCause.MAINTENANCE if kind == "maintenance_scheduled" else (
            StopCause.OPERATOR if kind == "operator_drain" else StopCause.SPOT_PREEMPTION)
        if self.drain is not None:
            self.drain.doomed_nodes |= doomed
            self._record_action(ev, "merged",
                                reason=f"drain already pending ({self.drain.event_id})")
            return
        names = (sorted(h.instance for h in self.plan.hosts if h.node_id in doomed)
                 if self.plan else [])
        self.drain = DrainRequest(cause=cause, reason=f"{kind} for {names or 'the whole job'}",
                                  event_id=ev.id, deadline=ev.deadline,
                                  doomed_nodes=frozenset(doomed), event=ev,
                                  noticed_at=self.clock())
        self._record_action(ev, "drain", reason=f"stop at the next step boundary "
                            f"(step ≥ {self.progress.step})")

    def _targets(self, ev: Any) -> set[str]:
        if self.plan is None:
            return set()
        t = ev.target
        out: set[str] = set()
        for h in self.plan.hosts:
            by_slice = t.slice and not t.host and h.slice_name == t.slice
            if (t.host and h.matches(t.host)) or by_slice:
                out.add(h.node_id)
        return out

    def _record_action(self, event: Any, action: str, **details: Any) -> None:
        """What the controller did about an event: in events.jsonl (via the intake) and the log."""
        log.info("event_action", event_id=getattr(event, "id", event), action=action, **details)
        if self.intake is None or event is None or isinstance(event, str):
            return
        try:
            self.intake.record_action(event, action, **details)
        except Exception as exc:  # recording must never stop the run
            log.error("event_record_failed", error=str(exc))

    # ---- failures -----------------------------------------------------------------------

    def _record_actor_deaths(self, exc: GroupFailure, error_type: str) -> None:
        """Ray as an event source: each dead host actor becomes a HOST_LOST record in the event
        log. Recorded, not fed back: the failure is already being handled, and the host's node
        may be alive and fit to place on again (a killed process is not a lost VM)."""
        if self.intake is None or self.plan is None or error_type != "ActorDiedError":
            return
        from orchestrator.events.ray_source import event_from_exception

        for i in exc.hosts:
            if 0 <= i < len(self.plan.hosts):
                try:
                    cause = exc.__cause__
                    if not isinstance(cause, ray.exceptions.RayActorError):
                        cause = ray.exceptions.ActorDiedError()  # found dead by the probe
                    ev = event_from_exception(cause, self.plan.hosts[i],
                                              job=self.cfg.run.name, incarnation=self.incarnation,
                                              now=self.clock())
                    self.intake.record_action(ev, "group_failure", cause="actor died",
                                              error=str(exc)[:500])
                except Exception as err:  # recording must never stop the recovery
                    log.error("actor_death_record_failed", error=str(err))

    def _group_failed(self, exc: GroupFailure) -> None:
        """Unannounced failure: the whole group goes; re-form from the last checkpoint."""
        if isinstance(exc, BarrierTimeout):  # a hang: a peer that aborted meanwhile is a symptom
            error_type = "BarrierTimeout"
            self._dump_stacks(exc.phase)
        else:
            error_type = type(exc.__cause__).__name__ if exc.__cause__ else type(exc).__name__
        if self.group is not None and error_type not in ("ActorDiedError", "ActorUnavailableError",
                                                         "BarrierTimeout"):
            dead = self.group.dead_hosts()
            if dead:  # a peer died; the survivor's collective error is a consequence
                error_type = "ActorDiedError"
                exc = GroupFailure(f"host(s) {list(dead)} died ({exc})", hosts=dead)
        cls = self.policies.classifier.decide(StopObservation(error_type=error_type,
                                                              message=str(exc)))
        log.warning("group_failed", error=str(exc), cause=cls.cause.value, hosts=list(exc.hosts))
        self._record_actor_deaths(exc, error_type)
        self.pending_cause = cls.cause
        self.pending_reason = str(exc)
        self.drain = None
        if self._recovery is not None:  # failed again before the first step: one recovery
            self._recovery.setdefault("further_failures", []).append(
                {"cause": cls.cause.value, "error": str(exc), "at": self.clock()})
        else:
            self._recovery = {"kind": "unannounced", "cause": cls.cause.value,
                              "error": str(exc), "failed_at": self.clock(),
                              "failed_step": self.progress.step}
        if (self._chunk_started_at is not None and self.lifecycle.state is S.RUNNING
                and "since_chunk_start_s" not in self._recovery):
            # A fault that fires at a chunk's start (chaos kill) is detected this much later.
            self._recovery["since_chunk_start_s"] = round(self.clock() - self._chunk_started_at, 3)
        if cls.cause is StopCause.HOST_LOST and self.plan is not None:
            dead = self._dead_nodes()
            self.excluded |= dead
        lost_estimate = self.progress.max_step_reached - (self.progress.last_committed or 0)
        self._transition(S.RELEASING, f"{cls.cause.value}: {exc}",
                         payload=Releasing(cause=cls.cause, lost_steps=max(0, lost_estimate)))

    def _dead_nodes(self) -> set[str]:
        """Nodes of this plan that are gone: not alive in the cluster view, or unreachable."""
        alive = {h.node_id for h in self.cluster.hosts()}
        assert self.plan is not None
        gone = {h.node_id for h in self.plan.hosts if h.node_id not in alive}
        rest = [h.node_id for h in self.plan.hosts if h.node_id not in gone]
        probe = getattr(self.cluster, "unreachable", None)  # optional for simple views
        if probe is not None and rest:
            gone |= set(probe(rest))
        if gone:
            log.warning("nodes_gone", nodes=sorted(gone))
        return gone

    def _dump_stacks(self, phase: str) -> None:
        if self.group is None:
            return
        d = self.run_dir / "diagnostics"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"stacks-{phase}-inc{self.incarnation}-{int(self.clock())}.txt"
        stacks = self.group.stacks()
        path.write_text("\n".join(f"===== host {i}\n{s}" for i, s in stacks.items()))
        log.warning("diagnostics_written", path=str(path), phase=phase)

    def _teardown_group(self, *, graceful: bool) -> None:
        if self.group is not None:
            self.group.shutdown(graceful=graceful, timeout_s=self.cfg.timeouts.save_s)
            self.group = None

    def _fail(self, reason: str, cause: StopCause | None) -> None:
        self._teardown_group(graceful=False)
        self.final_reason = reason
        if not self.lifecycle.terminal:
            self._transition(S.FAILED, reason, payload=Failed(reason=reason, cause=cause))

    # ---- helpers ------------------------------------------------------------------------

    def _transition(self, to: RunState, reason: str, payload: Any = None) -> None:
        plan = self.plan
        self.lifecycle.transition(
            to, reason=reason, step=self.progress.step, incarnation=self.incarnation,
            slices=plan.slice_names if plan else (), hosts=plan.num_processes if plan else 0,
            payload=payload)
        if to in (S.SUCCEEDED, S.FAILED):
            self.final_reason = reason

    def _initial_target_slices(self) -> int:
        c = self.cfg.cluster
        if c.slices:
            return c.slices
        if c.mode != "tpu":
            return c.emulate.slices
        return max(1, len({h.slice_name for h in self.cluster.hosts()}))

    def _hosts_per_slice(self, hosts: Sequence[HostRef]) -> int:
        c = self.cfg.cluster
        if c.mode != "tpu":
            return c.emulate.hosts_per_slice
        counts: dict[str, int] = {}
        for h in hosts:
            counts[h.slice_name] = counts.get(h.slice_name, 0) + 1
        return max(counts.values()) if counts else 1

    def cfg_for(self, slices: int, hosts_per_slice: int) -> RunConfig:
        """The config for a mesh of ``slices`` slices: global batch per the resize policy."""
        base_slices = self.target_slices
        if slices == base_slices:
            self.batch_plan = None
            return self.cfg
        dev = (self.plan.devices_per_host if self.plan
               else self.cfg.cluster.emulate.devices_per_host)
        base = self.cfg.validate_for(slices=base_slices, hosts_per_slice=hosts_per_slice,
                                     devices_per_host=dev)
        new = self.cfg.mesh.resolve(slices=slices, devices_per_slice=hosts_per_slice * dev)
        decision = self.policies.resize.decide(ResizeObservation(
            base_global_batch=self.cfg.train.global_batch, base_dp=base.batch_parallel,
            new_dp=new.batch_parallel, processes=slices * hosts_per_slice))
        if not isinstance(decision, BatchPlan):
            raise TopologyError(decision.reason, fix=decision.fix)
        self.batch_plan = decision
        log.info("batch_on_resize", mode=decision.mode.value, global_batch=decision.global_batch,
                 accum_steps=decision.accum_steps, lr_scale=decision.lr_scale,
                 reason=decision.reason)
        train = dataclasses.replace(self.cfg.train, global_batch=decision.global_batch,
                                    learning_rate=self.cfg.train.learning_rate * decision.lr_scale)
        return dataclasses.replace(self.cfg, train=train)

    def _summary(self) -> RunSummary:
        now = self.clock()
        phases = {k.value: round(v, 3) for k, v in self.lifecycle.durations(now).items()}
        restarts: dict[str, int] = {}
        for r in self.restart_history:
            restarts[r.cause.value] = restarts.get(r.cause.value, 0) + 1
        state = self.lifecycle.state
        st = self.progress.step_times
        summary = RunSummary(
            state=state.value, reason=self.final_reason, step=self.progress.step,
            total_steps=self.cfg.run.total_steps, lost_steps=self.lost_steps, restarts=restarts,
            phases_s=phases, wall_s=round(now - self.started_at, 3),
            first_loss=self.progress.first_loss, last_loss=self.progress.last_loss,
            median_step_s=statistics.median(st) if st else None,
            compile_s=[round(c, 3) for c in self.compile_times], recoveries=self.recoveries,
            exit_code=0 if state is S.SUCCEEDED else 1)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=2,
                                                                  default=str))
        except OSError as exc:
            log.error("summary_write_failed", error=str(exc))
        return summary


class _MetricsListener:
    """Forwards lifecycle transitions to the metrics pipeline (never raises)."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def on_transition(self, transition: Any) -> None:
        self.metrics.on_transition(transition.to_json())


def _complete_slices(hosts: Sequence[HostRef], hosts_per_slice: int) -> list[str]:
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h.slice_name] = counts.get(h.slice_name, 0) + 1
    return sorted(s for s, n in counts.items() if n >= hosts_per_slice)
