"""The loop: one handler per state, one place that changes state.

``Controller.run`` calls the handler of the current state, which returns a ``Next``; ``_apply``
is the only code that moves the lifecycle. Every exit path (success, terminal failure, operator
stop, SIGTERM, Ctrl-C, an uncaught error) tears the group down and writes the summary once.
``stop_request`` is the embedding driver's SIGTERM flag (``orchestrator.driver.signals``): the
controller reads it at every poll and drains like an operator stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.controller import (
    draining,
    forming,
    growing,
    planning,
    recovering,
    running,
    waiting,
)
from orchestrator.controller.config import Policies
from orchestrator.controller.context import Next, Placement, Run, log
from orchestrator.controller.ledger import RecoveryLedger
from orchestrator.controller.listener import Listeners, RunListener
from orchestrator.controller.reactions import Reactions
from orchestrator.controller.seam import Clock, ClusterView, GroupFactory, Intake, SystemClock
from orchestrator.controller.summary import RunSummary, write_summary
from orchestrator.controller.wiring import from_config
from orchestrator.lifecycle import Failed, Lifecycle, RunState
from orchestrator.shared.errors import OrchestratorError
from policies.causes import StopCause

S = RunState

HANDLERS: dict[RunState, Callable[[Run], Next]] = {
    S.PLANNING: planning.planning,
    S.FORMING: forming.forming,
    S.RESTORING: forming.restoring,
    S.COMPILING: forming.compiling,
    S.RUNNING: running.running,
    S.HANDING_OVER: running.running,  # the same loop; the drain waits for the warm-up
    S.DRAINING: growing.draining,  # draining.draining, a grow's reason said as such
    S.CHECKPOINTING: draining.checkpointing,
    S.RELEASING: recovering.releasing,
    S.WAITING_FOR_CAPACITY: waiting.waiting,
    S.BACKOFF: recovering.backoff,
}


class Controller:
    """Owns one run from PLANNING to SUCCEEDED/FAILED/STOPPED.

    Everything it works with is passed in: ``make_group`` builds each incarnation's worker
    group, ``cluster`` / ``clock`` / ``intake`` are the other seams; ``policies`` and
    ``listeners`` default to ``wiring.from_config(cfg)`` (the config's policies and chaos
    plug-in: pass ``[*from_config(cfg).listeners, yours]`` to add to them)."""

    def __init__(self, cfg: RunConfig, *, run_dir: Path | str, cluster: ClusterView,
                 make_group: GroupFactory, clock: Clock | None = None,
                 intake: Intake | None = None,
                 policies: Policies | None = None,
                 listeners: Sequence[RunListener] | None = None,
                 poll_interval_s: float = 0.1,
                 stop_request: Callable[[], Any] | None = None,
                 protection: dict | None = None) -> None:
        clock = clock or SystemClock()
        if policies is None or listeners is None:
            wiring = from_config(cfg)
            policies = wiring.policies if policies is None else policies
            listeners = wiring.listeners if listeners is None else listeners
        lifecycle = Lifecycle(run_dir=Path(run_dir), clock=clock.now)
        hosts = cluster.hosts() if cfg.cluster.mode == "tpu" and not cfg.cluster.slices else []
        self.run_state = Run(
            cfg=cfg, ctl=cfg.controller, policies=policies, run_dir=Path(run_dir),
            cluster=cluster, make_group=make_group, clock=clock, lifecycle=lifecycle,
            ledger=RecoveryLedger(),
            placement=Placement(target_slices=planning.initial_target_slices(cfg, hosts)),
            intake=intake, listeners=Listeners(listeners),
            started_at=clock.now(), poll_interval_s=poll_interval_s, stop_request=stop_request,
            protection=dict(protection or {}))
        self.run_state.reactions = Reactions(self.run_state)
        self.final_reason = ""

    @property
    def lifecycle(self) -> Lifecycle:
        return self.run_state.lifecycle

    @property
    def plan(self):
        return self.run_state.plan

    def run(self) -> RunSummary:
        run = self.run_state
        try:
            run.reactions.replay_unhandled()
            while not run.lifecycle.terminal:
                self._apply(HANDLERS[run.lifecycle.state](run))
        except SystemExit:  # sys.exit deep in a handler: the run ends FAILED, the exit goes on
            self._end("the driver is exiting (SystemExit)", StopCause.OPERATOR)
            raise
        except KeyboardInterrupt:  # Ctrl-C, or a second signal cutting a SIGTERM drain short
            unsaved = run.ledger.unsaved_steps()
            self._end(f"interrupted (Ctrl-C, or a second signal during the SIGTERM drain) at "
                      f"step {run.ledger.step}; checkpoint at step {run.ledger.last_committed} "
                      f"is intact, {unsaved} step(s) after it not saved", StopCause.OPERATOR)
        except OrchestratorError as exc:  # a non-retryable error (bad checkpoint, config)
            log.error("run_failed", error=str(exc))
            self._end(str(exc), None)
        except Exception as exc:  # a controller bug: the run still ends with a summary
            log.exception("controller_error", error=repr(exc))
            self._end(f"controller error: {exc!r}; checkpoints are intact. Fix: report this "
                      "bug with RUN_DIR/timeline.jsonl and the driver log", None)
        finally:
            # Also when something escapes the handlers above (a second Ctrl-C during teardown,
            # the simulator's horizon): the summary is written however the loop ends.
            try:
                run.teardown(graceful=False)
            finally:
                summary = write_summary(run, self.final_reason)
        return summary

    def _apply(self, nxt: Next) -> None:
        """The one mutation point: move the lifecycle as the handler asked."""
        run = self.run_state
        plan = run.plan
        record = run.lifecycle.transition(
            nxt.state, reason=nxt.reason, step=run.ledger.step,
            incarnation=run.ledger.incarnation, slices=plan.slice_names if plan else (),
            hosts=plan.num_processes if plan else 0, payload=nxt.payload)
        if nxt.state.terminal:
            self.final_reason = nxt.reason
        run.listeners.notify("on_transition", record)

    def _end(self, reason: str, cause: StopCause | None) -> None:
        if not self.run_state.lifecycle.terminal:
            self._apply(Next(S.FAILED, reason, Failed(reason=reason, cause=cause)))

