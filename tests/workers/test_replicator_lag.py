"""The RAM tier's promise (a kill -9 after step N finds step N - 1 on every holder) holds by
construction: a step waits for the previous copy's acknowledgement before queueing its own,
instead of letting a lagging copy be replaced. Real holders over the real wire, in this
process; the packer is replaced (no JAX: the bytes are what matters here). Order, not time,
is asserted: an acknowledgement is held back behind an event."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from tests.workers.ram_testing import TOKEN, holder
from workers.ram import replicator
from workers.ram import wire as ram_wire
from workers.ram.holder import RamHolder


class _Packer:
    """Stands in for ``replica.Packer``: the state is the bytes."""

    def __init__(self, state: bytes) -> None:
        self.nbytes = len(state)

    def pack(self, state: bytes) -> tuple[dict, bytearray]:
        return {"leaves": [], "pieces": []}, bytearray(state)

    def release(self, data: bytearray) -> None:
        """Nothing to reuse: every pack is new bytes."""


def _holder_and_replicator() -> tuple[RamHolder, replicator.Replicator]:
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    return h, replicator.Replicator([("own", address)], token=TOKEN, writer="node-a",
                                    incarnation=1, source=0, sources=1, every=1, keep=2,
                                    max_host_bytes=1 << 30)


def _hold_first_ack(monkeypatch) -> threading.Event:
    """Copy 1's acknowledgement is read only once the returned event is set."""
    gate = threading.Event()
    real_ack = ram_wire.read_ack
    reads: list[int] = []

    def held_ack(sock):
        if not reads:
            gate.wait(30)
        reads.append(1)
        return real_ack(sock)

    monkeypatch.setattr(replicator.replica, "Packer", _Packer)
    monkeypatch.setattr(replicator.ram_wire, "read_ack", held_ack)
    return gate


@contextlib.contextmanager
def _copy_1_in_flight(monkeypatch, nbytes: int
                      ) -> Iterator[tuple[threading.Event, RamHolder, replicator.Replicator]]:
    """Copy 1 sent and taken by the sender, its acknowledgement held until the event is set
    (and always set, and the replicator closed, on the way out)."""
    gate = _hold_first_ack(monkeypatch)
    holder, rep = _holder_and_replicator()
    try:
        rep.after_step(1, b"\x01" * nbytes)
        deadline = time.monotonic() + 30
        while not rep._busy:  # the sender took copy 1 off the queue and waits for the ack
            assert time.monotonic() < deadline, "the sender never took copy 1"
            time.sleep(0.01)
        yield gate, holder, rep
    finally:
        gate.set()
        rep.close()


def test_a_step_waits_for_the_previous_copy_instead_of_replacing_it(monkeypatch):
    with _copy_1_in_flight(monkeypatch, 100_000) as (gate, holder, rep):
        seen: dict[str, object] = {}

        def step_2() -> None:
            rep.after_step(2, b"\x02" * 100_000)
            seen["ack_released_first"] = gate.is_set()
            seen["held_then"] = [c["step"] for c in holder.inventory(TOKEN)]

        t = threading.Thread(target=step_2)
        t.start()
        time.sleep(0.2)  # give a step that does not wait the chance to return early
        gate.set()
        t.join(30)
        assert seen["ack_released_first"] is True, "step 2 returned before copy 1 was acked"
        assert seen["held_then"] == [1], "copy 1 arrived, not replaced, before step 2 went on"
        assert rep.settle(5.0)
        assert sorted(c["step"] for c in holder.inventory(TOKEN)) == [1, 2]
        assert rep.stats.replaced == 0 and rep.stats.sent == 2


def test_past_the_bound_the_newer_copy_replaces_the_waiting_one(monkeypatch):
    monkeypatch.setattr(replicator, "LAG_WAIT_S", 0.1)
    with _copy_1_in_flight(monkeypatch, 1000) as (gate, holder, rep):
        rep.after_step(2, b"\x02" * 1000)  # gives up waiting: copy 2 is queued
        rep.after_step(3, b"\x03" * 1000)  # gives up again: replaces the queued copy 2
        assert not gate.is_set(), "both steps went on while copy 1 was still unacknowledged"
        assert rep.stats.replaced == 1
        gate.set()
        assert rep.settle(5.0)
        assert sorted(c["step"] for c in holder.inventory(TOKEN)) == [1, 3]


def test_the_sender_stays_idle_while_copies_keep_up(monkeypatch):
    monkeypatch.setattr(replicator.replica, "Packer", _Packer)
    _holder, rep = _holder_and_replicator()
    try:
        rep.after_step(1, b"\x01" * 1000)
        assert rep.settle(5.0)
        first = rep._thread
        rep.after_step(2, b"\x02" * 1000)  # copy 1 is acknowledged: nothing to wait for
        assert rep.settle(5.0)
        assert rep._thread is first and rep.stats.sender == "idle"
        assert os.sched_getscheduler(first.native_id) == os.SCHED_IDLE
    finally:
        rep.close()


def test_a_step_kept_waiting_moves_the_sending_to_normal_priority(monkeypatch):
    with _copy_1_in_flight(monkeypatch, 1000) as (gate, holder, rep):
        idle = rep._thread
        assert rep.stats.sender == "idle"
        # copy 1's acknowledgement comes 4x the bound late: step 2 waits for it, as a step
        # behind a starved idle-class sender would
        threading.Timer(4 * replicator.IDLE_LAG_S, gate.set).start()
        rep.after_step(2, b"\x02" * 1000)
        assert gate.is_set()
        assert rep.stats.sender == "normal" and rep._thread is not idle
        assert rep.settle(5.0)
        idle.join(5)
        assert not idle.is_alive(), "the replaced idle-class sender did not end"
        assert os.sched_getscheduler(rep._thread.native_id) == os.SCHED_OTHER
        assert sorted(c["step"] for c in holder.inventory(TOKEN)) == [1, 2]
        assert rep.stats.sent == 2 and rep.stats.replaced == 0
