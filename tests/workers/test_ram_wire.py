"""The RAM tier's wire against a real holder in this process: copies stream over TCP, each is
acknowledged, a connection without the run's token is refused, a new token replaces the old."""

from __future__ import annotations

import socket

import pytest

from workers import ram_wire
from workers.ram_holder import RamHolder, checksum


def _copy(step: int, data: bytes) -> dict:
    return {"writer": "node-a", "incarnation": 1, "step": step, "source": 0, "sources": 1,
            "layout": {"leaves": [], "pieces": []}, "crc32": checksum(data), "persist": None}


def test_copies_stream_and_are_acknowledged_and_kept():
    holder = RamHolder(keep=2)
    address = holder.serve("secret", host="127.0.0.1")
    with ram_wire.connect(address, "secret", timeout_s=5) as sock:
        for step in (1, 2, 3):
            data = bytes([step]) * 200_000
            ram_wire.send_frame(sock, _copy(step, data), data)
            assert ram_wire.read_ack(sock) is True
    inventory = holder.inventory()
    assert sorted(c["step"] for c in inventory) == [2, 3]
    assert all(c["intact"] for c in inventory)
    assert holder.get(incarnation=1, step=3, source=0)["data"] == bytes([3]) * 200_000


def test_a_connection_without_the_token_is_closed_and_stores_nothing():
    holder = RamHolder(keep=2)
    address = holder.serve("secret", host="127.0.0.1")
    data = b"x" * 10
    with (pytest.raises((ram_wire.WireError, ConnectionError, OSError)),  # on write or read
          ram_wire.connect(address, "wrong", timeout_s=5) as sock):
        ram_wire.send_frame(sock, _copy(1, data), data)
        ram_wire.read_ack(sock)
    assert holder.inventory() == []


def test_a_new_token_keeps_the_port_and_refuses_the_old_one():
    holder = RamHolder(keep=2)
    first = holder.serve("one", host="127.0.0.1")
    assert holder.serve("two", host="127.0.0.1") == first
    # The holder closes a connection with the old token: the refusal shows on the write (the
    # holder already closed: broken pipe) or on the read of the ack, whichever comes first.
    with (pytest.raises((ram_wire.WireError, ConnectionError, OSError)),
          ram_wire.connect(first, "one", timeout_s=5) as sock):
        ram_wire.send_frame(sock, _copy(1, b"a"), b"a")
        ram_wire.read_ack(sock)
    assert holder.stats()["copies"] == 0


def test_garbage_is_not_a_frame():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        with pytest.raises(ram_wire.WireError, match="not a RAM-tier frame"):
            ram_wire.recv_frame(b)
