"""The RAM tier's boundary, attacked from outside: a live holder server on 127.0.0.1 (no Ray)
gets oversized lengths before authentication, malformed frames, wrong secrets, idle and slow
connections, more connections than it takes, copies that try to choose paths or another writer,
and forged copies; it refuses each, keeps serving an honest host, and that host's copies stay
intact. The restoring host refuses a forged copy before any byte of it is used."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import socket
import struct
import threading
import time
import tracemalloc

import pytest

from orchestrator.raygroup.ram_holders import SECRET_FILE, run_secret
from tests.workers.ram_testing import TOKEN, copy_header, damage, holder, put
from workers.host.ram import RamTier
from workers.ram import auth as ram_auth
from workers.ram import copy_store, replicator
from workers.ram import wire as ram_wire
from workers.ram.holder import RamHolder

HEAD = struct.Struct("!4sIQ")


def _frame(header: bytes, data_len: int = 0) -> bytes:
    return HEAD.pack(ram_wire.MAGIC, len(header), data_len) + header


class _Packer:
    """Stands in for ``replica.Packer``: the state is the bytes."""

    def __init__(self, state: bytes) -> None:
        self.nbytes = len(state)

    def pack(self, state: bytes) -> tuple[dict, bytearray]:
        return {"leaves": [], "pieces": []}, bytearray(state)

    def release(self, data: bytearray) -> None:
        """Nothing to reuse: every pack is new bytes."""


def _raw(address: tuple[str, int], timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(address, timeout=timeout_s)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the holder closes ``sock`` within ``seconds`` (whatever it sent first)."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _honest_round(address: tuple[str, int], step: int, data: bytes,
                  writer: str = "honest") -> bool:
    with ram_wire.connect(address, TOKEN, writer=writer, timeout_s=5) as sock:
        ram_wire.send_frame(sock, copy_header(step, data), data)
        return ram_wire.read_ack(sock)


def _assert_honest_intact(h: RamHolder, steps: dict[int, bytes]) -> None:
    inventory = h.inventory(TOKEN)
    assert sorted(c["step"] for c in inventory) == sorted(steps)
    assert all(c["intact"] for c in inventory), inventory
    for step, data in steps.items():
        assert h.get(TOKEN, incarnation=1, step=step, source=0)["data"] == data


# ---- before authentication -------------------------------------------------------------------

def test_an_oversized_length_before_auth_allocates_nothing_and_is_closed():
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    body = json.dumps({"token": TOKEN}).encode()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with _raw(address) as sock:
            # a small, well-formed header, then a claim of 64 MiB of data (the old holder
            # allocated what the first frame claimed, before it checked anything)
            sock.sendall(HEAD.pack(ram_wire.MAGIC, len(body), 64 * 1024**2) + body)
            assert _closed_within(sock, 3.0), "the holder kept reading an oversized hello"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024**2, f"{peak} bytes allocated for a frame claiming 64 MiB"
    assert h.stats(TOKEN)["refused"]["hello"] == 1
    assert _honest_round(address, 1, b"x" * 1000)


@pytest.mark.parametrize("frame", [
    HEAD.pack(ram_wire.MAGIC, 2**31, 0),                   # header far past the hello bound
    _frame(b'{"writer": "n", "proof": "00"}', 2**63),      # data claimed in a hello
    HEAD.pack(b"HTTP", 10, 0) + b"0123456789",             # not our magic
    _frame(b"\xff\xfe{{{"),                                # header not JSON
    _frame(b"[]"),                                         # header not an object
    _frame(json.dumps({"token": TOKEN}).encode()),         # the old clear-text token
    _frame(b'{"writer": "n"}'),                            # no proof
    _frame(b'{"writer": "n", "proof": "' + b"0" * 64 + b'"}'),  # a wrong proof
], ids=["huge-header", "hello-with-data", "magic", "not-json", "not-object", "clear-token",
        "no-proof", "wrong-proof"])
def test_a_malformed_hello_is_closed_and_the_holder_keeps_serving(frame):
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with _raw(address) as sock:
        sock.sendall(frame)
        assert _closed_within(sock, 3.0)
    assert h.stats(TOKEN)["copies"] == 0
    assert _honest_round(address, 1, b"y" * 100)
    _assert_honest_intact(h, {1: b"y" * 100})


def test_a_wrong_secret_is_refused_and_never_crosses_the_wire(monkeypatch):
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with pytest.raises(ram_wire.WireError, match="during the hello"):
        ram_wire.connect(address, "not-the-secret", writer="mallory", timeout_s=5)
    # what an eavesdropper sees of an honest hello: a proof bound to a fresh nonce
    seen: list[bytes] = []
    real_send = ram_wire.send_frame

    def spy(sock, header, data=b""):
        seen.append(json.dumps(header).encode())
        real_send(sock, header, data)

    monkeypatch.setattr(ram_wire, "send_frame", spy)
    ram_wire.connect(address, TOKEN, writer="honest", timeout_s=5).close()
    ram_wire.connect(address, TOKEN, writer="honest", timeout_s=5).close()
    assert len(seen) == 2 and all(TOKEN.encode() not in s for s in seen)
    assert seen[0] != seen[1], "the same hello twice: a recorded one could be replayed"
    assert h.stats(TOKEN)["refused"]["hello"] == 1


def test_an_idle_or_slow_connection_before_auth_is_closed():
    h = holder(hello_timeout_s=0.5)
    address = h.serve(TOKEN, host="127.0.0.1")
    with _raw(address, timeout_s=5) as idle:
        assert _closed_within(idle, 3.0), "an idle unauthenticated connection stayed open"
    with _raw(address, timeout_s=5) as slow:
        slow.recv(len(ram_wire.CHALLENGE) + ram_wire.NONCE_BYTES)
        start = time.monotonic()
        head = HEAD.pack(ram_wire.MAGIC, 100, 0)
        try:
            for b in head + b" " * 100:  # one byte per 0.1 s: each read is quick, the whole not
                slow.sendall(bytes([b]))
                time.sleep(0.1)
        except OSError:
            pass
        assert _closed_within(slow, 3.0)
        assert time.monotonic() - start < 3.0
    assert _honest_round(address, 1, b"z" * 10)


def test_more_connections_than_the_cap_are_closed_at_once_and_slots_come_back():
    h = holder(max_connections=2, hello_timeout_s=30)
    address = h.serve(TOKEN, host="127.0.0.1")
    squatters = [_raw(address), _raw(address)]
    try:
        for s in squatters:  # both hold a slot (the challenge came; an old holder sent none)
            s.settimeout(1.0)
            with contextlib.suppress(TimeoutError):
                s.recv(64)
        with _raw(address) as third:
            assert _closed_within(third, 3.0), "a connection past the cap was served"
        assert h.stats(TOKEN)["refused"]["busy"] >= 1
    finally:
        for s in squatters:
            s.close()
    deadline = time.monotonic() + 5
    while True:  # the squatters' threads see the close and give their slots back
        try:
            assert _honest_round(address, 1, b"w" * 10)
            break
        except OSError:
            assert time.monotonic() < deadline, "the slots never came back"
            time.sleep(0.05)
    _assert_honest_intact(h, {1: b"w" * 10})


# ---- after authentication --------------------------------------------------------------------

def test_an_authenticated_frame_past_the_expected_copy_size_is_refused():
    h = holder(max_copy_bytes=4096)
    address = h.serve(TOKEN, host="127.0.0.1")
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        header = json.dumps(copy_header(1, b"")).encode()
        sock.sendall(HEAD.pack(ram_wire.MAGIC, len(header), 2**40) + header)
        assert _closed_within(sock, 3.0)
    assert h.stats(TOKEN)["refused"]["frame"] == 1
    assert _honest_round(address, 2, b"v" * 4096)
    _assert_honest_intact(h, {2: b"v" * 4096})


@pytest.mark.parametrize("change", [
    {"step": "3"}, {"step": True}, {"source": 1}, {"sources": 0}, {"layout": []},
    {"mac": 7}, {"persist": "yes"}, {"incarnation": -1},
], ids=lambda c: next(iter(c)))
def test_a_malformed_copy_is_refused_and_the_connection_goes_on(change):
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        ram_wire.send_frame(sock, {**copy_header(3, b"bad"), **change}, b"bad")
        assert ram_wire.read_ack(sock) is False
        ram_wire.send_frame(sock, copy_header(4, b"good"), b"good")
        assert ram_wire.read_ack(sock) is True
    assert [c["step"] for c in h.inventory(TOKEN)] == [4]


def test_a_copy_cannot_choose_where_durable_copies_go(tmp_path):
    h = holder()
    address = h.serve(TOKEN, host="127.0.0.1")
    elsewhere = tmp_path / "elsewhere"
    with ram_wire.connect(address, TOKEN, writer="node-a", timeout_s=5) as sock:
        persist = {"directory": str(elsewhere), "keep_steps": 0}
        ram_wire.send_frame(sock, {**copy_header(1, b"d"), "persist": persist}, b"d")
        assert ram_wire.read_ack(sock) is False
    assert h.persist_status(TOKEN) == {"pending": 0, "saved": [], "errors": []}
    assert h._store.durable is None and not elsewhere.exists()


def test_the_writer_is_the_authenticated_peer_not_the_frame():
    h = holder(keep=2)
    for step in (1, 2):
        put(h, "node-b", step, b"b" * 10)
    with ram_wire.connect(h.serve(TOKEN, host="127.0.0.1"), TOKEN, writer="node-a",
                          timeout_s=5) as sock:
        # node-a's connection tries to push node-b's copies out
        ram_wire.send_frame(sock, {**copy_header(3, b"a"), "writer": "node-b"}, b"a")
        assert ram_wire.read_ack(sock) is False
        ram_wire.send_frame(sock, copy_header(4, b"a"), b"a")  # its own: kept as node-a's
        assert ram_wire.read_ack(sock) is True
    assert sorted(c["step"] for c in h.inventory(TOKEN)) == [1, 2, 4]


def test_prune_leaves_step_folders_it_did_not_write(tmp_path):
    root = tmp_path / "checkpoints"
    orbax_step = root / "5"  # an Orbax step where a copies directory was expected
    (orbax_step / "state").mkdir(parents=True)
    (orbax_step / "_CHECKPOINT_METADATA").write_text("{}")
    for step in (6, 7):
        (root / str(step) / "source-0").mkdir(parents=True)
        (root / str(step) / copy_store.COMPLETE).write_text('{"sources": 1}')
    (root / "3" / "source-0.orbax-checkpoint-tmp-12").mkdir(parents=True)  # ours, incomplete
    assert copy_store.prune(root, keep=1) == [3, 6]
    assert (orbax_step / "_CHECKPOINT_METADATA").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["5", "7"]


def test_the_driver_keeps_the_runs_secret_owner_only_and_a_fresh_run_gets_a_new_one(tmp_path):
    token, made = run_secret(tmp_path)
    assert made and len(token) == 64
    assert oct((tmp_path / SECRET_FILE).stat().st_mode & 0o777) == "0o600"
    assert run_secret(tmp_path) == (token, False), "a later driver of the run reads it back"
    fresh, made = run_secret(tmp_path, fresh=True)
    assert made and fresh != token


# ---- Ray methods and end-to-end authentication -----------------------------------------------

def test_every_method_ray_can_call_is_known_and_moving_copies_needs_the_token():
    callable_by_ray = {n for n, _ in inspect.getmembers(RamHolder, inspect.isfunction)}
    assert callable_by_ray == {"__init__", "_check", "prove", "serve", "put", "get",
                               "inventory", "persist_status", "flush", "stats",
                               "drop_older"}, (
        "no test hooks, no bypass")
    h = holder()
    put(h, "node-a", 1, b"secret bytes")
    with pytest.raises(PermissionError):
        h.get("guess", incarnation=1, step=1, source=0)
    with pytest.raises(PermissionError):
        put(h, "node-a", 2, b"x", token="guess")
    with pytest.raises(PermissionError):
        h.serve("guess", host="127.0.0.1")
    with pytest.raises(PermissionError):
        h.serve("mine", host="127.0.0.1", replaces="guess")
    assert h.get(TOKEN, incarnation=1, step=1, source=0)["data"] == b"secret bytes"


def test_what_a_holder_keeps_and_does_is_told_only_to_the_token(tmp_path):
    """Issue 49: ``inventory``, ``stats``, ``persist_status`` and ``flush`` answered anyone
    with a Ray handle (which steps and sources a run holds, its sizes, its durable saves)."""
    h = holder(persist_dir=str(tmp_path))
    put(h, "node-a", 1, b"secret bytes")
    for call in (lambda t: h.inventory(t), lambda t: h.stats(t),
                 lambda t: h.persist_status(t), lambda t: h.flush(t, 0.1),
                 lambda t: h.drop_older(t, 0)):
        with pytest.raises(PermissionError):
            call("guess")
        call(TOKEN)
    assert [c["step"] for c in h.inventory(TOKEN)] == [1]


def test_a_holder_proves_it_has_the_token_without_giving_it_away():
    """``prove`` is the one call without the token: its answer is an HMAC under a key of its
    own, bound to the driver's nonce and the holder's name (outside Ray: none)."""
    nonce = "n" * 32
    answer = holder().prove(nonce)
    assert answer == ram_auth.holder_proof(TOKEN, nonce, "")
    assert TOKEN not in answer
    assert answer != holder(token="another run").prove(nonce)
    assert answer != ram_auth.holder_proof(TOKEN, nonce, "ram-run-other-node")
    assert answer != ram_auth.holder_proof(TOKEN, "m" * 32, "")
    for bad in ("short", "x" * 129, None):
        with pytest.raises(ValueError):
            holder().prove(bad)


class _Trainer:
    """Records what a restore would use."""

    def __init__(self) -> None:
        self.used: list[list[tuple[dict, bytes]]] = []
        self.step = 0
        self.data_resumed: dict | None = None

    def restore_from_copies(self, step: int, copies: list[tuple[dict, bytes]], *,
                            sources: list[int] | None = None, tier: str = "ram",
                            layouts: dict[int, dict] | None = None) -> None:
        self.used.append([(layout, bytes(data)) for layout, data in copies])
        self.step = step


def test_a_forged_copy_is_refused_by_the_restoring_host_before_any_byte_is_used():
    h = holder()
    put(h, "node-a", 1, b"honest state")
    forged = {**h.get(TOKEN, incarnation=1, step=1, source=0), "data": b"forged state"}
    foreign = copy_header(1, b"another run's", token="another-run")
    foreign = {**foreign, "data": b"another run's"}
    trainer = _Trainer()
    host = RamTier(trainer=lambda what: trainer)
    for bad in (forged, foreign):
        out = host.restore_copies(1, {"node-a": bad}, TOKEN)
        assert out["ok"] is False and "fails its authentication" in out["reason"], out
    replayed = host.restore_copies(2, {"node-a": h.get(TOKEN, incarnation=1, step=1,
                                                       source=0)}, TOKEN)
    assert replayed["ok"] is False and "not 2" in replayed["reason"]
    damage(h, step=1, source=0)  # rot (or a tampering holder) after the copy arrived
    assert [c["intact"] for c in h.inventory(TOKEN)] == [False]
    assert host.restore_copies(1, {"node-a": h.get(TOKEN, incarnation=1, step=1, source=0)},
                               TOKEN)["ok"] is False
    assert trainer.used == [], "a refused copy's bytes reached the trainer"
    put(h, "node-a", 3, b"honest state")
    assert host.restore_copies(3, {"node-a": h.get(TOKEN, incarnation=1, step=3, source=0)},
                               TOKEN)["ok"] is True
    assert trainer.used == [[({"leaves": [], "pieces": []}, b"honest state")]]


# ---- all of it at once, beside an honest host ------------------------------------------------

def test_an_honest_host_streams_through_every_attack_and_its_copies_stay_intact(monkeypatch):
    monkeypatch.setattr(replicator.replica, "Packer", _Packer)
    h = holder(keep=2, max_connections=8, hello_timeout_s=0.5, idle_timeout_s=0.5,
               max_copy_bytes=1 << 20)
    address = h.serve(TOKEN, host="127.0.0.1")
    rep = replicator.Replicator([("own", address)], token=TOKEN, writer="honest",
                                incarnation=1, source=0, sources=1, every=1, keep=2,
                                max_host_bytes=1 << 22)
    stop = threading.Event()

    def attack() -> None:
        while not stop.is_set():
            for payload in (HEAD.pack(ram_wire.MAGIC, 40, 2**40), b"GET / HTTP/1.1\r\n\r\n",
                            os.urandom(64), b""):
                try:
                    with _raw(address, timeout_s=1) as s:
                        s.sendall(payload)
                        _closed_within(s, 1.0)
                except OSError:
                    pass

    attackers = [threading.Thread(target=attack, daemon=True) for _ in range(3)]
    for t in attackers:
        t.start()
    try:
        sent = {}
        for step in range(1, 7):
            sent[step] = bytes([step]) * 300_000
            rep.after_step(step, sent[step])
            assert rep.settle(10.0)
            if step == 3:
                time.sleep(1.0)  # past the idle timeout: the holder closes, the host reconnects
    finally:
        stop.set()
        for t in attackers:
            t.join(5)
        rep.close()
    assert rep.stats.dropped == [] and rep.stats.sent == 6
    _assert_honest_intact(h, {5: sent[5], 6: sent[6]})
    assert sum(h.stats(TOKEN)["refused"].values()) > 0

