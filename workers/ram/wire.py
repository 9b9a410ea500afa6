"""The RAM tier's wire: a host streams its copies to a holder over one TCP connection.

On the emulated cluster one Ray actor call per step per host to hand a holder its copy made the
step markedly slower (task submission, object store and scheduling work compete with the step
for the cores; bench/RESULTS.md, section 6); a socket write of the same bytes costs a kernel
copy. Ray still finds the holders and serves restores (rare); every step's copy
goes over this wire.

Frame: ``TPUR`` | header length | data length (network order, 4 + 4 + 8 bytes) | JSON header |
data. Both lengths are checked against the receiver's bounds *before* anything is allocated.

A connection opens with a challenge and a hello (``workers.ram.auth``): the holder sends
``TPUC`` and a random nonce; the host answers with one frame, header
``{"writer": <node id>, "proof": HMAC(hello key, nonce, writer)}`` and no data (at most
``HELLO_MAX_HEADER`` bytes: nothing larger is read before authentication); the holder answers
``1`` (accepted: every copy on this connection is the writer's) or closes. The run's secret
never crosses the wire. The holder then answers each copy with one byte, ``1`` stored or ``0``
refused, so the sender knows what is delivered.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from workers.ram import auth as ram_auth

MAGIC = b"TPUR"
CHALLENGE = b"TPUC"
NONCE_BYTES = 32
_HEAD = struct.Struct("!4sIQ")
MAX_HEADER = 16 * 1024 * 1024
"""The largest copy header (its layout) an authenticated peer may send."""
HELLO_MAX_HEADER = 1024
"""The largest hello: the only frame read before the peer is authenticated."""


READ = "read"
"""A frame whose header has this key asks the holder for a copy (a restore) instead of
bringing one: ``{"read": {"incarnation", "step", "source"}, "describe": bool}``, and
``"pieces": [index, ...]`` for only some of its pieces."""


class WireError(ConnectionError):
    """A malformed or oversized frame, a refused hello or a closed connection."""


class Closed(WireError):
    """The peer closed the connection."""


class CopyRefused(WireError):
    """The holder answered ``0``: it read the copy and would not keep it (resending will not
    help)."""


def send_frame(sock: socket.socket, header: dict | bytes, data: Any = b"") -> None:
    """One frame: ``header`` then ``data`` (a buffer, or a list of buffers sent in order as
    one body: pieces of a copy, with no concatenating copy)."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    parts = data if isinstance(data, list | tuple) else [data]
    sock.sendall(_HEAD.pack(MAGIC, len(body), sum(memoryview(p).nbytes for p in parts)) + body)
    for part in parts:
        if memoryview(part).nbytes:
            sock.sendall(part)


def recv_frame(sock: socket.socket, *, max_header: int = MAX_HEADER, max_data: int,
               deadline: float | None = None,
               into: Callable[[int], bytearray] | None = None) -> tuple[dict, bytearray]:
    """(header, data), refusing (``WireError``) a frame whose lengths pass the bounds before
    reading or allocating its body; ``deadline`` (monotonic) bounds the whole frame. The data
    is the buffer it was received into (a holder keeps it as is: a second copy into ``bytes``
    would cost CPU beside the step, on every copy): ``into(n)`` gives one of ``n`` bytes (a
    holder's recycled buffer), else a new one."""
    magic, header_len, data_len = _HEAD.unpack(recv_exact(sock, _HEAD.size, deadline=deadline))
    if magic != MAGIC:
        raise WireError(f"not a RAM-tier frame (magic {magic!r})")
    if header_len > max_header or data_len > max_data:
        raise WireError(f"frame too large: header {header_len} bytes (at most {max_header}), "
                        f"data {data_len} bytes (at most {max_data})")
    try:
        header = json.loads(recv_into_new(sock, header_len, deadline=deadline))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"the frame's header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WireError(f"the frame's header is {type(header).__name__}, not an object")
    if into is None or not data_len:
        return header, recv_into_new(sock, data_len, deadline=deadline)
    buf = into(data_len)
    if len(buf) != data_len:
        raise ValueError(f"into({data_len}) gave a buffer of {len(buf)} bytes")
    return header, recv_into(sock, buf, deadline=deadline)


def recv_exact(sock: socket.socket, n: int, *, deadline: float | None = None) -> bytes:
    return bytes(recv_into_new(sock, n, deadline=deadline))


def recv_into_new(sock: socket.socket, n: int, *, deadline: float | None = None) -> bytearray:
    return recv_into(sock, bytearray(n), deadline=deadline)


def recv_into(sock: socket.socket, buf: bytearray, *,
              deadline: float | None = None) -> bytearray:
    """Fill ``buf`` from ``sock``."""
    n = len(buf)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"timed out after {got} of {n} bytes")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Closed(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


def connect(address: tuple[str, int], token: str, *, writer: str,
            timeout_s: float) -> socket.socket:
    """A connection to a holder, authenticated as ``writer`` with the run's ``token``."""
    key = ram_auth.Keys.from_token(token).hello
    sock = socket.create_connection(address, timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        challenge = recv_exact(sock, len(CHALLENGE) + NONCE_BYTES)
        if challenge[:len(CHALLENGE)] != CHALLENGE:
            raise WireError(f"{address} is not a RAM holder (it sent {challenge[:4]!r})")
        nonce = challenge[len(CHALLENGE):]
        send_frame(sock, {"writer": writer, "proof": ram_auth.hello_proof(key, nonce, writer)})
        answer = recv_exact(sock, 1)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, Closed):
            raise WireError(f"the holder at {address} closed the connection during the hello "
                            "(a token of another run or driver, or too many connections)"
                            ) from exc
        raise
    if answer != b"\x01":
        sock.close()
        raise WireError(f"the holder at {address} refused the hello")
    return sock


def read_ack(sock: socket.socket) -> bool:
    return recv_exact(sock, 1) == b"\x01"


def read_copy(sock: socket.socket, *, incarnation: int, step: int, source: int,
              max_data: int, describe: bool = False, pieces: list[int] | None = None,
              into: Callable[[int], bytearray] | None = None) -> tuple[dict, bytearray]:
    """Ask a holder (a connection made by ``connect``) for one copy: (its description with the
    MAC, its bytes; no bytes when ``describe``; ``pieces``: only those of its layout's pieces,
    in order, under the holder's ``pieces_mac``). ``KeyError`` when the holder has none."""
    send_frame(sock, {READ: {"incarnation": incarnation, "step": step, "source": source},
                      "describe": describe, **({"pieces": pieces} if pieces is not None else {})})
    header, data = recv_frame(sock, max_data=max_data, into=into)
    if "error" in header:
        raise KeyError(f"the holder has no such copy: {header['error']}")
    return header, data
