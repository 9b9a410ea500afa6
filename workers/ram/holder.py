"""A node's holder of host-RAM checkpoint copies: its own host's and one peer's.

Runs as a detached, named Ray actor per node (``orchestrator.raygroup.ram_holders``), so a copy
outlives both the host actor that sent it (kill -9, a new incarnation) and the driver (autoresume).
Copies arrive over a TCP connection per sending host (``workers.ram.server``, authenticated by
the run's secret) into buffers this process owns: nothing here points into an object-store
buffer whose owner may die. Every Ray call needs the run's token (Ray can call any method of
an actor class, so the class has no other) but ``prove``, with which a holder shows the driver
that it has the token before the driver hands it over. Where durable copies go and
how many steps stay there is the driver's choice, made when it creates the holder; a copy only
asks to be saved. The durable writer imports Orbax (and so JAX, pinned to CPU); nothing else
here does.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.shared.worker_log import install as mark_log_records
from workers.host.niceness import LOWEST, idle_this_thread, lower_this_thread
from workers.ram import auth as ram_auth
from workers.ram import budget
from workers.ram.server import CopyServer, Limits

log = logging.getLogger(__name__)

PERSIST_NICE = LOWEST
"""The durable writer's priority where Linux's idle scheduling class is unavailable."""
MAX_COPY_BYTES = 512 * 1024**2
"""A copy's size bound when the driver names none (its own: max_host_bytes / (2 x keep))."""


@dataclass
class _Copy:
    incarnation: int
    step: int
    source: int
    sources: int
    layout: dict
    data: bytes | bytearray
    mac: str
    lent: bool = False
    """Handed out by ``get`` (Ray may still be serializing it): never recycled."""
    saving: bool = False
    """Queued for (or in) a durable save: never recycled."""

    def as_dict(self) -> dict:
        return {"incarnation": self.incarnation, "step": self.step, "source": self.source,
                "sources": self.sources, "layout": self.layout, "data": self.data,
                "mac": self.mac}


def _node_ip() -> str:
    """This node's address as Ray knows it (what other nodes reach it at)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests): loopback
        return "127.0.0.1"


def _identity() -> str:
    """This actor's name as Ray knows it ("" outside an actor): what ``prove`` binds its
    answer to, so an actor under another name cannot pass a holder's answer on. (A worker's
    namespace is its job's, not the one its name lives in: the name alone.)"""
    try:
        import ray

        if not ray.is_initialized():
            return ""
        return ray.get_runtime_context().get_actor_name() or ""
    except Exception:  # no identity: the driver finds the answer wrong and skips this holder
        return ""


def _whole(header: dict, name: str, low: int = 0) -> int:
    value = header[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise TypeError(f"{name} is {value!r}, not a whole number >= {low}")
    return value


def parse_copy(header: dict, data: bytes | bytearray, *, max_copy_bytes: int) -> _Copy:
    """A copy as a frame or a ``put`` describes it; ``KeyError``/``TypeError``/``ValueError``
    for one that is malformed or larger than this holder takes."""
    if len(data) > max_copy_bytes:
        raise ValueError(f"the copy is {len(data)} bytes, this holder takes {max_copy_bytes}")
    sources = _whole(header, "sources", 1)
    source = _whole(header, "source")
    if source >= sources:
        raise ValueError(f"source {source} of {sources}")
    layout, mac = header["layout"], header["mac"]
    if not isinstance(layout, dict):
        raise TypeError(f"layout is {type(layout).__name__}, not an object")
    if not ram_auth.valid_mac_text(mac):
        raise TypeError("mac is not a copy MAC (workers.ram.auth.copy_mac)")
    return _Copy(incarnation=_whole(header, "incarnation"), step=_whole(header, "step"),
                 source=source, sources=sources, layout=layout, data=data, mac=mac)


class _Durable:
    """Saves copies with Orbax (``workers.ram.copy_store``) in one background thread, in the idle
    scheduling class; a copy is saved only if it is authentic."""

    def __init__(self, directory: str, keep_steps: int) -> None:
        self.directory, self.keep_steps = directory, keep_steps
        self.queue: queue.Queue[tuple[_Copy, bytes]] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.saved: list[dict] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="ram-persist",
                                               daemon=True)
                self.thread.start()

    def enqueue(self, copy: _Copy, copy_key: bytes) -> None:
        """The queued save holds its own reference: eviction cannot lose it (nor recycle its
        buffer: ``saving``)."""
        copy.saving = True
        self.start()
        self.queue.put((copy, copy_key))

    def status(self) -> dict:
        with self.lock:
            return {"pending": self.queue.qsize(), "saved": list(self.saved[-20:]),
                    "errors": list(self.errors[-20:])}

    def _loop(self) -> None:
        os.environ["JAX_PLATFORMS"] = "cpu"  # Orbax imports JAX: never let it take a TPU
        # Linux: per thread, and inherited by the threads Orbax starts from here. The idle class,
        # not nice 19: at nice 19 the save still slowed the step after each save step
        # (bench/RESULTS.md, section 6); where the class is unavailable, nice 19.
        if not idle_this_thread(what="the durable writer"):
            lower_this_thread(PERSIST_NICE, what="the durable writer")
        import workers.training.orbax_import  # noqa: F401  (Orbax, before the first save)
        from workers.ram import copy_store
        while True:
            copy, key = self.queue.get()
            t0 = time.perf_counter()
            try:
                if not ram_auth.copy_intact(key, copy.as_dict()):
                    raise ram_auth.CopyRejected("the copy fails its authentication; not saved")
                completed = copy_store.write(
                    self.directory, step=copy.step, source=copy.source, sources=copy.sources,
                    incarnation=copy.incarnation, layout=copy.layout, data=copy.data,
                    mac=copy.mac)
                if completed:
                    copy_store.prune(self.directory, self.keep_steps)
                with self.lock:
                    self.saved.append({"step": copy.step, "source": copy.source,
                                       "seconds": round(time.perf_counter() - t0, 4),
                                       "nbytes": len(copy.data), "completed": completed})
            except Exception as exc:  # a full disk must not kill the RAM copies with it
                log.error("durable save of step %d source %d failed: %s", copy.step,
                          copy.source, exc)
                with self.lock:
                    self.errors.append(f"step {copy.step} source {copy.source}: "
                                       f"{type(exc).__name__}: {str(exc)[:300]}")
            finally:
                copy.saving = False  # written (or failed): its buffer may be recycled now
                self.queue.task_done()


