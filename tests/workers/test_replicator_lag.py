"""The RAM tier's promise (a kill -9 after step N finds step N - 1 on every holder) holds by
construction: a step waits for the previous copy's acknowledgement before queueing its own,
instead of letting a lagging copy be replaced. Real holders over the real wire, in this
process; the packer is replaced (no JAX: the bytes are what matters here)."""

from __future__ import annotations

import threading
import time

from workers import ram_wire, replicator
from workers.ram_holder import RamHolder


class _Packer:
    """Stands in for ``replica.Packer``: the state is the bytes."""

    def __init__(self, state: bytes) -> None:
        self.nbytes = len(state)

    def pack(self, state: bytes) -> tuple[dict, bytearray]:
        return {"leaves": [], "pieces": []}, bytearray(state)


def _holder_and_replicator() -> tuple[RamHolder, replicator.Replicator]:
    holder = RamHolder(keep=2)
    address = holder.serve("secret", host="127.0.0.1")
    return holder, replicator.Replicator([("own", address)], token="secret", writer="node-a",
                                         incarnation=1, source=0, sources=1, every=1, keep=2,
                                         max_host_bytes=1 << 30)


def test_a_step_waits_for_the_previous_copy_instead_of_replacing_it(monkeypatch):
    monkeypatch.setattr(replicator.replica, "Packer", _Packer)
    slow_until = {"step": 1, "s": 0.4}
    real_ack = ram_wire.read_ack
    acked: list[float] = []

    def slow_ack(sock):  # the holder of a loaded machine acknowledges copy 1 late
        if len(acked) == 0:
            time.sleep(slow_until["s"])
        out = real_ack(sock)
        acked.append(time.monotonic())
        return out

    monkeypatch.setattr(replicator.ram_wire, "read_ack", slow_ack)
    holder, rep = _holder_and_replicator()
    try:
        assert rep.after_step(1, b"\x01" * 100_000) < 0.2  # packs and queues: no wait
        t0 = time.monotonic()
        blocked = rep.after_step(2, b"\x02" * 100_000)
        assert blocked >= 0.25, "step 2 waited for copy 1's acknowledgement"
        assert acked and acked[0] <= time.monotonic() and time.monotonic() - t0 >= 0.25
        assert [c["step"] for c in holder.inventory()] == [1], "copy 1 arrived, not replaced"
        assert rep.settle(5.0)
        assert sorted(c["step"] for c in holder.inventory()) == [1, 2]
        assert rep.stats.replaced == 0 and rep.stats.sent == 2
    finally:
        rep.close()


def test_past_the_bound_the_newer_copy_replaces_the_waiting_one(monkeypatch):
    monkeypatch.setattr(replicator.replica, "Packer", _Packer)
    monkeypatch.setattr(replicator, "LAG_WAIT_S", 0.1)
    gate = threading.Event()
    real_ack = ram_wire.read_ack

    def held_ack(sock):  # copy 1's acknowledgement waits for the gate
        gate.wait(5)
        return real_ack(sock)

    monkeypatch.setattr(replicator.ram_wire, "read_ack", held_ack)
    holder, rep = _holder_and_replicator()
    try:
        rep.after_step(1, b"\x01" * 1000)
        time.sleep(0.1)  # the sender took copy 1 and waits for its acknowledgement
        assert 0.1 <= rep.after_step(2, b"\x02" * 1000) < 1.0
        assert 0.1 <= rep.after_step(3, b"\x03" * 1000) < 1.0  # replaces the queued copy 2
        assert rep.stats.replaced == 1
        gate.set()
        assert rep.settle(5.0)
        assert sorted(c["step"] for c in holder.inventory()) == [1, 3]
    finally:
        gate.set()
        rep.close()
