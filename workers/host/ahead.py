"""The host actor's compile-ahead (a mixin of ``workers.host.actor.HostActor``): while this group
trains, compile and store the step of the mesh the run may move to next, so that group loads it
(~0.1 s) inside its downtime instead of compiling it (~2 s here).

The next mesh an announced event forms without new hosts is an elastic shrink: the surviving
slices. Its processes are numbered 0..n-1 whichever slices survive, and on the CPU emulation a
process's device ids follow from its number, so the first n processes of *this* group can
compile it now, over their own devices: the executable they store has the key the shrunk group
will compute (``workers.training.executables``), and the store's key check guards the rest — a group
whose ids differ (a TPU runtime numbers chips its own way) misses, compiles, and logs why.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from orchestrator.shared.hostspec import HostSpec
from workers.host.niceness import LOWEST, lower_this_thread
from workers.training.executables import key_digest

log = logging.getLogger(__name__)

AHEAD_JOIN_S = 120.0
"""How long leaving the group waits for a compile ahead still running (it is the executable the
next group needs); past it the process is not reused (the driver starts a fresh one)."""


class AheadMethods:
    """Needs from the actor: ``_lock``, ``trainer``, ``_ahead`` (the running thread, or None)
    and ``_leaving`` (set by ``quiesce``, cleared by ``rejoin``: no compile ahead starts in a
    process that is leaving its runtime)."""

    _lock: threading.Lock
    trainer: Any
    _ahead: threading.Thread | None
    _leaving: bool
    ahead_results: list[dict]

    def compile_ahead(self, spec: HostSpec) -> bool:
        """Start compiling ``spec``'s step in the background at the lowest CPU priority (the
        step it shares the cores with goes first). ``spec`` is this process's host in a mesh
        over the first ``spec.plan.num_processes`` processes of this runtime. False when a
        compile ahead is running already or ``spec`` cannot be compiled here."""
        if not isinstance(spec, HostSpec):
            raise TypeError(f"compile_ahead needs a HostSpec, got {type(spec).__name__}")
        if spec.executables_dir is None:
            return False  # nowhere to keep it (compile.cache=off)
        with self._lock:  # never after quiesce began: release would clear a busy backend
            if self._leaving or self.trainer is None or self.ahead_running():
                return False
            self._ahead = threading.Thread(target=self._compile_ahead, args=(spec,),
                                           name="compile-ahead", daemon=True)
            self._ahead.start()
        return True

    def ahead_running(self) -> bool:
        thread = self._ahead
        return thread is not None and thread.is_alive()

    def wait_ahead(self, timeout_s: float = AHEAD_JOIN_S) -> list[dict]:
        """Wait for a compile ahead in flight; what every compile ahead of this process did
        (``source`` "compiled", "stored" — already — or "failed" with ``reason``). Raises if
        it is still running after ``timeout_s``."""
        thread = self._ahead
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(f"a compile ahead is still running after {timeout_s:g}s")
        return list(self.ahead_results)

    def _compile_ahead(self, spec: HostSpec) -> None:
        lower_this_thread(LOWEST, what="the compile ahead")
        t0 = time.perf_counter()
        out: dict[str, Any] = {"processes": spec.plan.num_processes,
                               "slices": spec.plan.num_slices}
        try:
            import jax

            from workers.training.trainer import Trainer

            n = spec.plan.num_processes
            if jax.process_index() >= n:
                raise ValueError(f"process {jax.process_index()} is not among the first {n}")
            devices = [d for d in jax.devices() if d.process_index < n]
            trainer = Trainer(spec, devices=devices)
            assert trainer.executables is not None
            key = trainer.executable_key("train_step")
            if trainer.executables.path(key).is_file():  # checked when the group loads it
                out.update(source="stored", key=key_digest(key), reason="stored already")
            else:
                trainer.compile()
                info = trainer.compile_info
                out.update(source=info.source, key=info.key, reason=info.reason,
                           stored=info.save_s is not None)
            log.info("compile ahead for %d process(es): %s (key %s) in %.2fs", n,
                     out["source"], out["key"], time.perf_counter() - t0)
        except Exception as exc:  # an optimisation: the next group compiles as before
            out.update(source="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
            log.warning("compile ahead failed: %s", out["reason"])
        finally:  # the trainer goes with this frame: it made no arrays, its executable is stored
            out["seconds"] = round(time.perf_counter() - t0, 3)
            self.ahead_results.append(out)