class _Store:
    """The copies, newest ``keep`` per writer; what the server and ``put`` hand in."""

    def __init__(self, *, keep: int, max_copy_bytes: int, durable: _Durable | None,
                 copy_key: bytes) -> None:
        self.keep, self.max_copy_bytes, self.durable = keep, max_copy_bytes, durable
        self.copy_key = copy_key
        self.lock = threading.Lock()
        self.copies: dict[str, list[_Copy]] = {}
        self.spare: dict[str, bytearray] = {}
        """Per writer, the buffer of its last evicted copy: its next copy is received into it
        (pages already touched: a fresh buffer's first touch costs several times the copy)."""
        self.persist_refused = 0

    def buffer(self, writer: str, nbytes: int) -> bytearray:
        """A buffer of ``nbytes`` for ``writer``'s next copy: its spare when the size fits."""
        with self.lock:
            spare = self.spare.get(writer)
            if spare is not None and len(spare) == nbytes:
                del self.spare[writer]
                return spare
        return bytearray(nbytes)

    def receive(self, writer: str, header: dict, data: bytearray) -> None:
        persist = header.get("persist", False)
        if not isinstance(persist, bool):
            raise TypeError("persist is not true or false (the driver chose where durable "
                            "copies go when it created this holder)")
        self.add(writer, parse_copy(header, data, max_copy_bytes=self.max_copy_bytes), persist)

    def add(self, writer: str, copy: _Copy, persist: bool) -> int:
        """Store (replacing the writer's copy of the same step); the bytes kept in all."""
        if persist:
            if self.durable is None:
                self.persist_refused += 1
                log.error("a copy of step %d asks to be saved durably; this holder was "
                          "created without a durable directory: kept in RAM only", copy.step)
            else:
                self.durable.enqueue(copy, self.copy_key)
        with self.lock:
            mine = [c for c in self.copies.get(writer, [])
                    if (c.incarnation, c.step) != (copy.incarnation, copy.step)]
            mine.append(copy)
            mine.sort(key=lambda c: (c.step, c.incarnation))
            self.copies[writer] = mine[-self.keep:]
            for old in mine[:-self.keep]:
                if (isinstance(old.data, bytearray) and not old.lent and not old.saving
                        and old is not copy):
                    self.spare[writer] = old.data
            return self.nbytes()

    def read(self, request: dict) -> tuple[dict, bytes | bytearray]:
        """A copy for the wire's ``READ`` (``server.Read``): its description, MAC and bytes (no
        bytes for ``describe``); the copy is lent (never recycled: the send may outlast its
        eviction). ``KeyError`` when there is none."""
        want = tuple(_whole(request["read"], k) for k in ("incarnation", "step", "source"))
        with self.lock:
            found = [c for mine in self.copies.values() for c in mine
                     if (c.incarnation, c.step, c.source) == want]
            if not found:
                raise KeyError(f"no copy of source {want[2]} at step {want[1]} "
                               f"(incarnation {want[0]})")
            c = found[-1]
            if not request.get("describe"):
                c.lent = True
        description = {k: v for k, v in c.as_dict().items() if k != "data"}
        description["nbytes"] = len(c.data)
        if request.get("describe"):
            return description, b""
        if request.get("pieces") is None:
            return description, c.data
        return self._pieces(c, description, request["pieces"])

    def _pieces(self, c: _Copy, description: dict, wanted: Any) -> tuple[dict, list]:
        """Some pieces of copy ``c`` (indices into its layout's, ascending), vouched for by
        ``pieces_mac`` once the whole copy's own MAC is checked here: a restore reads the
        pieces its shards need, not every byte of every source."""
        pieces = c.layout.get("pieces") if isinstance(c.layout, dict) else None
        if (not isinstance(wanted, list) or not wanted or not isinstance(pieces, list)
                or any(type(i) is not int for i in wanted)
                or wanted != sorted(set(wanted)) or not 0 <= wanted[0] <= wanted[-1] < len(pieces)):
            raise ValueError("the read's pieces are not ascending indices of the copy's pieces")
        fields = c.as_dict()
        if not ram_auth.copy_intact(self.copy_key, fields):
            raise ValueError("the copy fails its authentication: no pieces of it are sent")
        view = memoryview(c.data)
        parts = [view[int(pieces[i][4]):int(pieces[i][4]) + int(pieces[i][5])] for i in wanted]
        description.update(pieces=wanted, nbytes=sum(p.nbytes for p in parts),
                           mac=ram_auth.pieces_mac(self.copy_key, fields, wanted, parts))
        return description, parts

    def drop_older(self, incarnation: int) -> int:
        """``RamHolder.drop_older``: copies of older incarnations out (a queued durable save
        keeps its own), and the spare buffers of writers left with none."""
        freed = 0
        with self.lock:
            for writer, mine in list(self.copies.items()):
                keep = [c for c in mine if c.incarnation >= incarnation]
                freed += sum(len(c.data) for c in mine if c.incarnation < incarnation)
                if keep:
                    self.copies[writer] = keep
                else:
                    del self.copies[writer]
                    spare = self.spare.pop(writer, None)
                    freed += len(spare) if spare is not None else 0
        return freed

    def all(self) -> list[_Copy]:
        with self.lock:
            return [c for mine in self.copies.values() for c in mine]

    def nbytes(self) -> int:
        return sum(len(c.data) for mine in self.copies.values() for c in mine)


