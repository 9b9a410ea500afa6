"""The run's lifecycle: typed states, one mutation point, an explicit table of allowed moves.

Why a table: every failure path (a notice mid-compile, a kill during a save, a budget running out
while waiting) must land somewhere defined; the table is walked exhaustively by a test, so an
unplanned path is a loud error instead of a silent hang. Every transition is logged with the time
spent in the previous state and appended to ``RUN_DIR/timeline.jsonl``, which goodput and the run
report read. The lifecycle notifies no one: the controller hands each transition it applied to
its listeners (``orchestrator.controller.listener``), which can never break the lifecycle.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from orchestrator.lifecycle.payloads import (
    Backoff,
    Checkpointing,
    Compiling,
    Draining,
    Failed,
    HandingOver,
    Planning,
    Releasing,
    Restoring,
    Stopped,
    WaitingForCapacity,
)
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.files import open_append

log = structlog.get_logger(__name__)

TIMELINE_FILE = "timeline.jsonl"


class RunState(StrEnum):
    PLANNING = "PLANNING"
    FORMING = "FORMING"
    RESTORING = "RESTORING"
    COMPILING = "COMPILING"
    RUNNING = "RUNNING"
    HANDING_OVER = "HANDING_OVER"
    DRAINING = "DRAINING"
    CHECKPOINTING = "CHECKPOINTING"
    RELEASING = "RELEASING"
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    BACKOFF = "BACKOFF"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    """Ended on request (SIGTERM, an operator stop event) and not by a fault: the drain's save
    and any steps past the last one are in the summary (``stopped_by``, ``unsaved_steps``)."""

    @property
    def terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)


S = RunState
_ACTIVE = frozenset({S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.HANDING_OVER, S.DRAINING,
                     S.CHECKPOINTING})

# The only allowed moves. Read a row as "from this state the controller may go to ...".
# FAILED is reachable from every non-terminal state (a budget or a fatal error can end the run
# anywhere); STOPPED (a stop asked for: SIGTERM, an operator stop) from the states that wait with
# no group running, where a stop is taken (a running group drains first); terminal states have
# no exits. No self-loops: staying is not a transition.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    # plan a topology from the hosts alive now: form it, or wait (bounded) for capacity
    S.PLANNING: frozenset({S.FORMING, S.WAITING_FOR_CAPACITY, S.FAILED, S.STOPPED}),
    # start host actors + distributed init + build; a failure releases the half-built group
    S.FORMING: frozenset({S.RESTORING, S.RELEASING, S.FAILED}),
    # restore the newest readable checkpoint into the new mesh (or init from the seed)
    S.RESTORING: frozenset({S.COMPILING, S.RELEASING, S.FAILED}),
    S.COMPILING: frozenset({S.RUNNING, S.RELEASING, S.FAILED}),
    # notice / grow / operator -> DRAINING; lost host or timeout -> RELEASING; target -> final save
    S.RUNNING: frozenset({S.HANDING_OVER, S.DRAINING, S.CHECKPOINTING, S.RELEASING, S.FAILED}),
    # a notice with time to spare: training goes on while the replacement hosts warm up; drain
    # when they are warm or at the last safe moment (then the re-form starts cold)
    S.HANDING_OVER: frozenset({S.DRAINING, S.CHECKPOINTING, S.RELEASING, S.FAILED}),
    # all hosts stopped at one step boundary: save, or skip the save (short deadline)
    S.DRAINING: frozenset({S.CHECKPOINTING, S.RELEASING, S.FAILED}),
    # synchronous save: then tear down (re-form, stop) or finish
    S.CHECKPOINTING: frozenset({S.RELEASING, S.SUCCEEDED, S.FAILED}),
    # whole JAX group torn down: re-plan at once (announced), after a backoff (unannounced),
    # or end (budget spent -> FAILED; operator stop or SIGTERM -> STOPPED)
    S.RELEASING: frozenset({S.PLANNING, S.BACKOFF, S.FAILED, S.STOPPED}),
    # bounded: capacity arrived or the bound passed -> PLANNING decides; a stop -> STOPPED
    S.WAITING_FOR_CAPACITY: frozenset({S.PLANNING, S.FAILED, S.STOPPED}),
    S.BACKOFF: frozenset({S.PLANNING, S.FAILED, S.STOPPED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.STOPPED: frozenset(),
}


# The typed payloads live in ``orchestrator.lifecycle.payloads``; every one is named here.
Payload = (Planning | Failed | Stopped | WaitingForCapacity | HandingOver | Draining | Backoff
           | Checkpointing | Releasing | Restoring | Compiling)

# States whose payload must be given, and states whose payload may be given.
REQUIRED_PAYLOAD: dict[RunState, type] = {
    S.PLANNING: Planning,  # every PLANNING but the run's first line, written at creation
    S.FAILED: Failed,
    S.STOPPED: Stopped,
    S.WAITING_FOR_CAPACITY: WaitingForCapacity,
    S.HANDING_OVER: HandingOver,
    S.DRAINING: Draining,
    S.BACKOFF: Backoff,
}
OPTIONAL_PAYLOAD: dict[RunState, type] = {
    S.CHECKPOINTING: Checkpointing,
    S.RELEASING: Releasing,
    S.RESTORING: Restoring,
    S.COMPILING: Compiling,
}


# ---------------------------------------------------------------------------------------------
# Transitions and errors


class LifecycleError(OrchestratorError):
    """The controller asked for something the lifecycle does not allow (a controller bug)."""


class IllegalTransition(LifecycleError):
    def __init__(self, src: RunState, dst: RunState) -> None:
        self.src = src
        self.dst = dst
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none (terminal)"
        super().__init__(
            f"illegal lifecycle transition {src} -> {dst}",
            fix=f"the controller must go from {src} only to: {allowed}",
        )


@dataclass(frozen=True, kw_only=True)
class Transition:
    """One line of the timeline. ``prev`` is None only for the run's first record."""

    seq: int
    state: RunState
    prev: RunState | None
    at: float
    prev_duration_s: float
    reason: str
    incarnation: int
    slices: tuple[str, ...]
    hosts: int
    step: int
    payload: Payload | None = None

    @property
    def restart_cause(self) -> str | None:
        """The cause label when this transition starts a re-form (``Planning`` payload),
        else None: what every sink counts restarts by."""
        return self.payload.restart_cause if isinstance(self.payload, Planning) else None

    @property
    def restore_tier(self) -> str | None:
        """The tier a restore read (ram, copy, durable) when this transition ends one, else
        None (a fresh start from the seed is not a restore)."""
        p = self.payload
        return p.tier if isinstance(p, Compiling) and p.tier and p.tier != "seed" else None

    def to_json(self) -> dict[str, Any]:
        """The shape fixed in docs/CONTRACTS.md, plus ``payload`` (null or an object)."""
        payload: dict[str, Any] | None = None
        if self.payload is not None:
            payload = {"type": type(self.payload).__name__, **_plain(asdict(self.payload))}
        return {
            "seq": self.seq,
            "state": self.state.value,
            "prev": self.prev.value if self.prev is not None else None,
            "at": self.at,
            "prev_duration_s": self.prev_duration_s,
            "reason": self.reason,
            "incarnation": self.incarnation,
            "slices": list(self.slices),
            "hosts": self.hosts,
            "step": self.step,
            "payload": payload,
        }


