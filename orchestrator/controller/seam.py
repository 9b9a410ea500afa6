"""The controller's only view of the workers and the cluster: protocols with typed results.

Everything Ray (actors, calls, kills, death detection, node view) lives behind ``WorkerGroup``
and ``ClusterView``; the controller package imports neither ``ray`` nor ``jax``. A phase call
either returns its typed result or raises ``GroupFailed`` carrying a typed failure status;
``poll`` returns one of ``Running``, ``Progress``, ``HostsLost``, ``Hung``, ``Fatal`` and never
raises. (A chunk's end is ``Progress``: the driver, not the group, decides when the run is done,
so there is no separate "done" status.) The real
implementation is ``orchestrator.raygroup.group``; tests use ``tests.controller.fakes``; the
simulator ``orchestrator.sim.group``.

What a group *may* do beyond the core (warm standby processes, a RAM tier, compiling a shrink's
step ahead, chaos faults) are separate small protocols the controller checks for with
``isinstance``: a group without one (the simulator's) simply does not implement it, and the
controller takes the path it takes when the capability declines.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchestrator.config import RunConfig
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import MeshPlan
from policies.causes import FailureKind

if TYPE_CHECKING:
    from orchestrator.events.model import Event

# ---- typed statuses ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Running:
    """The chunk is still in flight; ``pending`` are the hosts that have not returned yet."""

    pending: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Every host finished the chunk at ``step``. ``committed_step`` is the newest step whose
    save the checkpoint library reports committed (None: none yet); ``records`` are host 0's
    per-step records (dicts with step, loss, step_time_s, lr, grad_norm, saved,
    checkpoint_blocking_s, wall_time)."""

    step: int
    committed_step: int | None = None
    records: tuple[dict, ...] = ()
    stopped_early: bool = False


@dataclass(frozen=True, kw_only=True)
class HostsLost:
    """Hosts (mesh indices) that are gone or failed, and how (one closed set of kinds)."""

    hosts: tuple[int, ...]
    kind: FailureKind
    message: str
    nodes_gone: frozenset[str] = frozenset()
    step_reached: int | None = None


@dataclass(frozen=True, kw_only=True)
class Hung:
    """A bounded phase passed its bound; ``hosts`` had not answered."""

    phase: str
    hosts: tuple[int, ...]
    seconds: float
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class CorruptCheckpoint:
    """The checkpoint at ``step`` could not be read consistently by the group: skip it."""

    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class Fatal:
    """A host raised an error that no retry can fix (a checkpoint from another model, a bad
    config): the run stops with ``message``, which names the fix."""

    message: str
    hosts: tuple[int, ...] = ()


ChunkStatus = Running | Progress | HostsLost | Hung | Fatal
Failure = HostsLost | Hung | CorruptCheckpoint | Fatal


class GroupFailed(Exception):
    """A phase call could not complete; ``status`` says how (never a Ray exception)."""

    def __init__(self, status: Failure) -> None:
        self.status = status
        super().__init__(describe(status))


def describe(status: Failure) -> str:
    if isinstance(status, Fatal):
        return status.message
    if isinstance(status, CorruptCheckpoint):
        return f"checkpoint step {status.step} is unreadable ({status.reason}); falling back"
    if isinstance(status, Hung):
        return (status.message or
                f"{status.phase} did not finish within {status.seconds:g}s on hosts "
                f"{list(status.hosts)}")
    return status.message or f"hosts {list(status.hosts)}: {status.kind.value}"


@dataclass(frozen=True, kw_only=True)
class Formed:
    """``instance_ids``: GCE instance id -> name, as each host read it from its own metadata
    server (empty off GCE), so events that name a host only by numeric id can be targeted."""

    hosts: int
    metadata_watchers: int = 0
    instance_ids: dict[str, str] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    """How many host processes were "fresh", "parked" (kept from the drained group and
    re-initialised in process) or "standby" (warm on a spare host)."""


@dataclass(frozen=True, kw_only=True)
class Restored:
    """``restored_step`` None means a fresh start from the seed. ``skipped`` are newer
    checkpoints passed over (corrupt or half-written), each ``{"step", "reason"}``."""

    restored_step: int | None
    step: int
    restore_s: float
    skipped: tuple[dict, ...] = ()
    tier: str = "durable"
    """"ram" (the hosts' RAM copies) or "durable" (Orbax on disk)."""
    tier_reason: str = ""
    nbytes: int = 0
    data: dict | None = None
    """Where the data resumed (host 0's ``workers.task.data_state.resume``): tier, step,
    kind, epoch and record index, whether the tier held a record; None from a seam that does
    not say."""


@dataclass(frozen=True, kw_only=True)
class Compiled:
    """``source``: "loaded" (every host loaded its stored executable), "compiled" (none did,
    or host 0 compiled once for the group and the others loaded its file) or "mixed"; ``key``
    is host 0's executable key digest (None with the store off)."""

    compile_s: float
    flops: float | None
    tokens: int | None = None
    """Tokens per step (global batch × the task's tokens per example), for throughput."""
    source: str = "compiled"
    key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Saved:
    step: int
    committed_step: int | None
    save_s: float
    complete: bool = True
    """``copy_to_ram``: every host's copy reached its holders."""


