"""The host's part of the RAM tier: copy the state to the holders after each step, save a copy
durably through them, and rebuild the state from copies in RAM or on disk. Kept apart so the
actor stays a shell and the step loop sees only ``after_step``, ``can_persist`` and
``newest_durable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.shared.errors import DataError

if TYPE_CHECKING:
    from workers.ram.replicator import Replicator

log = logging.getLogger(__name__)


class RamTrainer(Protocol):
    """What the RAM tier uses of ``workers.training.trainer.Trainer``."""

    state: Any
    data_resumed: dict | None

    @property
    def step(self) -> int: ...

    def data_record(self) -> dict: ...

    @property
    def abstract_state(self) -> Any: ...

    def restore_from_copies(self, step: int, copies: list[tuple[dict, bytes]], *,
                            sources: list[int] | None = None, tier: str = "ram",
                            layouts: dict[int, dict] | None = None) -> None: ...


class RamTier:
    """The copies this host sends (a ``Replicator`` from ``attach`` until ``detach``) and the
    restores from them. ``trainer(what)`` is the trainer, or raises naming ``what`` needed it:
    asked only once a restore has its copies, as a call without a trainer always did."""

    def __init__(self, trainer: Callable[[str], RamTrainer]) -> None:
        self._trainer = trainer
        self._replicator: Replicator | None = None
        self._persist: dict | None = None
        """Where this node's holder saves copies durably (``durable_from_ram``), else None."""

    def attach(self, holders: list[tuple[str, tuple[str, int]]], *, token: str,
               incarnation: int, every: int, keep: int, max_host_bytes: int,
               checkpoint_dir: str | Path, writer: str, source: int, sources: int,
               durable_from_ram: bool = False, holder_sources: int = 2) -> None:
        """Copy this host's shards (``source`` of ``sources``, written by node ``writer``) to
        ``holders`` ((name, wire address): own node's, peer's) every ``every`` steps;
        ``durable_from_ram``: a save step's copy is saved durably by this node's holder instead
        of an Orbax save."""
        from workers.ram import copy_store
        from workers.ram.replicator import Replicator

        # where this node's holder saves them (the driver told it when it created it): read
        # here for the newest durable step
        self._persist = ({"directory": str(copy_store.copies_dir(checkpoint_dir))}
                         if durable_from_ram else None)
        self._replicator = Replicator(holders, token=token, writer=writer,
                                      incarnation=incarnation, source=source, sources=sources,
                                      every=every, keep=keep, max_host_bytes=max_host_bytes,
                                      holder_sources=holder_sources)

    def set_every(self, every: int) -> None:
        """Copy every ``every`` steps from now on (a no-op when not attached)."""
        if self._replicator is not None and every >= 1:
            self._replicator.every = int(every)

    def detach(self) -> None:
        """Stop sending (the process leaves its group); a no-op when not attached."""
        if self._replicator is not None:
            self._replicator.close()
            self._replicator, self._persist = None, None

    # ---- what the step loop asks ---------------------------------------------------------

    def after_step(self, step: int, trainer: RamTrainer, *, persist: bool = False) -> float:
        """Copy ``step`` if due (``persist``: the durable save of a save step, when
        ``can_persist``); the seconds the step was blocked, 0 when not attached."""
        r = self._replicator
        if r is None:
            return 0.0
        return r.after_step(step, trainer.state, persist=self._persist if persist else None,
                            data=trainer.data_record)

    def last_wait_s(self) -> float:
        """Of the last copy's blocking seconds, the wait for the previous one's delivery."""
        return self._replicator.last_wait_s if self._replicator is not None else 0.0

    def can_persist(self) -> bool:
        """Whether a save step is saved durably from the copies (not by Orbax) now."""
        r = self._replicator
        return (self._persist is not None and r is not None and bool(r.holders)
                and not r.stats.disabled)

    def newest_durable(self, orbax_step: int | None) -> int | None:
        """The newest durable step: Orbax's (``orbax_step``), or one saved from the copies."""
        if self._persist is None:
            return orbax_step
        from workers.ram import copy_store

        steps = copy_store.complete_steps(self._persist["directory"])
        return max([s for s in (orbax_step, steps[-1] if steps else None) if s is not None],
                   default=None)

    def stats(self) -> dict | None:
        return self._replicator.stats.as_dict() if self._replicator is not None else None

    def copy_now(self, persist: bool = False) -> dict:
        """Copy the current step to the holders and wait until they have it; ``ok`` False with
        the reason when this host cannot (see ``HostActor.copy_now``)."""
        t0 = time.perf_counter()
        tr = self._trainer("copy_now")
        r = self._replicator
        if r is None or not r.holders or r.stats.disabled:
            why = "RAM tier not attached" if r is None else (r.stats.disabled or "no holder left")
            return {"ok": False, "step": tr.step, "reason": why,
                    "seconds": time.perf_counter() - t0}
        # sent from the shards as they are (no pack): nothing steps until it is delivered
        r.after_step(tr.step, tr.state, force=True, direct=True,
                     persist=self._persist if persist and self._persist is not None else None,
                     data=tr.data_record)
        delivered = r.settle()
        if not delivered:  # its views must not be sent once the state moves on
            r.drop_direct()
        ok = delivered and bool(r.holders)
        why = ("" if ok else "the copy was not delivered in time" if not delivered
               else "every holder failed to take the copy")
        return {"ok": ok, "step": tr.step, "reason": why, "seconds": time.perf_counter() - t0}

    # ---- restores: never raise for a bad copy (the driver falls back to Orbax) -------------

    def restore_from_ram(self, step: int, incarnation: int,
                         holders: dict[int, tuple[str, tuple[str, int]]], token: str) -> dict:
        """Read ``step`` from the holders' wire (source -> (name, address)): every source's
        description (layout and data record, no bytes), then the bytes of only the sources
        holding a piece of this host's shards (``replica.needed_sources``), then
        ``restore_copies``."""
        from workers.ram import buffers, replica
        from workers.ram import wire as ram_wire

        t0 = time.perf_counter()
        socks: dict[tuple[str, int], Any] = {}
        try:
            def conn(address: tuple[str, int]) -> Any:
                address = (str(address[0]), int(address[1]))
                if address not in socks:
                    socks[address] = ram_wire.connect(address, token, writer=f"restore-{step}",
                                                      timeout_s=60.0)
                return socks[address]

            described = {}
            for src, (_name, address) in sorted(holders.items()):
                described[src], _ = ram_wire.read_copy(
                    conn(address), incarnation=incarnation, step=step, source=src, max_data=0,
                    describe=True)
            tr = self._trainer("restore_from_ram")
            need = replica.needed_pieces({s: d["layout"] for s, d in described.items()},
                                         tr.abstract_state)
            copies = {}
            t_fetch = time.perf_counter()
            for src, pieces in need.items():
                name, address = holders[src]
                every = len(pieces) == len(described[src]["layout"].get("pieces", []))
                got, data = ram_wire.read_copy(
                    conn(address), incarnation=incarnation, step=step, source=src,
                    max_data=int(described[src]["nbytes"]), into=buffers.new,
                    pieces=None if every else pieces)
                if (got.get("source"), got.get("incarnation"), got.get("pieces")) != (
                        src, incarnation, None if every else pieces):
                    raise ValueError(f"asked for source {src} of incarnation {incarnation}"
                                     f"{'' if every else f' (pieces {pieces})'}, got source "
                                     f"{got.get('source')} of {got.get('incarnation')}")
                copies[f"source {src} from {name}"] = {**got, "data": data}
        except Exception as exc:
            return _refused(step, exc, t0)
        finally:
            for sock in socks.values():
                sock.close()
        fetched = time.perf_counter()
        out = self.restore_copies(step, copies, token, started=t0,
                                  layouts={s: d["layout"] for s, d in described.items()})
        if out.get("ok"):  # where the time went: the wire, then the MAC and the placing
            out["parts_s"] = {"describe": round(t_fetch - t0, 4),
                              "fetch": round(fetched - t_fetch, 4),
                              **out.get("parts_s", {})}
        return out

    def restore_copies(self, step: int, copies: dict[str, dict], token: str, *,
                       started: float | None = None, tier: str = "ram",
                       layouts: dict[int, dict] | None = None) -> dict:
        """Rebuild ``step`` from ``copies`` (label -> ``RamHolder.get``): each is
        authenticated (``ram_auth.verify_copy``) before any of its bytes is used. ``layouts``:
        every source's layout (source -> layout) when ``copies`` are only the sources this host
        needs (the data position is every source's record)."""
        from workers.ram import auth as ram_auth
        from workers.ram import replica

        t0 = time.perf_counter() if started is None else started
        tr = self._trainer("restore_from_ram")
        try:
            key = ram_auth.Keys.from_token(token).copy
            t_verify = time.perf_counter()
            for name, got in copies.items():
                ram_auth.verify_copy(key, got, step=step, name=name)
            t_place = time.perf_counter()
            # a read of some pieces: placed by the layout of those pieces, back to back
            copies = {name: ({**got, "layout": replica.only_pieces(got["layout"], got["pieces"])}
                             if got.get("pieces") is not None else got)
                      for name, got in copies.items()}
            sources = [got["source"] for got in copies.values()]
            if len(set(sources)) != len(sources):
                raise ValueError(f"the copies repeat a source ({sorted(sources)})")
            tr.restore_from_copies(step, [(got["layout"], got["data"])
                                          for got in copies.values()],
                                   sources=sources, tier=tier, layouts=layouts)
        except DataError:
            raise  # the copies are fine, the data cannot resume from them: the run stops
        except Exception as exc:
            return _refused(step, exc, t0)
        t_end = time.perf_counter()
        return {"ok": True, "step": tr.step, "restore_s": t_end - t0,
                "nbytes": sum(len(got["data"]) for got in copies.values()),
                "data": tr.data_resumed,
                "parts_s": {"verify": round(t_place - t_verify, 4),
                            "place": round(t_end - t_place, 4)}}

    def restore_from_disk_copy(self, step: int, token: str,
                               checkpoint_dir: str | Path | None) -> dict:
        """``restore_copies`` from the copies the holders saved durably (``copy_store``) for
        the run at ``checkpoint_dir`` (None: a standby, which has no run to read)."""
        from workers.ram import copy_store

        t0 = time.perf_counter()
        try:
            if checkpoint_dir is None:
                raise ValueError("this process has no host yet (a standby): no copies to read")
            where = copy_store.copies_dir(checkpoint_dir)
            copies = {f"source {i} on disk": copy_store.read(where, step=step, source=i)
                      for i in range(copy_store.sources_of(where, step))}
        except Exception as exc:
            return _refused(step, exc, t0)
        return self.restore_copies(step, copies, token, started=t0, tier="copy")


def _refused(step: int, exc: Exception, t0: float) -> dict:
    reason = f"{type(exc).__name__}: {str(exc)[:300]}"
    log.warning("RAM restore of step %d refused: %s", step, reason)
    return {"ok": False, "reason": reason, "restore_s": time.perf_counter() - t0}
