"""One interface for everything that observes or extends a run: the metric sinks, the driver's
answers (MFU peak, goodput), plug-ins (chaos) and tests.

Why one: a new observer should not have to learn four hook styles, and the controller should
have one list to call. Every callback has a no-op default, so a listener overrides only what it
uses. The controller calls them through ``Listeners``, in the order given; a callback that
raises is logged (``listener_failed``) and the run goes on: no listener can stop a run or break
the lifecycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    from orchestrator.controller.context import Run
    from orchestrator.controller.records import EvalRecord, StepRecord
    from orchestrator.controller.seam import WorkerGroup
    from orchestrator.lifecycle import Transition

log = structlog.get_logger("orchestrator.controller")

Peak = tuple[float, str]
"""(peak FLOP/s per device, where that number comes from)."""


class GoodputAnswer(Protocol):
    """What the summary reads of a ``goodput()`` answer (``metrics.goodput.GoodputReport`` is
    one): named here so the controller imports nothing of ``metrics``, a layer up."""

    @property
    def goodput(self) -> float: ...

    @property
    def badput_s(self) -> dict[str, float]: ...

    @property
    def ml_badput_s(self) -> dict[str, float]: ...


class RunListener:
    """No-op defaults for every callback: subclass and override what you use."""

    # ---- what happened (the controller's thread: hand slow work to a thread of your own) --

    def on_transition(self, t: Transition) -> None:
        """After each transition the controller applies (the run's first PLANNING line is
        written when the lifecycle is created, before any listener is called)."""

    def on_step(self, rec: StepRecord) -> None:
        """A step host 0 reported, with its throughput and MFU."""

    def on_eval(self, rec: EvalRecord) -> None:
        """An evaluation host 0 ran after a step (``eval.every``)."""

    def on_event(self, event: dict[str, Any]) -> None:
        """An event the intake accepted (its JSON without the raw payload, plus ``at``), as
        the controller takes it in to decide."""

    def on_final_group(self, group: WorkerGroup) -> None:
        """The group that reached the target, after its final save, before its teardown."""

    # ---- plug-in work at the core loop's fixed points ----------------------------------------

    def init_faults(self, run: Run) -> list[tuple[int, dict]]:
        """(host, fault) pairs to arm in a group being formed, before distributed init."""
        return []

    def chunk_end(self, run: Run, step: int, until: int) -> int:
        """May end the next chunk earlier than ``until`` (never before ``step + 1``)."""
        return until

    def before_chunk(self, run: Run, step: int, until: int) -> None:
        """Right before a chunk of steps ``step+1 .. until`` starts."""

    # ---- answers the run asks for: the first listener that gives one is used ---------------

    def resolve_peak(self, measure: Callable[[], float]) -> Peak | None:
        """The MFU peak, asked after COMPILING until one is given; ``measure()`` times a
        matmul on host 0 (call it only when no table or setting knows the device)."""
        return None

    def goodput(self) -> GoodputAnswer | None:
        """The run's goodput and badput for the summary, asked once as the run ends."""
        return None

    # ---- lifetime: called by the listener's owner (the metrics pipeline on its sinks) ------

    def flush(self) -> None:
        """Push out anything buffered."""

    def close(self) -> None:
        """Flush and release resources; called once, last."""


class Listeners:
    """The run's listeners, called in order, each callback isolated from the run."""

    def __init__(self, listeners: Iterable[RunListener] = ()) -> None:
        self.items: list[RunListener] = list(listeners)
        self._wants: dict[str, bool] = {}

    def wants(self, callback: str) -> bool:
        """Whether any listener overrides ``callback`` (skip building what no one reads)."""
        if callback not in self._wants:
            default = getattr(RunListener, callback)
            self._wants[callback] = any(getattr(type(x), callback, default) is not default
                                        for x in self.items)
        return self._wants[callback]

    def notify(self, callback: str, *args: Any) -> None:
        """Call ``callback`` on every listener; failures are logged, never raised."""
        for listener in self.items:
            _call(listener, callback, args, None)

    def first(self, callback: str, *args: Any) -> Any:
        """The first answer (not None) to ``callback``, asking listeners in order."""
        for listener in self.items:
            answer = _call(listener, callback, args, None)
            if answer is not None:
                return answer
        return None

    def init_faults(self, run: Run) -> list[tuple[int, dict]]:
        out: list[tuple[int, dict]] = []
        for listener in self.items:
            out.extend(_call(listener, "init_faults", (run,), []))
        return out

    def chunk_end(self, run: Run, step: int, until: int) -> int:
        for listener in self.items:
            until = _call(listener, "chunk_end", (run, step, until), until)
        return until


def _call(listener: RunListener, callback: str, args: tuple, default: Any) -> Any:
    try:
        return getattr(listener, callback)(*args)
    except Exception as exc:  # a listener must never stop the run
        log.exception("listener_failed", listener=type(listener).__name__, callback=callback,
                      error=repr(exc))
        return default
