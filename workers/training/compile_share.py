"""How one process gets a function's executable: load it from the store, or compile it — and,
where every process of a group shares one machine's cores, let one process compile for all.

Every process of a group compiles the same SPMD program. On the CPU emulation all of them run
on one machine, so two processes compiling at once take twice the CPU of one, and a fresh start
of 2 processes compiled the init and the step markedly slower than one process alone. An
executable one process serialised loads in another process of the same runtime and mesh (checked
here: bit-identical losses, ``tests/workers/test_executables.py``), so there the group's lowest
process (the *owner*) compiles and stores, tells the others through the JAX runtime's key-value
store, and they load its file. A process that hears nothing within the bound, or whose load
fails, compiles itself: sharing is an optimisation, never a reason to fail a group.

Not on a TPU: each host compiles on its own cores at the same time (nothing to gain), and whether
an executable moves between TPU hosts is not checked here, so keys stay per process there.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers.training.executables import ExecutableStore, key_digest

log = logging.getLogger(__name__)

STORED = "stored"
"""The owner's word when its file is in the store (loaded or compiled and written)."""
WORD_PREFIX = "tpu_orch/executable/"


@dataclass(frozen=True)
class CompileInfo:
    """How one function's executable was obtained: loaded from the run directory's store, or
    compiled (``reason`` says why it was not loaded)."""

    function: str
    source: str
    """"loaded" or "compiled"."""
    key: str | None
    """Short digest of the executable's key; None when the store is off."""
    seconds: float
    reason: str = ""
    flops: float | None = None
    save_s: float | None = None
    """Seconds spent storing a compiled executable (None: not stored)."""
    waited_s: float = 0.0
    """Seconds spent waiting for the owner's word (0 for the owner and without sharing)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class OwnerWord(Protocol):
    """The seam between the owner and the others: the JAX runtime's key-value store here, a
    dict in tests."""

    def say(self, digest: str, word: str) -> None: ...

    def hear(self, digest: str, timeout_s: float) -> str | None:
        """The owner's word for ``digest``, or None when none came within ``timeout_s``."""


class RuntimeWord:
    """The distributed runtime's key-value store (the one ``jax.distributed.initialize``
    started; Orbax uses it the same way). It lives as long as the runtime, so a word never
    outlives the group that said it."""

    def __init__(self, client: Any = None) -> None:
        if client is None:
            from workers.training.jax_private import distributed_client

            client = distributed_client()
        if client is None:
            raise RuntimeError("no JAX distributed runtime: nothing to share executables over")
        self.client = client

    def say(self, digest: str, word: str) -> None:
        self.client.key_value_set(WORD_PREFIX + digest, word, allow_overwrite=True)

    def hear(self, digest: str, timeout_s: float) -> str | None:
        try:
            return str(self.client.blocking_key_value_get(WORD_PREFIX + digest,
                                                          max(1, int(timeout_s * 1000))))
        except Exception as exc:  # deadline passed, or the runtime is going away
            log.info("no word for executable %s: %s", digest, str(exc)[:200])
            return None


@dataclass(frozen=True)
class Share:
    """This process's part in a shared compile: ``owner`` compiles, every other process waits
    for its word up to ``wait_s`` (the group's compile bound), then loads."""

    owner: int
    me: int
    wait_s: float
    word: OwnerWord

    @property
    def owns(self) -> bool:
        return self.me == self.owner


def owner_of(devices: Sequence[Any]) -> int:
    """The lowest process index among a mesh's devices: the one that compiles for all."""
    return min(int(d.process_index) for d in devices)


def shares(*, platform: str, enabled: bool, processes: int, store: bool) -> bool:
    """Whether a group compiles once for all its processes (see the module docstring)."""
    return enabled and store and platform == "cpu" and processes > 1


def share_for(devices: Sequence[Any], *, platform: str, enabled: bool, store: bool,
              wait_s: float) -> Share | None:
    """This process's part in its group's shared compile, or None: sharing off, not the CPU
    emulation, one process, or no runtime to share over (then every process compiles)."""
    import jax

    processes = len({int(d.process_index) for d in devices})
    if not shares(platform=platform, enabled=enabled, processes=processes, store=store):
        return None
    try:
        word = RuntimeWord()
    except Exception as exc:  # a private JAX API moved, or no runtime: compile as before
        log.warning("executables not shared (%s: %s); every process compiles its own",
                    type(exc).__name__, exc)
        return None
    return Share(owner=owner_of(devices), me=jax.process_index(), wait_s=wait_s, word=word)


def obtain(function: str, jitted: Any, args: tuple, *, store: ExecutableStore | None,
           key: dict | None, devices: Any, cost: bool = False, share: Share | None = None,
           no_key_reason: str = "executable store off (compile.cache=off)"
           ) -> tuple[Any, CompileInfo]:
    """``function``'s executable for ``args``: loaded when the store has ``key``; else, for a
    process that does not own a shared compile, loaded once the owner said it stored it; else
    lowered, compiled and stored. The owner always says what it did, even when it fails."""
    t0 = time.perf_counter()
    if store is None or key is None:
        compiled, flops = _compile(jitted, args, cost)
        return compiled, CompileInfo(function=function, source="compiled", key=None,
                                     seconds=time.perf_counter() - t0, reason=no_key_reason,
                                     flops=flops)
    digest = key_digest(key)
    word = "its compile failed"  # what the owner says unless it got as far as below
    try:
        found = store.load(key, args=args, devices=devices)
        waited = 0.0
        if found.compiled is None and share is not None and not share.owns:
            t_wait = time.perf_counter()
            heard = share.word.hear(digest, share.wait_s)
            waited = time.perf_counter() - t_wait
            if heard == STORED:
                found = store.load(key, args=args, devices=devices)
                if found.compiled is None:
                    found.reason = f"process {share.owner}'s executable: {found.reason}"
            else:
                found.reason = (f"process {share.owner} did not store it ({heard})" if heard
                                else f"no word from process {share.owner} in {share.wait_s:g}s")
        if found.compiled is not None:
            word = STORED
            info = CompileInfo(function=function, source="loaded", key=digest,
                               seconds=time.perf_counter() - t0, flops=found.meta.get("flops"),
                               waited_s=waited)
            log.info("%s loaded from %s in %.3fs", function, store.path(key), info.seconds)
            return found.compiled, info
        level = logging.WARNING if found.damaged else logging.INFO
        log.log(level, "compiling %s: %s", function, found.reason)
        compiled, flops = _compile(jitted, args, cost)
        save_s = store.save(key, compiled, meta={"flops": flops})
        word = STORED if save_s is not None else "it could not be written"
        return compiled, CompileInfo(function=function, source="compiled", key=digest,
                                     seconds=time.perf_counter() - t0, reason=found.reason,
                                     flops=flops, save_s=save_s, waited_s=waited)
    finally:
        if share is not None and share.owns:  # always, even failing: the others must not wait
            _say(share, digest, word)


def _say(share: Share, digest: str, word: str) -> None:
    """Tell the others; a failure to tell costs them their wait, never this process its step."""
    try:
        share.word.say(digest, word)
    except Exception as exc:
        log.warning("could not tell the group about executable %s: %s", digest, exc)


def _compile(jitted: Any, args: tuple, cost: bool) -> tuple[Any, float | None]:
    lowered = jitted.lower(*args)
    return lowered.compile(), (_flops(lowered) if cost else None)


def _flops(lowered: Any) -> float | None:
    """XLA's global FLOP count of a lowered computation (None when it does not say)."""
    cost = lowered.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX returned one dict per computation
        cost = cost[0] if cost else {}
    return float(cost.get("flops", 0.0)) or None