class RamHolder:
    """The Ray actor. ``token``: the run's secret; ``max_copy_bytes``: the largest copy a host
    sends (the driver's ``max_host_bytes / (2 x keep)``); ``persist_dir``/``persist_keep``: where
    copies asked to be saved durably go and how many complete steps stay (None: nowhere).
    ``max_connections``, ``hello_timeout_s``, ``idle_timeout_s``: the wire's limits."""

    def __init__(self, *, token: str, keep: int = 2, max_copy_bytes: int | None = MAX_COPY_BYTES,
                 persist_dir: str | None = None, persist_keep: int = 3,
                 max_connections: int = 32, hello_timeout_s: float = 5.0,
                 idle_timeout_s: float = 300.0) -> None:
        mark_log_records()  # its warnings (refused copies, failed saves) reach the driver
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if max_copy_bytes is None:  # max_host_bytes: auto, undecided on the driver
            max_copy_bytes = max(1, budget.cap_bytes(None) // (2 * keep))
        if persist_dir is not None and persist_keep < 1:
            raise ValueError("persist_keep must be >= 1")
        self._lock = threading.Lock()
        self._token = token
        self._keys = ram_auth.Keys.from_token(token)
        self._limits = Limits(max_copy_bytes=max_copy_bytes, max_connections=max_connections,
                              hello_timeout_s=hello_timeout_s, idle_timeout_s=idle_timeout_s)
        durable = _Durable(str(persist_dir), persist_keep) if persist_dir is not None else None
        self._store = _Store(keep=keep, max_copy_bytes=max_copy_bytes, durable=durable,
                             copy_key=self._keys.copy)
        self._server: CopyServer | None = None

    def _check(self, token: str) -> None:
        if not isinstance(token, str) or not ram_auth.same_token(token, self._token):
            raise PermissionError("not this run's RAM-tier token: a holder answers only the "
                                  "driver (and hosts) of the run that created it")

    def prove(self, nonce: str) -> str:
        """Answer the driver's challenge before it hands this holder the run's token
        (``workers.ram.auth.holder_proof``); the one call without the token: it reveals none."""
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 128:
            raise ValueError("the driver's challenge is 16 to 128 characters")
        return ram_auth.holder_proof(self._token, nonce, _identity())

    def serve(self, token: str, host: str = "", *, durable: bool = False,
              replaces: str | None = None) -> tuple[str, int]:
        """Accept copies over the wire from hosts that prove they hold ``token``; returns the
        (address, port) to connect to. ``token`` must be the holder's, or ``replaces`` must be
        (a new secret: the port stays, connections made with the old one end). ``durable``:
        copies will be saved durably, so the writer imports Orbax now, in the idle class,
        rather than with the first save (seconds of CPU holding this process's GIL, while
        copies arrive: a drain's copy waited for it)."""
        with self._lock:
            if replaces is not None and not ram_auth.same_token(token, self._token):
                self._check(replaces)
                self._token, self._keys = token, ram_auth.Keys.from_token(token)
                self._store.copy_key = self._keys.copy
                if self._server is not None:
                    self._server.rekey(self._keys.hello)
            self._check(token)
            if self._server is None:
                self._server = CopyServer(self._store.receive, hello_key=self._keys.hello,
                                          limits=self._limits, host=host or _node_ip(),
                                          buffers=self._store.buffer,
                                          read=self._store.read)
            address = self._server.address
        if durable and self._store.durable is not None:
            self._store.durable.start()
        elif durable:
            log.warning("serve(durable=True) on a holder created without a durable directory")
        return address

    def put(self, token: str, *, writer: str, incarnation: int, step: int, source: int,
            sources: int, layout: dict, data: bytes | bytearray, mac: str,
            persist: bool = False) -> int:
        """Store one copy as the wire would (tests, tools); returns the bytes kept in all."""
        self._check(token)
        header = {"incarnation": incarnation, "step": step, "source": source,
                  "sources": sources, "layout": layout, "mac": mac}
        copy = parse_copy(header, data, max_copy_bytes=self._store.max_copy_bytes)
        return self._store.add(writer, copy, bool(persist))

    def get(self, token: str, *, incarnation: int, step: int, source: int) -> dict:
        """One copy with its description and MAC (the reader checks it before using it)."""
        self._check(token)
        for c in self._store.all():
            if (c.incarnation, c.step, c.source) == (incarnation, step, source):
                c.lent = True
                return c.as_dict()
        raise KeyError(f"no copy of source {source} at step {step} (incarnation {incarnation})")

    def inventory(self, token: str) -> list[dict]:
        """Every copy held, authenticated now (memory can rot; a copy may be bad)."""
        self._check(token)
        key = self._store.copy_key
        return [{"incarnation": c.incarnation, "step": c.step, "source": c.source,
                 "sources": c.sources, "nbytes": len(c.data),
                 "intact": ram_auth.copy_intact(key, c.as_dict())} for c in self._store.all()]

    def drop_older(self, token: str, incarnation: int) -> int:
        """Forget the copies of incarnations before ``incarnation`` (the driver asks once the
        new group's copies are complete everywhere: nothing restores the older ones any more,
        and at a GiB per host they are what runs a node out of memory); the bytes freed."""
        self._check(token)
        return self._store.drop_older(_whole({"incarnation": incarnation}, "incarnation"))

    def persist_status(self, token: str) -> dict:
        """What the background writer did (seconds per save, errors) and has still to do."""
        self._check(token)
        durable = self._store.durable
        if durable is None:
            return {"pending": 0, "saved": [], "errors": []}
        return durable.status()

    def flush(self, token: str, timeout_s: float = 60.0) -> bool:
        """Wait (bounded) until every queued durable save is done; False on timeout."""
        self._check(token)
        durable = self._store.durable
        deadline = time.monotonic() + timeout_s
        while durable is not None and durable.queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stats(self, token: str) -> dict:
        self._check(token)
        server, durable = self._server, self._store.durable
        with self._store.lock:
            copies = sum(len(m) for m in self._store.copies.values())
            nbytes = self._store.nbytes()
        saved, errors = [], 0
        if durable is not None:
            with durable.lock:
                saved, errors = [p["seconds"] for p in durable.saved], len(durable.errors)
        return {"copies": copies, "nbytes": nbytes, "persisted": len(saved),
                "persist_s_max": max(saved, default=0.0),
                "persist_errors": errors + self._store.persist_refused,
                "refused": dict(server.refused) if server is not None else {}}