# ---- the protocols ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """What one incarnation of the group is built from: the mesh plan, the config for this mesh
    (global batch and learning rate as the resize policy set them), batch accumulation."""

    plan: MeshPlan
    cfg: RunConfig
    incarnation: int
    run_dir: str
    accum_steps: int = 1
    init_faults: tuple[tuple[int, dict], ...] = ()  # (host, fault) armed before distributed init
    standby: tuple[HostRef, ...] = ()
    """Spare hosts (not in the plan) to keep a warm standby process on."""


class WorkerGroup(Protocol):
    """One incarnation of the JAX group: one host actor per mesh host. The core every group
    implements; what only some can do is in the capability protocols below."""

    def form(self) -> Formed:
        """Start the actors, join one distributed runtime, build the model and step."""

    def restore(self, *, skip_steps: Collection[int] = ()) -> Restored:
        """Restore the newest committed checkpoint not in ``skip_steps`` (or init from seed)."""

    def compile(self) -> Compiled: ...

    def start_chunk(self, until_step: int, *, chunk: int, save_steps: Sequence[int],
                    copy_every: int | None = None) -> None:
        """Start steps up to ``until_step`` on every host (non-blocking); saves start after
        each step in ``save_steps``; ``copy_every``: the RAM tier copies every that many steps
        from now on (None: keep the interval in force)."""

    def poll(self, timeout_s: float) -> ChunkStatus:
        """Wait at most ``timeout_s`` for the chunk; never raises."""

    def request_stop(self, chunk: int) -> None:
        """Ask every host to stop the chunk at the next step boundary they agree on."""

    def save(self) -> Saved:
        """Save the current step and wait until it is committed."""

    def notices(self) -> list[dict]:
        """Notices the hosts' metadata watchers pushed since the last call (driver-owned queue,
        so a notice survives its host)."""

    def measure_peak_flops(self) -> float: ...

    def stacks(self) -> dict[int, str]: ...

    def name_hung(self, status: Hung) -> Hung:
        """``status`` with its hosts narrowed to the ones the others wait for, and why (the
        seam asks the hosts where they are); unchanged when it cannot tell them apart."""

    def shutdown(self, *, graceful: bool, keep_processes: bool = False,
                 doomed: Collection[str] = ()) -> None:
        """Stop every actor (graceful: let pending saves finish first). ``keep_processes``: a
        drained group about to be re-formed; its processes may be kept warm for the next
        group (the seam decides whether it can). ``doomed``: node ids a notice says are going
        away (and with them their slices); processes there are not worth keeping. Idempotent."""


GroupFactory = Callable[[GroupSpec], WorkerGroup]


# ---- optional capabilities: checked with isinstance, never stubbed -------------------------


@runtime_checkable
class WarmStandby(Protocol):
    """Warm processes on the next mesh's new hosts while this group trains (HANDING_OVER)."""

    def warm_up(self, hosts: Sequence[HostRef]) -> bool:
        """Start warm standby processes on ``hosts`` (the next mesh's new hosts); False if no
        warm processes can be kept now (the drain then goes ahead at once)."""

    def warm_ready(self) -> bool:
        """Whether every host ``warm_up`` was asked for has its process warm."""


@runtime_checkable
class RamCopies(Protocol):
    """A RAM tier: the hosts' state copied to peer holders, for notices too short to save."""

    def copy_to_ram(self, *, persist: bool = False) -> Saved:
        """Copy the current step to the RAM tier's holders and wait until they have it
        (``committed_step`` None: nothing durable yet). ``persist``: the holders also write it
        durably, in the background (a drain that hands over in RAM, persisting after)."""


@runtime_checkable
class CompilesAhead(Protocol):
    """Compiles an elastic shrink's step while this group trains."""

    def compile_ahead(self, spec: GroupSpec) -> bool:
        """Compile ``spec``'s step in the background (a mesh over this group's first
        processes) and store it for that group to load; never blocks, never fails the group.
        False if it cannot for this spec."""


@runtime_checkable
class InjectsFaults(Protocol):
    """Chaos: faults armed inside a host (``controller.chaos``)."""

    def inject(self, host: int, fault: dict) -> None:
        """Arm a chaos fault in one host (before its next call)."""


CAPABILITIES: tuple[type, ...] = (WarmStandby, RamCopies, CompilesAhead, InjectsFaults)


class ClusterView(Protocol):
    """The TPU hosts alive now."""

    def hosts(self) -> list[HostRef]: ...

    def platform(self) -> str: ...

    def unreachable(self, node_ids: Collection[str]) -> set[str]: ...


class Intake(Protocol):
    """The event intake as the controller uses it (``orchestrator.events.intake.EventIntake``):
    clean events in, what was done about each one out (``RUN_DIR/events.jsonl``)."""

    id_to_name: Mapping[str, str]
    """GCE instance id -> name, for events that name a host only by its id."""

    def poll(self, hosts: Sequence[HostRef], incarnation: int) -> list[Event]:
        """Accepted events since the last poll (recorded first); ``hosts``: every host a
        notice may name (the mesh and the spares)."""

    def submit(self, payload: dict, *, source: str) -> None:
        """A payload from inside the driver (metadata queue, chaos); never raises."""

    def record_action(self, event: Event, action: str, *, outcome: bool = True,
                      **details: Any) -> None:
        """What the controller did about ``event``; ``outcome`` False: not settled yet."""

    def replay_unhandled(self, now: float) -> list[Event]:
        """Events an earlier driver accepted but never settled, not expired at ``now``."""

    def replay_kept_out(self, now: float) -> dict[str, float]:
        """Node ids earlier drivers kept out for notices not expired at ``now`` -> expiry."""

    def set_instance_ids(self, id_to_name: Mapping[str, str]) -> None:
        """The id -> name map the hosts read from their metadata servers."""


class Clock(Protocol):
    """Wall time and waiting: replaced by a virtual clock in tests and the simulator."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        import time

        return time.time()

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(max(0.0, seconds))
