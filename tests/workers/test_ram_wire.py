"""The RAM tier's wire against a real holder in this process: copies stream over TCP, each is
acknowledged, a connection without the run's secret is refused, a new token replaces the old
one only with the old one's consent. Attacks from outside: tests/security/test_ram_boundary.py."""

from __future__ import annotations

import socket

import pytest

from tests.workers.ram_testing import TOKEN, copy_header, holder
from workers.ram import wire as ram_wire


def test_copies_stream_and_are_acknowledged_and_kept():
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        for step in (1, 2, 3):
            data = bytes([step]) * 200_000
            ram_wire.send_frame(sock, copy_header(step, data), data)
            assert ram_wire.read_ack(sock) is True
    inventory = h.inventory(TOKEN)
    assert sorted(c["step"] for c in inventory) == [2, 3]
    assert all(c["intact"] for c in inventory)
    assert h.get(TOKEN, incarnation=1, step=3, source=0)["data"] == bytes([3]) * 200_000


def test_a_connection_without_the_token_is_refused_at_the_hello_and_stores_nothing():
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with pytest.raises(ram_wire.WireError, match="during the hello"):
        ram_wire.connect(address, "wrong", writer="node-a", timeout_s=5)
    assert h.inventory(TOKEN) == []


def test_a_new_token_needs_the_old_one_keeps_the_port_and_refuses_the_old_one():
    h = holder(token="one")
    first = h.serve("one", host="127.0.0.1")
    with pytest.raises(PermissionError, match="not this run's"):
        h.serve("two", host="127.0.0.1")
    with pytest.raises(PermissionError, match="not this run's"):
        h.serve("two", host="127.0.0.1", replaces="three")
    assert h.serve("two", host="127.0.0.1", replaces="one") == first
    with pytest.raises(ram_wire.WireError, match="during the hello"):
        ram_wire.connect(first, "one", writer="node-a", timeout_s=5)
    with ram_wire.connect(first, "two", writer="node-a", timeout_s=5) as sock:
        ram_wire.send_frame(sock, copy_header(1, b"a", token="two"), b"a")
        assert ram_wire.read_ack(sock) is True
    assert h.stats("two")["copies"] == 1


def test_a_connection_made_before_the_token_was_replaced_ends_at_its_next_copy():
    h = holder(token="one")
    address = h.serve("one", host="127.0.0.1")
    with ram_wire.connect(address, "one", writer="node-a", timeout_s=5) as sock:
        h.serve("two", host="127.0.0.1", replaces="one")
        with pytest.raises(OSError):
            ram_wire.send_frame(sock, copy_header(1, b"a", token="one"), b"a")
            ram_wire.read_ack(sock)
    assert h.stats("two")["copies"] == 0


def test_garbage_is_not_a_frame():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        with pytest.raises(ram_wire.WireError, match="not a RAM-tier frame"):
            ram_wire.recv_frame(b, max_data=0)


def test_a_restore_reads_a_copy_over_the_wire_described_first_then_whole():
    """A restoring host asks the holder for a copy on an authenticated connection: first its
    description (layout, MAC, size, no bytes), then its bytes; an unknown copy is a KeyError
    and the connection goes on."""
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    data = bytes(range(256)) * 1000
    sent = copy_header(7, data)
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        ram_wire.send_frame(sock, sent, data)
        assert ram_wire.read_ack(sock)
    with ram_wire.connect(address, TOKEN, writer="restore-7", timeout_s=5) as sock:
        desc, nothing = ram_wire.read_copy(sock, incarnation=1, step=7, source=0, max_data=0,
                                           describe=True)
        assert (desc["step"], desc["nbytes"], nothing) == (7, len(data), bytearray())
        assert desc["mac"] == sent["mac"]
        with pytest.raises(KeyError, match="no copy of source 0 at step 8"):
            ram_wire.read_copy(sock, incarnation=1, step=8, source=0, max_data=len(data))
        got, body = ram_wire.read_copy(sock, incarnation=1, step=7, source=0,
                                       max_data=len(data))
        assert bytes(body) == data and got["mac"] == desc["mac"]