Clock = Callable[[], float]


@dataclass
class _Entered:
    state: RunState
    at: float
    seq: int


@dataclass
class Lifecycle:
    """Current state + history. ``transition`` is the only way to change state.

    ``run_dir`` None keeps the timeline in memory only. On construction the run enters
    PLANNING and that is recorded (seq continues after any earlier incarnation's lines).
    """

    run_dir: Path | str | None = None
    clock: Clock = time.time
    incarnation: int = 0
    step: int = 0
    start_reason: str = "run started"
    timeline: list[Transition] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _entered: _Entered = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._path = Path(self.run_dir) / TIMELINE_FILE if self.run_dir is not None else None
        first = Transition(
            seq=self._next_seq_on_disk(), state=S.PLANNING, prev=None, at=self.clock(),
            prev_duration_s=0.0, reason=self.start_reason, incarnation=self.incarnation,
            slices=(), hosts=0, step=self.step,
        )
        self._record(first)

    # -- queries ------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._entered.state

    @property
    def payload(self) -> Payload | None:
        return self.timeline[-1].payload

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def time_in_state(self, now: float | None = None) -> float:
        """Seconds since the current state was entered."""
        return max(0.0, (self.clock() if now is None else now) - self._entered.at)

    def durations(self, now: float | None = None) -> dict[RunState, float]:
        """Total seconds spent in each state so far (the current one up to ``now``)."""
        totals: dict[RunState, float] = {}
        for t in self.timeline:
            if t.prev is not None:
                totals[t.prev] = totals.get(t.prev, 0.0) + t.prev_duration_s
        if not self.terminal:
            totals[self.state] = totals.get(self.state, 0.0) + self.time_in_state(now)
        return totals

    # -- the one mutation point --------------------------------------------------------------

    def transition(
        self,
        to: RunState,
        *,
        reason: str,
        step: int,
        incarnation: int,
        slices: Sequence[str],
        hosts: int,
        payload: Payload | None = None,
    ) -> Transition:
        """Move to ``to`` or raise IllegalTransition / LifecycleError; nothing changes on error."""
        to = RunState(to)
        with self._lock:
            src = self._entered.state
            if to not in TRANSITIONS[src]:
                raise IllegalTransition(src, to)
            _check_payload(to, payload)
            now = self.clock()
            record = Transition(
                seq=self._entered.seq + 1, state=to, prev=src, at=now,
                prev_duration_s=max(0.0, now - self._entered.at), reason=reason,
                incarnation=incarnation, slices=tuple(slices), hosts=hosts, step=step,
                payload=payload,
            )
            self.incarnation, self.step = incarnation, step
            self._record(record)
        log.info(
            "transition", **{"from": src.value}, to=to.value,
            duration_s=round(record.prev_duration_s, 3), reason=reason, step=step,
            incarnation=incarnation, hosts=hosts, slices=list(record.slices),
        )
        return record

    # -- internals -----------------------------------------------------------------------------

    def _record(self, record: Transition) -> None:
        self.timeline.append(record)
        self._entered = _Entered(state=record.state, at=record.at, seq=record.seq)
        if self._path is None:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with open_append(self._path) as fh:  # never through a link
                fh.write(json.dumps(record.to_json(), sort_keys=False) + "\n")
                fh.flush()
        except OSError as exc:  # the timeline is evidence, not a reason to stop training
            log.error("timeline_write_failed", path=str(self._path), error=str(exc))

    def _next_seq_on_disk(self) -> int:
        """First seq for this incarnation: one past the last line an earlier driver wrote."""
        if self._path is None or not self._path.exists():
            return 0
        last = -1
        try:
            with self._path.open(encoding="utf-8") as fh:
                for line in fh:
                    try:
                        last = max(last, int(json.loads(line)["seq"]))
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn last line from a crashed driver
        except OSError as exc:
            log.error("timeline_read_failed", path=str(self._path), error=str(exc))
        return last + 1


def _plain(value: Any) -> Any:
    """JSON-native copy: enums to their values, tuples to lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


def _check_payload(to: RunState, payload: Payload | None) -> None:
    required = REQUIRED_PAYLOAD.get(to)
    optional = OPTIONAL_PAYLOAD.get(to)
    expected = required or optional
    if payload is None:
        if required is not None:
            raise LifecycleError(
                f"{to} needs a {required.__name__} payload",
                fix=f"pass payload={required.__name__}(...) to transition({to}, ...)",
            )
        return
    if expected is None or not isinstance(payload, expected):
        want = expected.__name__ if expected else "no payload"
        raise LifecycleError(
            f"{to} takes {want}, got {type(payload).__name__}",
            fix=f"pass the payload type declared for {to} in orchestrator/lifecycle/__init__.py",
        )
