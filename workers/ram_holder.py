"""A node's holder of host-RAM checkpoint copies: its own host's and one peer's.

Runs as a detached, named Ray actor per node (``orchestrator.ram_tier``), so a copy outlives
both the host actor that sent it (kill -9, a new incarnation) and the driver (autoresume).
Copies arrive over a TCP connection per sending host (``workers.ram_wire``, authenticated by the
run's token) into buffers this process owns: nothing here points into an object-store buffer
whose owner may die. Ray calls find the holder, list what it has and fetch copies for a restore.
The durable writer imports Orbax (and so JAX, pinned to CPU); nothing else here does.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import zlib
from dataclasses import dataclass

from workers.niceness import LOWEST, idle_this_thread, lower_this_thread

log = logging.getLogger(__name__)

PERSIST_NICE = LOWEST
"""The durable writer's priority where Linux's idle scheduling class is unavailable."""


@dataclass
class _Copy:
    incarnation: int
    step: int
    source: int
    sources: int
    layout: list
    data: bytes | bytearray
    crc32: int


def _node_ip() -> str:
    """This node's address as Ray knows it (what other nodes reach it at)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests): loopback
        return "127.0.0.1"


def checksum(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


class RamHolder:
    """Keeps the newest ``keep`` copies per writer (the node that sent them)."""

    def __init__(self, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.keep = keep
        self._lock = threading.Lock()
        self._copies: dict[str, list[_Copy]] = {}
        self._persist: queue.Queue[tuple[_Copy, str, int]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.persisted: list[dict] = []
        self.persist_errors: list[str] = []
        self._token = ""
        self._listener: socket.socket | None = None

    def put(self, writer: str, *, incarnation: int, step: int, source: int, sources: int,
            layout: list, data: bytes | bytearray, crc32: int,
            persist: dict | None = None) -> int:
        """Store one copy (replacing the same writer's copy of the same step); returns the
        bytes this holder keeps in all. ``persist`` (``{"directory", "keep_steps"}``): also
        save it durably (``workers.copy_store``), in the background in the idle scheduling
        class (it runs when the step leaves a core idle); the queued save holds its own
        reference, so eviction cannot lose it."""
        copy = _Copy(incarnation=incarnation, step=step, source=source, sources=sources,
                     layout=layout, data=data, crc32=crc32)
        if persist is not None:
            self._enqueue(copy, str(persist["directory"]), int(persist["keep_steps"]))
        with self._lock:
            mine = [c for c in self._copies.get(writer, [])
                    if (c.incarnation, c.step) != (incarnation, step)]
            mine.append(copy)
            mine.sort(key=lambda c: (c.step, c.incarnation))
            self._copies[writer] = mine[-self.keep:]
            return self._nbytes()

    def serve(self, token: str, host: str = "", *, durable: bool = False) -> tuple[str, int]:
        """Accept copies over the wire (``workers.ram_wire``) from hosts that present
        ``token``; returns the (address, port) to connect to. A later call (a new driver)
        replaces the token and keeps the port. ``durable``: copies will be saved durably, so
        the writer imports Orbax now, in the idle class, rather than with the first save
        (~2 s of CPU holding this process's GIL, while copies arrive: a drain's copy waited
        for it)."""
        if durable:
            self._start_writer()
        with self._lock:
            self._token = token
            if self._listener is None:
                bind = host or _node_ip()
                srv = socket.create_server((bind, 0))
                srv.listen(64)
                self._listener = srv
                threading.Thread(target=self._accept_loop, name="ram-accept",
                                 daemon=True).start()
            return self._listener.getsockname()[:2]

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            conn, _ = self._listener.accept()
            threading.Thread(target=self._serve_conn, args=(conn,), name="ram-conn",
                             daemon=True).start()

    def _serve_conn(self, conn: socket.socket) -> None:
        from workers import ram_wire

        with conn:
            try:
                hello, _ = ram_wire.recv_frame(conn)
                if not self._token or hello.get("token") != self._token:
                    log.warning("RAM-tier connection without the run's token refused")
                    return
                while True:
                    h, data = ram_wire.recv_frame(conn)
                    try:
                        self.put(h["writer"], incarnation=int(h["incarnation"]),
                                 step=int(h["step"]), source=int(h["source"]),
                                 sources=int(h["sources"]), layout=h["layout"], data=data,
                                 crc32=int(h["crc32"]), persist=h.get("persist"))
                        conn.sendall(b"\x01")
                    except (KeyError, TypeError, ValueError) as exc:
                        log.warning("malformed RAM copy refused: %s", exc)
                        conn.sendall(b"\x00")
            except (OSError, ValueError) as exc:  # the host went away (or spoke nonsense)
                log.debug("RAM-tier connection closed: %s", exc)

    def persist_status(self) -> dict:
        """What the background writer did (seconds per save, errors) and has still to do."""
        with self._lock:
            return {"pending": self._persist.qsize(), "saved": list(self.persisted[-20:]),
                    "errors": list(self.persist_errors[-20:])}

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait (bounded) until every queued durable save is done; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._persist.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _write_loop(self) -> None:
        os.environ["JAX_PLATFORMS"] = "cpu"  # Orbax imports JAX: never let it take a TPU
        # Linux: per thread, and inherited by the threads Orbax starts from here. The idle class,
        # not nice 19: at nice 19 the save still took ~20 ms from the step after each save step
        # (bench figure 6); where the class is unavailable, nice 19.
        if not idle_this_thread(what="the durable writer"):
            lower_this_thread(PERSIST_NICE, what="the durable writer")
        import orbax.checkpoint  # noqa: F401  (before the first save needs it)

        from workers import copy_store
        while True:
            copy, directory, keep_steps = self._persist.get()
            step, source = copy.step, copy.source
            t0 = time.perf_counter()
            try:
                if checksum(copy.data) != copy.crc32:
                    raise ValueError("the copy fails its checksum; not saved")
                completed = copy_store.write(
                    directory, step=step, source=source, sources=copy.sources,
                    incarnation=copy.incarnation, layout=copy.layout, data=copy.data,
                    crc32=copy.crc32)
                if completed:
                    copy_store.prune(directory, keep_steps)
                with self._lock:
                    self.persisted.append({"step": step, "source": source,
                                           "seconds": round(time.perf_counter() - t0, 4),
                                           "nbytes": len(copy.data), "completed": completed})
            except Exception as exc:  # a full disk must not kill the RAM copies with it
                log.error("durable save of step %d source %d failed: %s", step, source, exc)
                with self._lock:
                    self.persist_errors.append(f"step {step} source {source}: "
                                               f"{type(exc).__name__}: {str(exc)[:300]}")
            finally:
                self._persist.task_done()

    def _enqueue(self, copy: _Copy, directory: str, keep_steps: int) -> None:
        self._start_writer()
        self._persist.put((copy, directory, keep_steps))

    def _start_writer(self) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="ram-persist",
                                                daemon=True)
                self._writer.start()

    def inventory(self) -> list[dict]:
        """Every copy held, its checksum verified now (memory can rot; a copy may be bad)."""
        with self._lock:
            copies = [c for mine in self._copies.values() for c in mine]
        return [{"incarnation": c.incarnation, "step": c.step, "source": c.source,
                 "sources": c.sources, "nbytes": len(c.data),
                 "intact": checksum(c.data) == c.crc32} for c in copies]

    def get(self, *, incarnation: int, step: int, source: int) -> dict:
        """One copy with its layout and checksum (the reader verifies it again)."""
        with self._lock:
            for mine in self._copies.values():
                for c in mine:
                    if (c.incarnation, c.step, c.source) == (incarnation, step, source):
                        return {"layout": c.layout, "data": c.data, "crc32": c.crc32}
        raise KeyError(f"no copy of source {source} at step {step} (incarnation {incarnation})")

    def stats(self) -> dict:
        with self._lock:
            saved = [p["seconds"] for p in self.persisted]
            return {"copies": sum(len(m) for m in self._copies.values()),
                    "nbytes": self._nbytes(), "persisted": len(saved),
                    "persist_s_max": max(saved, default=0.0),
                    "persist_errors": len(self.persist_errors)}

    def damage(self, *, step: int, source: int) -> bool:
        """Flip one byte of a copy (chaos/tests: a corrupted replica must be refused)."""
        with self._lock:
            for mine in self._copies.values():
                for c in mine:
                    if (c.step, c.source) == (step, source) and c.data:
                        c.data = bytes([c.data[0] ^ 0xFF]) + c.data[1:]
                        return True
        return False

    def _nbytes(self) -> int:
        return sum(len(c.data) for mine in self._copies.values() for c in mine)
