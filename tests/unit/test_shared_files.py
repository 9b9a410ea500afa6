"""``orchestrator.shared.files`` and ``host_env.free_port``: the one implementation of atomic
writes, JSON-lines reads and appends, and a free port, that every caller relies on."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from orchestrator.shared.files import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    jsonl_line,
    read_jsonl,
)
from orchestrator.shared.host_env import free_port


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    assert atomic_write_json(path, {"a": 1}, indent=2, fsync=True)
    assert json.loads(path.read_text()) == {"a": 1}
    assert atomic_write_text(path, "new\n") and path.read_text() == "new\n"
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_mode_is_set_at_creation(tmp_path):
    path = tmp_path / "secret"
    atomic_write_bytes(path, b"k", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_create_only_keeps_the_first_file(tmp_path):
    path = tmp_path / "key"
    assert atomic_write_text(path, "first", overwrite=False)
    assert not atomic_write_text(path, "second", overwrite=False)
    assert path.read_text() == "first" and os.listdir(tmp_path) == ["key"]


def test_failed_write_leaves_no_temp(tmp_path):
    with pytest.raises(IsADirectoryError):
        atomic_write_bytes(tmp_path, b"x")  # the target is a directory: replace fails
    assert os.listdir(tmp_path) == []


def test_read_jsonl_skips_torn_and_bad_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n[1]\nnot json\n{"a": 2}\n{"a": 3, "b"')
    skipped: list[int] = []
    assert list(read_jsonl(path, on_skip=lambda: skipped.append(1))) == [{"a": 1}, {"a": 2}]
    assert len(skipped) == 3
    with pytest.raises(ValueError, match="line 3"):
        list(read_jsonl(path, strict=True))
    assert list(read_jsonl(tmp_path / "missing.jsonl")) == []


def test_read_jsonl_tail_drops_only_a_cut_first_line(tmp_path):
    path = tmp_path / "x.jsonl"
    lines = [jsonl_line({"i": i}) for i in range(10)]
    path.write_text("".join(lines))
    size = path.stat().st_size
    whole = len(lines[-1]) * 2  # exactly the last two lines
    assert [r["i"] for r in read_jsonl(path, tail_bytes=whole)] == [8, 9]
    assert [r["i"] for r in read_jsonl(path, tail_bytes=whole + 3)] == [8, 9]  # 7 is cut
    assert len(list(read_jsonl(path, tail_bytes=size * 2))) == 10


def test_append_jsonl(tmp_path):
    path = tmp_path / "log.jsonl"
    n = append_jsonl(path, {"b": 1, "a": 2}, sort_keys=True)
    append_jsonl(path, jsonl_line({"c": 3}), fsync=True)
    assert path.read_text() == '{"a": 2, "b": 1}\n{"c": 3}\n' and n == len('{"a": 2, "b": 1}\n')
    with pytest.raises(ValueError):
        jsonl_line({"a": 1}, indent=2)


def test_free_port_on_loopback_and_preferred():
    port = free_port("127.0.0.1")
    assert 0 < port < 65536
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert free_port("127.0.0.1", preferred=taken) != taken  # taken: any other
    assert free_port("127.0.0.1", preferred=port) == port  # free again: the preferred one
    assert free_port() > 0  # every interface, for a coordinator other hosts reach
