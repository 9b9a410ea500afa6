"""Compile ahead: while this group trains, compile and store the step of the mesh the run may
move to next, so that group loads it inside its downtime instead of compiling it there
(the announced shrink in bench/RESULTS.md).

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
from collections.abc import Callable
from typing import Any

from orchestrator.shared.hostspec import HostSpec
from workers.host.niceness import LOWEST, lower_this_thread
from workers.training.executables import key_digest

log = logging.getLogger(__name__)

AHEAD_JOIN_S = 120.0
"""How long leaving the group waits for a compile ahead still running (it is the executable the
next group needs); past it the process is not reused (the driver starts a fresh one)."""


def compile_step(spec: HostSpec) -> dict:
    """Compile and store ``spec``'s step over the devices of the first
    ``spec.plan.num_processes`` processes: ``source`` ("compiled", or "stored" already),
    ``key`` (its digest), ``reason``; raises when it cannot. The trainer goes with this frame:
    it made no arrays, and its executable is stored."""
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
        return {"source": "stored", "key": key_digest(key), "reason": "stored already"}
    trainer.compile()
    info = trainer.compile_info
    return {"source": info.source, "key": info.key, "reason": info.reason,
            "stored": info.save_s is not None}


class CompileAhead:
    """At most one compile ahead at a time, in a thread at the lowest CPU priority (the step it
    shares the cores with goes first), and never once this process is leaving its runtime
    (``leave`` until ``rejoin``): ``release`` would clear the backend under it. ``compile``
    does the work (``compile_step``; tests stand a slow one in)."""

    def __init__(self, compile: Callable[[HostSpec], dict] | None = None) -> None:
        self._compile = compile or compile_step
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._leaving = False
        self.results: list[dict] = []
        """What every compile ahead of this process did (``HostActor.wait_ahead``)."""

    def start(self, spec: HostSpec, *, beside_trainer: bool) -> bool:
        """Start compiling ``spec``'s step; False when one runs already, ``spec`` has no store
        (``compile.cache=off``), there is no trainer beside (``beside_trainer``: no group
        formed here) or this process is leaving."""
        if not isinstance(spec, HostSpec):
            raise TypeError(f"compile_ahead needs a HostSpec, got {type(spec).__name__}")
        if spec.executables_dir is None:
            return False  # nowhere to keep it (compile.cache=off)
        with self._lock:  # never after leave began: release would clear a busy backend
            if self._leaving or not beside_trainer or self.running():
                return False
            self._thread = threading.Thread(target=self._run, args=(spec,),
                                            name="compile-ahead", daemon=True)
            self._thread.start()
        return True

    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait(self, timeout_s: float = AHEAD_JOIN_S) -> list[dict]:
        """Wait for a compile ahead in flight; ``results``. Raises if it is still running after
        ``timeout_s``."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(f"a compile ahead is still running after {timeout_s:g}s")
        return list(self.results)

    def leave(self, wait_s: float) -> None:
        """No compile ahead starts from now on; one in flight is waited for up to ``wait_s``
        (past that it is logged: this process will not be reused)."""
        with self._lock:
            self._leaving = True
        try:
            self.wait(wait_s)
        except RuntimeError as exc:
            log.warning("%s: this process will not be reused", exc)

    def rejoin(self) -> None:
        """This process has a group again: compiles ahead may start."""
        self._leaving = False

    def _run(self, spec: HostSpec) -> None:
        lower_this_thread(LOWEST, what="the compile ahead")
        t0 = time.perf_counter()
        out: dict[str, Any] = {"processes": spec.plan.num_processes,
                               "slices": spec.plan.num_slices}
        try:
            out.update(self._compile(spec))
            log.info("compile ahead for %d process(es): %s (key %s) in %.2fs",
                     spec.plan.num_processes, out["source"], out["key"],
                     time.perf_counter() - t0)
        except Exception as exc:  # an optimisation: the next group compiles as before
            out.update(source="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
            log.warning("compile ahead failed: %s", out["reason"])
        finally:
            out["seconds"] = round(time.perf_counter() - t0, 3)
            self.results.append(out)
