"""A host's side of the RAM tier: after every ``every`` steps, send its copy to its holders.

The step pays for packing (its shards copied into one host buffer: the next step donates the
device buffers, so this part cannot wait; ``replica.Packer`` works the layout out once). A
sender thread streams the bytes to both holders over their wire (``workers.ram.wire``: one TCP
connection each, no Ray call per step) and waits for their acknowledgements, so at most one copy
is in flight and, with ``keep >= 2``, every holder has a complete older set while the newest
arrives. Before a new copy is queued, the previous one must have arrived (bounded by
``LAG_WAIT_S``): the step waits for it instead of letting it be replaced, so a kill -9 after
step N finds step N - 1 on every holder. Normally the previous copy arrived during the step;
on a machine short of CPU (a compile, another job) the step waits a little. Past the bound the
newer copy replaces the waiting one and the lag is logged (a copy asked to be saved durably is
never replaced). A holder that fails is dropped for the rest of
this incarnation and logged: the RAM tier is an optimisation, it never stops training.

The sender thread runs in Linux's idle scheduling class: its MAC and socket writes (with
the kernel's loopback work they bring) then fill the gaps the step leaves on the cores instead
of delaying the step's threads (bench/RESULTS.md, section 6: at normal priority, and at nice
19, the tier slowed the step measurably more). A host whose cores are all busy with other
work could starve it; a step that waits longer than ``IDLE_LAG_S`` for the previous copy
therefore moves the sending to a new thread at normal priority (an idle-class thread cannot
return without privilege), logged once.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.ram_tier import copy_due
from workers.host.niceness import idle_this_thread
from workers.ram import auth as ram_auth
from workers.ram import budget, replica
from workers.ram import wire as ram_wire

log = logging.getLogger(__name__)

LAG_WAIT_S = 5.0
"""How long a step waits for the previous copy to arrive before the new one may replace it."""
IDLE_LAG_S = 0.05
"""A step that waited longer than this for the previous copy (normally ~0) moves the sending
from the idle-class thread to one at normal priority."""
_CLOSED = (ram_wire.Closed, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
"""What a connection the holder closed looks like to its sender."""


@dataclass
class ReplicaStats:
    copies: int = 0
    sent: int = 0
    replaced: int = 0
    bytes_per_copy: int = 0
    sent_bytes: int = 0
    blocking_s: float = 0.0
    dropped: list[str] = field(default_factory=list)
    disabled: str = ""
    persist_requests: int = 0
    sender: str = ""
    """"idle" (Linux's idle scheduling class), "normal", or "" before the first copy."""

    def as_dict(self) -> dict:
        return {"copies": self.copies, "sent": self.sent, "replaced": self.replaced,
                "bytes_per_copy": self.bytes_per_copy, "sent_bytes": self.sent_bytes,
                "blocking_s": round(self.blocking_s, 4), "dropped": list(self.dropped),
                "disabled": self.disabled, "persist_requests": self.persist_requests,
                "sender": self.sender}


@dataclass
class _Copy:
    step: int
    layout: dict
    data: bytes | bytearray
    persist: dict | None


def _nbytes(data: Any) -> int:
    """Bytes of a copy's body: one buffer, or the shards' views sent as they are."""
    return sum(memoryview(p).nbytes for p in data) if isinstance(data, list) else len(data)


class Replicator:
    """``holders``: (name, (address, port)) of this host's own-node holder and its peer's (or
    its peer's only)."""

    def __init__(self, holders: Sequence[tuple[str, tuple[str, int]]], *, token: str,
                 writer: str, incarnation: int, source: int, sources: int, every: int,
                 keep: int, max_host_bytes: int | None, holder_sources: int = 2,
                 deliver_timeout_s: float = 30.0) -> None:
        self.holders = list(holders)
        self.token = token
        self._copy_key = ram_auth.Keys.from_token(token).copy
        self._socks: dict[str, Any] = {}
        self._packer: Any = None
        self.writer = writer
        self.incarnation = incarnation
        self.source = source
        self.sources = sources
        self.every = every
        self.keep = keep
        self.holder_sources = holder_sources
        """Hosts whose copies a holder keeps: 2 (its own node's and a peer's), 1 (peer only)."""
        self.max_host_bytes = budget.cap_bytes(max_host_bytes)
        """The driver's number, or (None: ``auto`` undecided there) this host's own."""
        self.deliver_timeout_s = deliver_timeout_s
        self.stats = ReplicaStats()
        self.last_wait_s = 0.0
        """Of the last copy's blocking seconds, those spent waiting for the one before it to
        be delivered (the rest is the pack): the interval policy weighs them apart."""
        self._cv = threading.Condition()
        self._queue: list[_Copy] = []
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lag_logged = False

    def after_step(self, step: int, state: Any, *, persist: dict | None = None,
                   force: bool = False, data: Callable[[], dict] | None = None,
                   direct: bool = False) -> float:
        """Pack ``state`` (now at ``step``) if due, forced, or ``persist`` asks for it (then
        the first live holder, this node's, also saves it durably: ``RamHolder.put``) and queue
        it for the sender; returns the seconds this step was blocked (the pack). ``data``
        gives the data record of the step (``workers.task.data_state``), asked only when a
        copy is made: it travels in the copy's layout (authenticated with it)."""
        due = self.periodic_due(step) or persist is not None or force
        if not due or not self.holders or self.stats.disabled:
            return 0.0
        t0 = time.perf_counter()
        try:
            return self._queue_copy(step, state, persist, t0,
                                    data() if data is not None else None, direct=direct)
        except Exception as exc:  # the tier is an optimisation: never fail the step for it
            self.stats.disabled = f"copy failed: {type(exc).__name__}: {str(exc)[:300]}"
            log.error("RAM tier off on this host: %s", self.stats.disabled)
            return time.perf_counter() - t0

    def periodic_due(self, step: int) -> bool:
        return copy_due(step, every=self.every)

    def _queue_copy(self, step: int, state: Any, persist: dict | None, t0: float,
                    data: dict | None = None, *, direct: bool = False) -> float:
        if self._packer is None:
            self._packer = replica.Packer(state)
        nbytes = self._packer.nbytes
        # A holder keeps `keep` copies of this host's and of one peer's (or a peer's only), of
        # about this size.
        if nbytes * self.keep * self.holder_sources > self.max_host_bytes:
            self.stats.disabled = (f"{nbytes} bytes per copy x {self.keep} kept x "
                                   f"{self.holder_sources} host(s) "
                                   f"exceeds checkpoint.ram.max_host_bytes={self.max_host_bytes}")
            log.warning("RAM tier off on this host: %s", self.stats.disabled)
            return time.perf_counter() - t0
        # the previous copy delivered first, then this one packed into its buffer: one copy's
        # buffer in this process, not two (the wait is the same either way)
        t_wait = time.perf_counter()
        settled = self.settle(LAG_WAIT_S)  # the promise: <= 1 step lost
        waited = time.perf_counter() - t_wait
        self.last_wait_s = waited
        if not settled and not self._lag_logged:
            self._lag_logged = True
            log.warning("RAM copy before step %d still in flight after %.0fs: it may be "
                        "replaced (a kill -9 now could lose more than 1 step)", step, LAG_WAIT_S)
        if settled and waited > IDLE_LAG_S and self.stats.sender == "idle":
            self._start_sender(idle=False, why=f"step {step} waited {waited:.3f}s for the "
                               "previous copy")
        if direct:  # sent from the shards themselves: the caller settles before any step
            layout, body = self._packer.layout, self._packer.views(state)
        else:
            layout, body = self._packer.pack(state)
        if data is not None:
            layout = {**layout, "data": data}
        copy = _Copy(step=step, layout=layout, data=body, persist=persist)
        with self._cv:
            kept = [c for c in self._queue if c.persist is not None]
            for c in self._queue:
                if c.persist is None:
                    self._release(c)
            self.stats.replaced += len(self._queue) - len(kept)
            self._queue = [*kept, copy]
            self.stats.copies += 1
            self.stats.bytes_per_copy = nbytes
            if persist is not None:
                self.stats.persist_requests += 1
            self._cv.notify_all()
        if self._thread is None:
            self._start_sender(idle=True)
        dt = time.perf_counter() - t0
        self.stats.blocking_s += dt
        return dt

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued copy is sent and delivered (a drain's copy); False on
        timeout."""
        deadline = time.monotonic() + (timeout_s or 2 * self.deliver_timeout_s)
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(timeout=left)
        return True

    def drop_direct(self) -> int:
        """Forget queued copies sent from the shards' own views (``after_step(direct=True)``)
        that were not delivered in time: once the state moves on they would send its new
        bytes under the old step. The number dropped."""
        with self._cv:
            keep = [c for c in self._queue if not isinstance(c.data, list)]
            dropped = len(self._queue) - len(keep)
            self._queue = keep
            self._cv.notify_all()
        return dropped

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued (bounded), then stop the sender and close the sockets: the
        process goes on in another group (``HostActor.release``) and must hold no state of
        this one."""
        self.settle(timeout_s)
        with self._cv:
            self._closed = True
            self._queue = []
            self._cv.notify_all()
        for sock in self._socks.values():
            sock.close()
        self._socks = {}
        self._packer = None

    # ---- the sender thread -------------------------------------------------------------------

    def _start_sender(self, *, idle: bool, why: str = "") -> None:
        """Start the sender thread. A replacement (the idle one starved: ``why``) is started
        only with nothing queued or in flight, so one thread sends at a time."""
        if why:
            log.warning("RAM copy sender moved to normal priority: %s (the host's cores are "
                        "busy with other work; copies now compete with the step)", why)
        thread = threading.Thread(target=self._send_loop, args=(idle,), name="ram-sender",
                                  daemon=True)
        with self._cv:
            self._thread = thread
            self.stats.sender = "normal"
            self._cv.notify_all()  # a replaced thread sees it is no longer the sender and ends
        thread.start()

    def _send_loop(self, idle: bool) -> None:
        me = threading.current_thread()
        if idle and idle_this_thread(what="the RAM copy sender"):
            with self._cv:
                if self._thread is me:
                    self.stats.sender = "idle"
        while True:
            with self._cv:
                while not self._queue and not self._closed and self._thread is me:
                    self._cv.wait()
                if self._closed or self._thread is not me:
                    return
                copy = self._queue.pop(0)
                self._busy = True
            try:
                self._send(copy)  # acknowledged before the next is sent: one in flight
            except Exception as exc:  # never let the sender die silently
                log.error("RAM copy of step %d not sent: %s", copy.step, exc)
            finally:
                self._release(copy)
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _release(self, copy: _Copy) -> None:
        """The copy's bytes are in every holder's socket (or dropped): the packer may reuse the
        buffer."""
        packer = self._packer
        if packer is not None and isinstance(copy.data, bytearray | mmap.mmap):
            packer.release(copy.data)  # not the shards' own views (a direct copy)

    def _send(self, copy: _Copy) -> None:
        """Stream the copy to every holder, then read every acknowledgement. A connection the
        holder closed since the last copy (idle too long) is made again once."""
        data = copy.data
        # authenticated here, once per copy, not in the step: the MAC reads the bytes in
        # 16 MiB pieces, holding the GIL about a millisecond at a time
        header = {"incarnation": self.incarnation, "step": copy.step, "source": self.source,
                  "sources": self.sources, "layout": copy.layout,
                  "mac": ram_auth.copy_mac(self._copy_key, incarnation=self.incarnation,
                                           step=copy.step, source=self.source,
                                           sources=self.sources, layout=copy.layout,
                                           data=data)}
        todo = [(name, address, {**header, "persist": copy.persist is not None and i == 0},
                 name in self._socks) for i, (name, address) in enumerate(self.holders)]
        pushed = self._push_all(todo, data)
        sent = []
        for (name, address, frame, reused), (sock, exc) in zip(todo, pushed, strict=True):
            if exc is None:
                sent.append((name, address, frame, reused, sock))
            else:
                self._again_or_drop(name, address, frame, data, reused, exc)
        for name, address, frame, reused, sock in sent:
            try:
                if not ram_wire.read_ack(sock):
                    raise ram_wire.CopyRefused("the holder refused the copy")
            except OSError as exc:
                self._again_or_drop(name, address, frame, data, reused, exc)
        self.stats.sent += 1
        self.stats.sent_bytes += _nbytes(data) * len(sent)

    def _push_all(self, todo: list[tuple[str, tuple[str, int], dict, bool]],
                  data: bytes | bytearray) -> list[tuple[Any, OSError | None]]:
        """Stream the copy to every holder at once (its own node's and its peer's: one stream
        each, in parallel, so the copy is delivered in about one stream's time, not two);
        (socket, None) or (None, the error) per holder, in order."""
        out: list[tuple[Any, OSError | None]] = [(None, None)] * len(todo)

        def push(i: int) -> None:
            name, address, frame, _ = todo[i]
            try:
                out[i] = (self._push(name, address, frame, data), None)
            except OSError as exc:
                out[i] = (None, exc)

        others = [threading.Thread(target=push, args=(i,), name="ram-sender-peer", daemon=True)
                  for i in range(1, len(todo))]  # inherit this thread's scheduling class
        for t in others:
            t.start()
        if todo:
            push(0)
        for t in others:
            t.join()
        return out

    def _push(self, name: str, address: tuple[str, int], frame: dict,
              data: bytes | bytearray) -> Any:
        sock = self._socket(name, address)
        ram_wire.send_frame(sock, frame, data)
        return sock

    def _again_or_drop(self, name: str, address: tuple[str, int], frame: dict,
                       data: bytes | bytearray, reused: bool, exc: OSError) -> None:
        """Send once more on a new connection if the one made for an earlier copy was closed
        (a holder closes idle connections); otherwise (refused, timed out), or if that fails
        too, drop the holder."""
        if reused and isinstance(exc, _CLOSED):
            stale = self._socks.pop(name, None)
            if stale is not None:
                stale.close()
            try:
                if ram_wire.read_ack(self._push(name, address, frame, data)):
                    return
                exc = ram_wire.CopyRefused("the holder refused the copy")
            except OSError as again:
                exc = again
        self._drop(name, exc)

    def _socket(self, name: str, address: tuple[str, int]) -> Any:
        sock = self._socks.get(name)
        if sock is None:
            sock = ram_wire.connect(tuple(address), self.token, writer=self.writer,
                                    timeout_s=self.deliver_timeout_s)
            self._socks[name] = sock
        return sock

    def _drop(self, name: str, exc: BaseException) -> None:
        """A dead or stuck holder: go on without it."""
        log.warning("RAM holder %s dropped (%s: %s)", name, type(exc).__name__, exc)
        self.holders = [(n, a) for n, a in self.holders if n != name]
        self.stats.dropped.append(name)
        sock = self._socks.pop(name, None)
        if sock is not None:
            sock.close()
