"""The host actor's RAM-tier methods (a mixin of ``workers.host.actor.HostActor``): copy the state
to the holders after each step, save a copy durably through them, and rebuild the state from copies
in RAM or on disk. Kept apart so the actor's module stays about stepping and checkpoints.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.shared.errors import DataError

log = logging.getLogger(__name__)


class RamTierMethods:
    """Needs from the actor: ``spec``, ``host``, ``trainer``, ``_step``, ``_need_trainer``."""

    spec: Any
    host: Any
    trainer: Any
    _step: int
    _replicator: Any = None
    _persist: dict | None = None

    def _need_trainer(self, what: str) -> Any:
        raise NotImplementedError

    def attach_ram(self, holders: list[tuple[str, tuple[str, int]]], *, token: str,
                   incarnation: int, every: int, keep: int, max_host_bytes: int,
                   durable_from_ram: bool = False, ab_block_steps: int = 0) -> None:
        """Copy this host's shards to ``holders`` ((name, wire address): own node's, peer's)
        every ``every`` steps (``ab_block_steps``: only in alternate blocks, a bench aid);
        ``durable_from_ram``: a save step's copy is saved durably by this node's holder instead
        of an Orbax save from the devices here."""
        from workers.ram import copy_store
        from workers.ram.replicator import Replicator

        # where this node's holder saves them (the driver told it when it created it): read
        # here for the newest durable step
        self._persist = ({"directory": str(copy_store.copies_dir(self.spec.checkpoint_dir))}
                         if durable_from_ram else None)

        self._replicator = Replicator(holders, token=token, writer=self.host.node_id,
                                      incarnation=incarnation, source=self.host.index,
                                      sources=self.spec.plan.num_processes, every=every,
                                      keep=keep, max_host_bytes=max_host_bytes,
                                      ab_block_steps=ab_block_steps)

    def restore_from_ram(self, step: int, incarnation: int,
                         holders: dict[int, tuple[str, Any]], token: str) -> dict:
        """Rebuild the state of ``step`` from every source's RAM copy (``holders``: source ->
        (name, holder)), into this mesh; ``token``: the run's secret (the holders hand copies
        only to it, and every copy is authenticated with it before use). Never raises for a
        bad or missing copy: ``ok`` False and ``reason`` tell the driver to use the durable
        tier instead (no collective ran, so the group can still restore from Orbax in
        place)."""
        import ray

        t0 = time.perf_counter()
        try:
            refs = {src: h.get.remote(token, incarnation=incarnation, step=step, source=src)
                    for src, (_, h) in sorted(holders.items())}
            copies = {f"source {src} from {holders[src][0]}": ray.get(ref, timeout=60)
                      for src, ref in refs.items()}
            for src, got in zip(refs, copies.values(), strict=True):
                if got.get("source") != src or got.get("incarnation") != incarnation:
                    raise ValueError(f"asked for source {src} of incarnation {incarnation}, "
                                     f"got source {got.get('source')} of "
                                     f"{got.get('incarnation')}")
        except Exception as exc:
            return self._ram_refused(step, exc, t0)
        return self.restore_copies(step, copies, token, started=t0)

    def restore_copies(self, step: int, copies: dict[str, dict], token: str, *,
                       started: float | None = None, tier: str = "ram") -> dict:
        """``restore_from_ram`` once the copies are here (label -> ``RamHolder.get``): each is
        authenticated (``ram_auth.verify_copy``) before any of its bytes is used."""
        from workers.ram import auth as ram_auth

        t0 = time.perf_counter() if started is None else started
        tr = self._need_trainer("restore_from_ram")
        try:
            key = ram_auth.Keys.from_token(token).copy
            for name, got in copies.items():
                ram_auth.verify_copy(key, got, step=step, name=name)
            sources = [got["source"] for got in copies.values()]
            if len(set(sources)) != len(sources):
                raise ValueError(f"the copies repeat a source ({sorted(sources)})")
            tr.restore_from_copies(step, [(got["layout"], got["data"])
                                          for got in copies.values()],
                                   sources=sources, tier=tier)
        except DataError:
            raise  # the copies are fine, the data cannot resume from them: the run stops
        except Exception as exc:
            return self._ram_refused(step, exc, t0)
        self._step = tr.step
        return {"ok": True, "step": tr.step, "restore_s": time.perf_counter() - t0,
                "nbytes": sum(len(got["data"]) for got in copies.values()),
                "data": tr.data_resumed}

    def restore_from_disk_copy(self, step: int, token: str) -> dict:
        """``restore_from_ram`` from the copies the holders saved durably (copy_store)."""
        from workers.ram import copy_store

        t0 = time.perf_counter()
        try:
            where = copy_store.copies_dir(self.spec.checkpoint_dir)
            copies = {f"source {i} on disk": copy_store.read(where, step=step, source=i)
                      for i in range(copy_store.sources_of(where, step))}
        except Exception as exc:
            return self._ram_refused(step, exc, t0)
        return self.restore_copies(step, copies, token, started=t0, tier="copy")

    def _ram_refused(self, step: int, exc: Exception, t0: float) -> dict:
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        log.warning("RAM restore of step %d refused: %s", step, reason)
        return {"ok": False, "reason": reason, "restore_s": time.perf_counter() - t0}

    def ram_stats(self) -> dict | None:
        return self._replicator.stats.as_dict() if self._replicator is not None else None

    def copy_now(self, persist: bool = False) -> dict:
        """Copy the current step to the holders and wait until they have it (a notice too
        short for a durable save); ``ok`` False with the reason when this host cannot.
        ``persist`` (with ``durable_from_ram``): this node's holder also saves it durably, after
        this returns."""
        t0 = time.perf_counter()
        tr = self._need_trainer("copy_now")
        r = self._replicator
        if r is None or not r.holders or r.stats.disabled:
            why = "RAM tier not attached" if r is None else (r.stats.disabled or "no holder left")
            return {"ok": False, "step": tr.step, "reason": why,
                    "seconds": time.perf_counter() - t0}
        r.after_step(tr.step, tr.state, force=True,
                     persist=self._persist if persist and self._persist is not None else None,
                     data=tr.data_record)
        delivered = r.settle()
        ok = delivered and bool(r.holders)
        why = ("" if ok else "the copy was not delivered in time" if not delivered
               else "every holder failed to take the copy")
        return {"ok": ok, "step": tr.step, "reason": why, "seconds": time.perf_counter() - t0}

    def _can_persist(self) -> bool:
        r = self._replicator
        return (self._persist is not None and r is not None and bool(r.holders)
                and not r.stats.disabled)

    def _committed(self) -> int | None:
        """The newest durable step: Orbax's, or one saved from the RAM copies."""
        orbax = self.trainer.ckpt.committed_step()
        if self._persist is None:
            return orbax
        from workers.ram import copy_store

        steps = copy_store.complete_steps(self._persist["directory"])
        return max([s for s in (orbax, steps[-1] if steps else None) if s is not None],
                   default=None)

