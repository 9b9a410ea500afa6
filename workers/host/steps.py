"""The host's step loop (``HostActor.run_steps``): steps up to a bound, or to a stop the driver
asked for, with the save steps, RAM copies and evals the driver's plan puts between them. Kept
apart so the actor stays a shell; what it needs of the others is the small interfaces below.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from workers.host.chaos import Chaos
from workers.host.stops import StopBoard
from workers.host.where import Position

log = logging.getLogger(__name__)


class Checkpoints(Protocol):
    """What the loop uses of the trainer's ``CheckpointStore``."""

    def wait(self) -> None: ...

    def committed_step(self) -> int | None: ...


class StepTrainer(Protocol):
    """What the loop uses of ``workers.training.trainer.Trainer`` (``eval_every`` may be
    missing: no eval)."""

    ckpt: Checkpoints
    task: Any

    @property
    def step(self) -> int: ...

    def train_step(self) -> Any: ...

    def save(self, *, wait: bool = False) -> Any: ...

    def evaluate(self) -> Any: ...


class Copies(Protocol):
    """What the loop uses of the RAM tier (``workers.host.ram.RamTier``)."""

    def after_step(self, step: int, trainer: Any, *, persist: bool = False) -> float: ...

    def can_persist(self) -> bool: ...

    def last_wait_s(self) -> float: ...

    def newest_durable(self, orbax_step: int | None) -> int | None: ...


class StepLoop:
    """Runs chunks of steps; ``position`` mirrors where it is for other threads, ``chaos``
    strikes between steps and saves, ``copies`` takes each step's copy. Owns the stop board:
    a stop request names the chunk it is for."""

    def __init__(self, position: Position, *, chaos: Chaos, copies: Copies) -> None:
        self._position = position
        self._chaos = chaos
        self._copies = copies
        self._stops = StopBoard()

    def reset(self) -> None:
        """Chunk ids start again in the next group (``release``)."""
        self._stops = StopBoard()

    def request_stop(self, chunk: int, at_step: int) -> int:
        """See ``HostActor.request_stop``; the current step."""
        if not self._stops.request(chunk, at_step):
            log.info("stale stop request for chunk %d ignored", chunk)
        return self._position.step

    def run(self, tr: StepTrainer, until_step: int, *, chunk: int | None = None,
            save_steps: list[int] | tuple[int, ...] = (), report: bool = False) -> dict:
        """See ``HostActor.run_steps``."""
        saves = set(save_steps)
        if chunk is not None:
            self._stops.begin(chunk)
        records: list[dict] = []
        blocking = 0.0
        stopped = False

        def settle_saves() -> None:  # asked only by a chaos kill
            tr.ckpt.wait()

        try:
            while tr.step < until_step:
                at = self._stops.stop_at(chunk) if chunk is not None else None
                if at is not None and tr.step >= at:
                    stopped = True
                    break
                self._chaos.before_step(tr.step, settle_saves=settle_saves)
                self._position.in_step = True  # whereabouts: this host entered tr.step + 1
                out = tr.train_step()
                self._position.step, self._position.in_step = out.step, False
                saved, saved_s, ram_s = False, 0.0, 0.0
                if out.step in saves and self._copies.can_persist():
                    ram_s = self._copies.after_step(out.step, tr, persist=True)
                    saved, saved_s = True, ram_s
                    blocking += saved_s
                    self._chaos.in_save(out.step)  # the holder's durable write under way
                elif out.step in saves:
                    so = tr.save()
                    saved, saved_s = so.started, so.blocking_s
                    blocking += saved_s
                    self._chaos.in_save(out.step)
                else:
                    ram_s = self._copies.after_step(out.step, tr)
                wall = time.time()
                # the eval is a collective: every host runs it at the same steps (a pure
                # function of the step, never of a stop request only some have seen yet)
                every = getattr(tr, "eval_every", 0)
                ev = tr.evaluate() if every and out.step % every == 0 else None
                if report:
                    records.append({"step": out.step, "loss": out.loss,
                                    "grad_norm": out.grad_norm, "step_time_s": out.step_time_s,
                                    "lr": out.lr, "checkpoint_blocking_s": saved_s,
                                    "ram_copy_s": ram_s, "saved": saved,
                                    "ram_wait_s": round(self._copies.last_wait_s(), 6)
                                    if ram_s else 0.0,
                                    "saved_from_ram": saved and ram_s > 0,
                                    "metrics": out.extra, "wall_time": wall})
                    if ev is not None:
                        records[-1]["eval"] = ev.as_record(tr.task.tokens_per_example)
        finally:
            if chunk is not None:
                self._stops.end(chunk)
        return {"step": tr.step, "records": records,
                "committed_step": self._copies.newest_durable(tr.ckpt.committed_step()),
                "stopped_early": stopped, "checkpoint_blocking_s": blocking}
