"""What every phase handler works with: the run's wiring, its data, and the next-state value.

Handlers are functions ``handler(run) -> Next``: they do their phase's side effects through the
seams held here and return the next state with its payload. Only ``core.Controller`` applies a
``Next`` to the lifecycle (the one mutation point).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.config import RunConfig
from orchestrator.controller.config import ControllerConfig, Policies
from orchestrator.controller.ledger import RecoveryLedger
from orchestrator.controller.listener import Listeners
from orchestrator.controller.seam import Clock, ClusterView, GroupFactory, Intake, WorkerGroup
from orchestrator.lifecycle import Lifecycle, Payload, RunState
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import MeshPlan
from policies.causes import StopCause
from policies.resize import BatchPlan

if TYPE_CHECKING:
    from orchestrator.controller.reactions import Reactions
    from orchestrator.events.model import Event
    from policies.reaction import Reaction

log = structlog.get_logger("orchestrator.controller")


@dataclass(frozen=True)
class Next:
    """The state a handler wants next, why, and the state's payload."""

    state: RunState
    reason: str
    payload: Payload | None = None


@dataclass
class Placement:
    """Where the run may be placed: the current plan, hosts never to use again, the target."""

    target_slices: int
    hosts_per_slice: int | None = None
    plan: MeshPlan | None = None
    mesh_cfg: RunConfig | None = None  # the config for ``plan`` (batch/LR after a resize)
    excluded: set[str] = field(default_factory=set)  # node ids: doomed, lost or cordoned
    cordoned: set[str] = field(default_factory=set)
    waiting_since: float | None = None
    last_resize_at: float | None = None
    batch_plan: BatchPlan | None = None
    skip_steps: set[int] = field(default_factory=set)  # corrupt checkpoints never to restore
    standby: tuple[HostRef, ...] = ()  # spare hosts to keep a warm process on
    suspect: set[str] = field(default_factory=set)  # slices whose host just failed
    ahead_for: int = 0  # the incarnation whose group was asked to compile a shrink's step
    ahead_checked_at: float | None = None  # when ``controller.ahead`` last looked for spares


@dataclass
class Pending:
    """Why the group must stop, and what happens after: set by reactions and failures, read by
    DRAINING / CHECKPOINTING / RELEASING."""

    cause: StopCause
    reason: str
    event_id: str = ""
    deadline: float | None = None
    at_step: int | None = None
    doomed: frozenset[str] = frozenset()
    stop: bool = False  # end the run after the save (operator stop, target reached)
    final: bool = False  # the target step was reached
    regrow: bool = False  # re-form on more slices (not a restart)
    announced: bool = True
    noticed_at: float | None = None
    event: Event | None = None
    events: tuple[Event, ...] = ()  # every event merged into this drain: each gets its outcome
    reaction: Reaction | None = None  # the merged reaction behind an event-driven drain
    handover_started: float | None = None  # when HANDING_OVER began
    handover_until: float | None = None  # HANDING_OVER: drain by then even if not warm
    handover: str = ""  # how the handover ended: "ready" or "not ready: ..." (empty: none)
    awaiting_capacity: bool = False  # HANDING_OVER with no replacement yet: train on, await one


@dataclass
class Run:
    """One run's wiring and state, passed to every handler."""

    cfg: RunConfig
    ctl: ControllerConfig
    policies: Policies
    run_dir: Path
    cluster: ClusterView
    make_group: GroupFactory
    clock: Clock
    lifecycle: Lifecycle
    ledger: RecoveryLedger
    placement: Placement
    intake: Intake | None = None
    listeners: Listeners = field(default_factory=Listeners)
    """Everything that observes or extends the run (``controller.listener``)."""
    group: WorkerGroup | None = None
    pending: Pending | None = None
    chunk: int = 0
    flops: float | None = None
    tokens: int | None = None
    peak: tuple[float, str] | None = None
    started_at: float = 0.0
    poll_interval_s: float = 0.1
    reactions: Reactions = field(init=False, repr=False)  # the Controller builds it on this run
    stop_request: Callable[[], Any] | None = None
    """The embedding driver's stop signal (``orchestrator.driver.signals.StopSignals.request``):
    a ``StopRequest`` once SIGTERM came, read at every poll; the handler itself does nothing."""
    stopping_by: Any = None  # the StopRequest this run is draining for (taken once)
    protection: dict = field(default_factory=dict)
    """What the driver chose for the ``auto`` protection settings and why (summary.json)."""

    @property
    def plan(self) -> MeshPlan | None:
        return self.placement.plan

    def now(self) -> float:
        return self.clock.now()

    def teardown(self, *, graceful: bool, keep_processes: bool = False,
                 doomed: Collection[str] = ()) -> None:
        """Stop the current group, if any (idempotent); ``keep_processes``: a re-form follows,
        the seam may keep its processes warm for it (not those on ``doomed`` nodes)."""
        group, self.group = self.group, None
        if group is not None:
            try:
                group.shutdown(graceful=graceful, keep_processes=keep_processes, doomed=doomed)
            except Exception as exc:  # teardown must never mask what caused it
                log.error("group_shutdown_failed", error=str(exc))
