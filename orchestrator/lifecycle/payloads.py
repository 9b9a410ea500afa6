"""The typed payloads of the lifecycle's states: what each transition carries (the table and
the machine are in ``orchestrator.lifecycle``, which names them all)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.causes import StopCause


@dataclass(frozen=True, kw_only=True)
class Failed:
    """Why the run ended: a sentence naming the fix, and the classified cause (if a stop)."""

    reason: str
    cause: StopCause | None = None


@dataclass(frozen=True, kw_only=True)
class Stopped:
    """The run ended because it was asked to: ``by`` is the signal (``"SIGTERM"``) or
    ``"operator"`` (an operator stop event); ``reason`` says what was saved and what was not."""

    reason: str
    by: str


@dataclass(frozen=True, kw_only=True)
class Planning:
    """Why a mesh is planned again. ``cause``: the stop behind this re-form (what its restart
    budget counted); ``grow``: a re-form onto more slices; neither: planning goes on (capacity
    came back, a wait ended) and this is no restart. Sinks read the cause here, never from the
    reason (a sentence for people)."""

    cause: StopCause | None = None
    grow: bool = False

    @property
    def restart_cause(self) -> str | None:
        """The re-form's bounded label (a ``StopCause`` value, or ``grow``); None: no re-form."""
        if self.grow:
            return "grow"
        return self.cause.value if self.cause is not None else None


@dataclass(frozen=True, kw_only=True)
class WaitingForCapacity:
    deadline: float
    needed_slices: int


@dataclass(frozen=True, kw_only=True)
class Draining:
    event_id: str
    deadline: float | None
    doomed_hosts: tuple[str, ...] = ()
    cause: StopCause | None = None


@dataclass(frozen=True, kw_only=True)
class HandingOver:
    """The replacement hosts warming while the old group trains, and the latest drain time."""

    event_id: str
    hosts: tuple[str, ...]
    until: float


@dataclass(frozen=True, kw_only=True)
class Backoff:
    until: float
    cause: StopCause
    attempt: int = 1


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    """Why this save blocks the run (drain, final, grow) and whether it is a gamble."""

    purpose: str
    save_anyway: bool = False


@dataclass(frozen=True, kw_only=True)
class Releasing:
    """What the teardown is for; ``lost_steps``: steps expected to be re-done after the restore.
    ``estimated``: counted from the durable checkpoint before the restore (a RAM copy may hold
    more); what the restore lost is ``Compiling.lost_steps``."""

    cause: StopCause | None = None
    lost_steps: int = 0
    estimated: bool = False


@dataclass(frozen=True, kw_only=True)
class Restoring:
    """``step``: the durable checkpoint expected, an estimate (the restore may read a newer RAM
    copy, or skip an unreadable step); what it read is in ``Compiling.restored_step``."""

    step: int
    estimated: bool = True


@dataclass(frozen=True, kw_only=True)
class Compiling:
    """Where the restored state came from (ram, copy, durable: Orbax, seed), what it cost, and
    ``lost_steps``: the steps this restore rolled back (re-done), counted after it."""

    tier: str
    restored_step: int | None
    restore_s: float = 0.0
    nbytes: int = 0
    lost_steps: int = 0
    data: dict | None = None
    """Where the data resumed: ``{tier, step, kind, epoch, index, records, global_batch,
    recorded, processes, processes_now}`` (``workers.task.data_state.resume``)."""


def data_resumed_text(where: dict | None) -> str:
    """``data resumed at step 5 (epoch 0, record 40) from its record`` for ``Compiling.data``
    and the summary's restores ('' without one)."""
    if not where:
        return ""
    at = f"step {where.get('step')}"
    if "epoch" in where:
        at += f" (epoch {where['epoch']}, record {where.get('index')})"
    if where.get("tier") == "seed":
        return f"data from its start, {at}"
    src = "its record" if where.get("recorded") else "the step (no record in this tier)"
    return f"data resumed at {at} from {src}"