def test_a_restore_reads_only_the_pieces_it_needs_vouched_for_by_the_holder():
    """A restoring host asks for some pieces of a copy (those its shards overlap): the holder
    checks the whole copy's MAC, sends those pieces back to back under a MAC of its own over
    the copy's description, the indices and their bytes; the reader verifies it like a copy's.
    Indices out of order or range, and a damaged copy, send nothing."""
    from tests.workers.ram_testing import damage
    from workers.ram import auth as ram_auth
    from workers.ram import replica

    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    data = bytes(range(256)) * 64
    layout = {"leaves": [[[4096], "<f4"], [[8], "<f4"]],
              "pieces": [[0, [[0, 2048]], "<f4", [2048], 0, 8192],
                         [1, [[0, 8]], "<f4", [8], 8192, 32],
                         [0, [[2048, 4096]], "<f4", [2048], 8224, 8160]]}
    sent = copy_header(7, data, layout=layout)
    key = ram_auth.Keys.from_token(TOKEN).copy
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        ram_wire.send_frame(sock, sent, data)
        assert ram_wire.read_ack(sock)
    with ram_wire.connect(address, TOKEN, writer="restore-7", timeout_s=5) as sock:
        got, body = ram_wire.read_copy(sock, incarnation=1, step=7, source=0,
                                       max_data=len(data), pieces=[1, 2])
        assert bytes(body) == data[8192:]
        assert got["pieces"] == [1, 2] and got["nbytes"] == len(body)
        assert ram_auth.copy_intact(key, {**got, "data": body})
        assert not ram_auth.copy_intact(key, {**got, "data": body, "pieces": [0, 2]})
        assert not ram_auth.copy_intact(key, {**got, "data": body, "pieces": None})
        cut = replica.only_pieces(layout, got["pieces"])
        assert [p[4] for p in cut["pieces"]] == [0, 32]
        for bad in ([2, 1], [1, 1], [3], [], ["1"]):
            with pytest.raises(KeyError, match="ascending indices"):
                ram_wire.read_copy(sock, incarnation=1, step=7, source=0, max_data=len(data),
                                   pieces=bad)
        assert damage(h, step=7, source=0)
        with pytest.raises(KeyError, match="fails its authentication"):
            ram_wire.read_copy(sock, incarnation=1, step=7, source=0, max_data=len(data),
                               pieces=[1])


def test_a_holder_receives_a_writers_next_copy_into_its_evicted_buffer():
    """With keep=2 the third copy evicts the first: the fourth is received into the first's
    buffer (pages already touched), never into one a restore was handed."""
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        def send(step: int) -> None:
            data = bytes([step]) * 100_000
            ram_wire.send_frame(sock, copy_header(step, data), data)
            assert ram_wire.read_ack(sock)

        def buffer_of(step: int) -> bytearray:
            return next(c.data for c in h._store.all() if c.step == step)

        send(1)
        first = buffer_of(1)
        send(2)
        send(3)  # evicts step 1: its buffer is the spare
        send(4)
        assert buffer_of(4) is first
        h.get(TOKEN, incarnation=1, step=3, source=0)  # lent to a restore
        lent = buffer_of(3)
        send(5)  # evicts step 3, lent: not recycled
        send(6)
        assert buffer_of(6) is not lent
    assert [bytes(c.data[:1]) for c in sorted(h._store.all(), key=lambda c: c.step)] == \
        [b"\x05", b"\x06"]


def test_a_holder_drops_the_copies_of_older_incarnations_when_told():
    """Once a new group's copies are complete the driver has the holders forget the older
    incarnations' (at a GiB per host they ran the machine out of memory): its own writer's
    and other writers', never the new incarnation's."""
    from tests.workers.ram_testing import put

    h = holder()
    put(h, "node-a", 5, b"a" * 100, incarnation=1)
    put(h, "node-b", 5, b"b" * 100, incarnation=1)
    put(h, "node-c", 6, b"c" * 100, incarnation=2)
    assert h.drop_older(TOKEN, 2) == 200
    assert [(c["incarnation"], c["step"]) for c in h.inventory(TOKEN)] == [(2, 6)]
    assert h.drop_older(TOKEN, 2) == 0
