"""Orbax checkpoints of one process: async saves whose commit is observed, and restores that
survive a corrupt or half-written latest step.

Saves: ``save`` starts an (async) Orbax save; ``committed_step`` is the newest step whose save
Orbax reports finished *and* whose directory is committed on disk (``ckpt_layout``). Orbax's own
``all_steps()``/``latest_step()`` list a save as soon as it has started, so they are never used
to answer "what is committed".

Restores pick the newest committed step not in ``skip_steps``. Directories that are not
committed (a save that died), damaged (commit marker but unreadable metadata), or named in
``skip_steps`` are moved aside by process 0 (``<step>.corrupt-<n>``, never deleted); a foreign
directory (not written by Orbax) or a checkpoint of another model stops the run with a
``CheckpointError`` naming the fix. Process 0 decides and broadcasts, so every process restores
the same step. When reading the arrays fails:

- one process: retry once, then move the step aside and fall back to the previous one in place;
- several processes: raise ``CheckpointCorrupt``. Measured (2 processes, process 1's shard
  truncated): process 1's read fails while process 0 waits in Orbax's restore barrier, and any
  further collective from process 1 is matched against that barrier ("sync_global_devices name
  mismatch"), leaving the group's collectives out of step. Only a new group is safe, so the
  driver re-forms with ``skip_steps`` including the step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.shared import layout
from orchestrator.shared.errors import CheckpointCorrupt, CheckpointError
from orchestrator.shared.layout import StepState
from workers.training import ckpt_space
from workers.training.orbax_import import ocp

log = logging.getLogger(__name__)

_RESTORE, _FRESH, _FOREIGN, _OTHER_MODEL, _IO_ERROR = 0, 1, 2, 3, 4


@dataclass
class RestoreOutcome:
    step: int | None
    """The restored step, or None: nothing committed is usable, start from the seed."""
    state: Any
    skipped: list[dict] = field(default_factory=list)
    """``{"step", "reason", "moved_to"}`` for every step passed over, newest first."""
    data: dict | None = None
    """The step's data record (its ``data`` item, ``workers.task.data_state``); None for a
    checkpoint written before the item existed."""


@dataclass(frozen=True)
class _Decision:
    code: int
    step: int
    skipped: tuple[dict, ...]
    error: CheckpointError | None = None


class CheckpointStore:
    """One Orbax ``CheckpointManager`` over a shared directory, items ``state`` (the train
    state), ``meta`` (run metadata: the task, the plan) and ``data`` (the data position,
    ``workers.task.data_state``)."""

    def __init__(self, directory: str | Path, *, keep: int, async_save: bool,
                 model_fingerprint: str, model_desc: str,
                 before_commit: Callable[[], None] | None = None) -> None:
        """``before_commit`` runs in Orbax's save thread after the data is written and before
        the step is committed (Orbax's ``post_finalization_callback``): a hook for tests that
        need a save held in flight."""
        self.directory = Path(directory).absolute()
        self.model_fingerprint = model_fingerprint
        self.model_desc = model_desc
        async_options = (ocp.AsyncOptions(post_finalization_callback=before_commit)
                         if before_commit is not None and async_save else None)
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
            async_options=async_options)
        self._manager: ocp.CheckpointManager | None = None
        self._pending: list[int] = []
        self._started: set[int] = set()
        self._committed: int | None = None
        self.failed_saves: list[int] = []

    @property
    def manager(self) -> ocp.CheckpointManager:
        """Made on first use, which is always a save or a restore: every process makes it at
        the same point (its creation synchronises them). A group restored from RAM and saving
        from RAM never makes one, and none is made inside a switch (it would lengthen it)."""
        if self._manager is None:
            self._manager = ocp.CheckpointManager(self.directory, options=self._options,
                                                  item_names=("state", "meta", "data"))
        return self._manager

    # ---- saving ---------------------------------------------------------------------------

    def save(self, step: int, state: Any, meta: dict, data: dict | None = None) -> bool:
        """Start saving ``step`` (async when configured); False if it is already saved/saving.
        ``data``: the data record, saved as its own item.

        Every process must call it for the same steps (Orbax synchronises them inside).
        """
        self.committed_step()
        if step in self._started or step in self.manager.all_steps():
            return False
        # a full disk met inside Orbax's async commit hangs the group: refuse the save here
        ckpt_space.check_room(str(self.directory), ckpt_space.state_bytes(state))
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if data is not None:
            items["data"] = ocp.args.JsonSave(data)
        self.manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._started.add(step)
        self._pending.append(step)
        return True

    def committed_step(self) -> int | None:
        """Newest step whose save Orbax reports finished and which is committed on disk."""
        if self._pending and not self.manager.is_saving_in_progress():
            for step in self._pending:
                if layout.is_committed(self.directory, step):
                    self._committed = max(step, self._committed or step)
                else:
                    self.failed_saves.append(step)
                    log.warning("save of step %d finished without a committed directory", step)
            self._pending.clear()
        return self._committed

    def wait(self) -> int | None:
        """Block until the save in flight (if any) has finished; returns ``committed_step``."""
        if self._manager is not None:  # none made: nothing was ever saved here
            self._manager.wait_until_finished()
        return self.committed_step()

    def committed_steps(self) -> list[int]:
        """Committed steps on disk, ascending (never one still being written)."""
        return layout.committed_steps(self.directory)

    # ---- restoring ------------------------------------------------------------------------

    def restore(self, abstract_state: Any, *, skip_steps: Collection[int] = (),
                process_index: int = 0, process_count: int = 1) -> RestoreOutcome:
        """Restore the newest usable committed step not in ``skip_steps`` (see module doc)."""
        skip = set(skip_steps)
        skipped: list[dict] = []
        while True:
            try:
                decision = self._decide(skip, is_primary=process_index == 0)
            except OSError as exc:  # e.g. a move aside refused: tell the peers, not hang them
                decision = _Decision(_IO_ERROR, -1, (), CheckpointError(
                    f"Could not prepare {self.directory} for a restore "
                    f"({type(exc).__name__}: {exc}).",
                    fix="check that the checkpoint directory is writable and has space"))
            code, step = _agree(decision, process_count)
            if process_index == 0:
                skipped.extend(decision.skipped)
            if code == _FRESH:
                self._reload()
                self._committed = None
                return RestoreOutcome(step=None, state=None, skipped=skipped)
            if code in (_FOREIGN, _OTHER_MODEL, _IO_ERROR):
                mine = decision.error if decision.code == code else None
                raise mine if mine is not None else self._refusal(code, step)
            self._reload()
            try:
                state, data = self._read(step, abstract_state,
                                         retries=1 if process_count == 1 else 0)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {str(exc)[:300]}"
                if process_count > 1:
                    raise CheckpointCorrupt(step=step, reason=reason,
                                            hosts=(process_index,)) from None
                moved = layout.move_aside(self.directory / str(step), reason)
                log.error("checkpoint step %d unreadable (%s); moved aside to %s, falling back",
                          step, reason, moved.name)
                skipped.append({"step": step, "reason": reason, "moved_to": moved.name})
                skip.add(step)
                continue
            self._committed = step
            return RestoreOutcome(step=step, state=state, skipped=skipped, data=data)

    def _decide(self, skip: set[int], *, is_primary: bool) -> _Decision:
        """Process 0 moves bad/skipped step directories aside and picks the step to restore.

        Other processes compute the same from the shared directory but touch nothing; what
        they restore is what process 0 broadcasts.
        """
        skipped: list[dict] = []

        def set_aside(d: layout.StepDir, reason: str) -> None:
            moved = layout.move_aside(d.path, reason).name if is_primary else None
            if is_primary:
                log.error("checkpoint step %d: %s; moved aside to %s", d.step, reason, moved)
            skipped.append({"step": d.step, "reason": reason, "moved_to": moved})

        for d in reversed(layout.scan(self.directory)):
            if d.step in skip:
                set_aside(d, "skipped by the driver (a host could not read it)")
                continue
            if d.state is StepState.FOREIGN:
                return _Decision(_FOREIGN, d.step, tuple(skipped), self._refusal(_FOREIGN, d.step))
            if d.state is not StepState.COMMITTED:
                set_aside(d, d.reason)
                continue
            try:
                meta = layout.read_run_meta(d.path)
            except ValueError as exc:
                set_aside(d, str(exc))
                continue
            if layout.task_fingerprint_of(meta) != self.model_fingerprint:
                return _Decision(_OTHER_MODEL, d.step, tuple(skipped),
                                 self._refusal(_OTHER_MODEL, d.step, meta))
            return _Decision(_RESTORE, d.step, tuple(skipped))
        return _Decision(_FRESH, -1, tuple(skipped))

    def _refusal(self, code: int, step: int, meta: dict | None = None) -> CheckpointError:
        where = f"Checkpoint step {step} in {self.directory}"
        if code == _IO_ERROR:
            return CheckpointError(f"Process 0 could not prepare {self.directory} for a restore.",
                                   fix="see process 0's log; check the directory is writable")
        if code == _FOREIGN:
            return CheckpointError(
                f"{where} has no readable run metadata and was not written by Orbax "
                f"(no {layout.STEP_METADATA}, no {layout.COMMIT_MARKER}).",
                fix=f"use a new run.run_dir, or move {self.directory / str(step)} away to "
                    "resume from an older step")
        if meta is None:
            try:
                meta = layout.read_run_meta(self.directory / str(step))
            except ValueError:
                meta = {}
        return CheckpointError(
            f"{where} was written by another task ({json.dumps(layout.task_of(meta))}); "
            f"this run's task is {self.model_desc}.",
            fix=layout.OTHER_TASK_FIX)

    def _read(self, step: int, abstract_state: Any, *, retries: int) -> tuple[Any, dict | None]:
        """The state and the data record (None: a step saved before the ``data`` item)."""
        with_data = (self.directory / str(step) / "data").is_dir()
        for attempt in range(retries + 1):
            try:
                items = {"state": ocp.args.StandardRestore(abstract_state)}
                if with_data:
                    items["data"] = ocp.args.JsonRestore()
                out = self.manager.restore(step, args=ocp.args.Composite(**items))
                return out["state"], (out["data"] if with_data else None)
            except Exception:
                if attempt == retries:
                    raise
                log.warning("restore of step %d failed; retrying once", step, exc_info=True)
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def _reload(self) -> None:
        """Re-read the step list from disk (after process 0 moved directories aside)."""
        self.manager.reload()

    def close(self) -> None:
        if self._manager is None:
            return
        self._manager.wait_until_finished()
        self.committed_step()
        self._manager.close()


def _agree(decision: _Decision, process_count: int) -> tuple[int, int]:
    """Every process takes process 0's decision (a broadcast: also orders its renames first)."""
    if process_count == 1:
        return decision.code, decision.step
    from jax.experimental import multihost_utils

    out = multihost_utils.broadcast_one_to_all(np.array([decision.code, decision.step],
                                                        dtype=np.int32))
    return int(out[0]), int(out[1])
