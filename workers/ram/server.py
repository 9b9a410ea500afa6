"""The holder's end of the RAM tier's wire (``workers.ram.wire``): a TCP server, no Ray.

Every connection is untrusted until its hello passes (``workers.ram.auth``), so before that the
server reads at most one small frame, within ``hello_timeout_s`` in all. After it, a copy's data
may be at most ``max_copy_bytes`` (the size the driver expects a copy to have), a connection
idle for ``idle_timeout_s`` is closed (the sender reconnects), and at most ``max_connections``
are open at once (one thread each; one more is closed at once). Each copy goes to ``receive``
under the writer the hello authenticated; the frame cannot name another. A new hello key
(``rekey``) ends the connections authenticated with the old one at their next frame.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from workers.ram import auth as ram_auth
from workers.ram import wire as ram_wire

log = logging.getLogger(__name__)

Receive = Callable[[str, dict, bytearray], None]
"""``receive(writer, header, data)``: keep one copy; raises ``KeyError`` / ``TypeError`` /
``ValueError`` for a copy it refuses (the sender is told ``0``)."""
Read = Callable[[dict], tuple[dict, bytes | bytearray]]
"""``read(request)``: (description, bytes) of the copy a restore asks for (``wire.READ``);
raises ``KeyError`` when there is none."""
Buffers = Callable[[str, int], bytearray]
"""``buffers(writer, n)``: a buffer of ``n`` bytes to receive the writer's next copy into (one
the receiver no longer needs, so its pages are already touched)."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_copy_bytes: int
    max_connections: int = 32
    hello_timeout_s: float = 5.0
    idle_timeout_s: float = 300.0
    max_header_bytes: int = ram_wire.MAX_HEADER

    def __post_init__(self) -> None:
        for name in ("max_copy_bytes", "max_connections", "hello_timeout_s", "idle_timeout_s",
                     "max_header_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RAM server limit {name}={getattr(self, name)!r} must be > 0")


class CopyServer:
    """Listens on ``host`` (port 0: the kernel picks) once built; ``address`` says where."""

    def __init__(self, receive: Receive, *, hello_key: bytes, limits: Limits,
                 host: str, buffers: Buffers | None = None, read: Read | None = None) -> None:
        self._receive = receive
        self._buffers = buffers
        self._read = read
        self.limits = limits
        self._lock = threading.Lock()
        self._key = hello_key
        self._generation = 0
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self.refused = {"busy": 0, "hello": 0, "frame": 0}
        """Connections closed for want of a slot, a failed hello, a malformed frame."""
        self._listener = socket.create_server((host, 0))
        self._listener.listen(64)
        self._closed = False
        threading.Thread(target=self._accept_loop, name="ram-accept", daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def rekey(self, hello_key: bytes) -> None:
        with self._lock:
            self._key = hello_key
            self._generation += 1

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            if not self._slots.acquire(blocking=False):
                self._count("busy")
                log.warning("RAM-tier connection refused: %d connections open already",
                            self.limits.max_connections)
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve_conn, args=(conn,), name="ram-conn",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had: refuse, never die
                self._slots.release()
                conn.close()

    def _count(self, what: str) -> None:
        with self._lock:
            self.refused[what] += 1

    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            with conn:
                generation, writer = self._hello(conn)
                if writer is not None:
                    self._copies(conn, writer, generation)
        finally:
            self._slots.release()

    def _hello(self, conn: socket.socket) -> tuple[int, str | None]:
        """(key generation, writer) once the peer proves it has the run's secret; (-1, None)
        and the connection closed otherwise."""
        deadline = time.monotonic() + self.limits.hello_timeout_s
        nonce = secrets.token_bytes(ram_wire.NONCE_BYTES)
        with self._lock:
            key, generation = self._key, self._generation
        try:
            conn.settimeout(self.limits.hello_timeout_s)
            conn.sendall(ram_wire.CHALLENGE + nonce)
            hello, _ = ram_wire.recv_frame(conn, max_header=ram_wire.HELLO_MAX_HEADER,
                                           max_data=0, deadline=deadline)
            writer = ram_auth.check_hello(key, nonce, hello)
            conn.sendall(b"\x01")
        except (OSError, ram_auth.CopyRejected) as exc:
            self._count("hello")
            log.warning("RAM-tier connection refused before authentication: %s", exc)
            return -1, None
        return generation, writer

    def _copies(self, conn: socket.socket, writer: str, generation: int) -> None:
        conn.settimeout(self.limits.idle_timeout_s)
        try:
            while True:
                into = (None if self._buffers is None
                        else lambda n, b=self._buffers: b(writer, n))
                header, data = ram_wire.recv_frame(conn, max_header=self.limits.max_header_bytes,
                                                   max_data=self.limits.max_copy_bytes,
                                                   into=into)
                with self._lock:
                    stale = generation != self._generation
                if stale:
                    log.warning("RAM-tier connection of %s closed: the token was replaced",
                                writer)
                    return
                if ram_wire.READ in header:
                    self._answer_read(conn, writer, header)
                    continue
                try:
                    if header.get("writer", writer) != writer:
                        raise ValueError(f"the copy names writer {header.get('writer')!r}, the "
                                         f"connection is {writer!r}'s")
                    self._receive(writer, header, data)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("RAM copy from %s refused: %s", writer, exc)
                    conn.sendall(b"\x00")
                    continue
                conn.sendall(b"\x01")
        except TimeoutError:
            log.info("RAM-tier connection of %s idle for %.0fs: closed (it reconnects)", writer,
                     self.limits.idle_timeout_s)
        except ram_wire.Closed:
            log.debug("RAM-tier connection of %s closed by the sender", writer)
        except ram_wire.WireError as exc:
            self._count("frame")
            log.warning("RAM-tier connection of %s closed: %s", writer, exc)
        except OSError as exc:  # the host went away
            log.debug("RAM-tier connection of %s closed: %s", writer, exc)

    def _answer_read(self, conn: socket.socket, reader: str, request: dict) -> None:
        """Send the copy a restoring host asks for (its hello proved the run's secret, as a
        ``RamHolder.get`` needs): one frame, the copy's description and its bytes, or
        ``{"error": ...}`` and no bytes. The reader checks the copy's MAC before using it."""
        try:
            if self._read is None or not isinstance(request.get(ram_wire.READ), dict):
                raise KeyError("this holder serves no reads" if self._read is None
                               else "the read names no copy")
            description, data = self._read(request)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("RAM-tier read by %s refused: %s", reader, exc)
            ram_wire.send_frame(conn, {"error": str(exc)[:300]})
            return
        ram_wire.send_frame(conn, description, data)
