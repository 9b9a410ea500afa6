"""`python -m orchestrator.cluster` without starting Ray: bad input, no cluster, the exports."""

from __future__ import annotations

import json

import pytest

from orchestrator.cluster.__main__ import main
from orchestrator.cluster.nodes import Shape, host_args, host_labels, host_resources


def test_bad_shape_is_refused_before_anything_starts(tmp_path, capsys):
    """--slices 0: exit 2 naming the flag; no state written."""
    assert main(["--state-dir", str(tmp_path), "up", "--slices", "0"]) == 2
    assert "--slices must be a whole number >= 1" in capsys.readouterr().err
    assert not (tmp_path / "cluster.json").exists()


def test_status_and_env_without_a_cluster_say_how_to_start_one(tmp_path, capsys):
    """No state: exit 2 and the `up` command; `down` is a no-op."""
    assert main(["--state-dir", str(tmp_path), "status"]) == 2
    assert "python -m orchestrator.cluster up" in capsys.readouterr().err
    assert main(["--state-dir", str(tmp_path), "down"]) == 0
    assert "no local cluster" in capsys.readouterr().out


def test_env_prints_token_auth_exports(tmp_path, capsys):
    """What `eval "$(... env)"` sets: the job API URL, token mode, the token file."""
    (tmp_path / "cluster.json").write_text(json.dumps({
        "url": "http://127.0.0.1:8265", "gcs_address": "127.0.0.1:6380", "temp_dir": "/tmp/x",
        "token_path": str(tmp_path / "auth_token"), "auth": True, "shape": {}, "nodes": []}))
    assert main(["--state-dir", str(tmp_path), "env"]) == 0
    assert capsys.readouterr().out.split() == [
        "export", "RAY_ADDRESS=http://127.0.0.1:8265", "RAY_AUTH_MODE=token",
        f"RAY_AUTH_TOKEN_PATH={tmp_path / 'auth_token'}"]


def test_up_refuses_while_a_cluster_is_recorded(tmp_path, capsys):
    """A second `up` on the same state dir would orphan the first: refused with `down`."""
    (tmp_path / "cluster.json").write_text(json.dumps({
        "url": "http://127.0.0.1:8265", "gcs_address": "", "temp_dir": "/tmp/x",
        "token_path": "", "auth": False, "shape": {}, "nodes": []}))
    assert main(["--state-dir", str(tmp_path), "up"]) == 2
    assert "orchestrator.cluster down" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("worker", [0, 1])
def test_hosts_look_like_tpu_vms(worker):
    """Labels and resources of a real TPU host; the head marker resource only on worker 0."""
    labels = host_labels("s-0", worker, hosts=2, devices=4)
    assert labels["ray.io/tpu-slice-name"] == "s-0"
    assert labels["ray.io/tpu-worker-id"] == str(worker)
    assert labels["ray.io/tpu-topology"] == "2x4"
    assert ("TPU-cpu-emu-8-head" in host_resources(worker, hosts=2, devices=4)) == (worker == 0)
    args = host_args("s-0", worker, Shape(slices=1, hosts_per_slice=2, devices_per_host=4),
                     gcs_address="127.0.0.1:1", agent_port=2, temp_dir="/tmp/t")
    assert "--node-ip-address=127.0.0.1" in args
    assert any(a.startswith("--labels=ray.io/tpu-slice-name=s-0,") for a in args)


def test_node_env_drops_what_stops_a_host_joining(tmp_path, monkeypatch):
    """An in-process emulated cluster sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 to stay on
    loopback; a host started with it refuses to join (`ray start --address` aborts)."""
    from orchestrator.cluster.local import ClusterState, _node_env

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_ADDRESS", "http://elsewhere:8265")
    state = ClusterState(url="", gcs_address="", temp_dir=str(tmp_path),
                         token_path=str(tmp_path / "t"), auth=True, shape={})
    env = _node_env(state)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env and "RAY_ADDRESS" not in env
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "t")


# ---- the token file (issue 29, item 9): never written through a link or into an open file ------

class _NoRay(Exception):
    """Raised where `up` would start the head: these tests stop before Ray."""


def _up_until_the_head(tmp_path, monkeypatch):
    """Run `up` to the point where it would start Ray; what it raised (or _NoRay)."""
    import shutil

    from orchestrator.cluster import local

    def no_head(state, state_dir, port):
        shutil.rmtree(state.temp_dir, ignore_errors=True)
        raise _NoRay

    monkeypatch.setattr(local, "_start_head", no_head)
    with pytest.raises((_NoRay, local.LocalClusterError)) as info:
        local.up(Shape(slices=1, hosts_per_slice=1, devices_per_host=1), state_dir=tmp_path)
    return info.value


def test_up_never_writes_the_token_through_a_symlink(tmp_path, monkeypatch):
    """auth_token is a link to another file: refused naming the fix; the target is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    (tmp_path / "auth_token").symlink_to(victim)
    err = _up_until_the_head(tmp_path, monkeypatch)
    assert "is a symbolic link" in str(err) and f"remove {tmp_path / 'auth_token'}" in err.fix
    assert victim.read_text() == "someone else's file\n"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_up_refuses_an_existing_token_file_others_can_read(tmp_path, monkeypatch, mode):
    """A token file left with a wider mode keeps it: refused, nothing written into it."""
    import os

    token = tmp_path / "auth_token"
    token.write_text("old\n")
    os.chmod(token, mode)
    err = _up_until_the_head(tmp_path, monkeypatch)
    assert f"has mode {mode:04o}, not 0600" in str(err)
    assert token.read_text() == "old\n" and (token.stat().st_mode & 0o777) == mode


def test_up_writes_a_fresh_token_0600_whatever_the_umask(tmp_path, monkeypatch):
    """No file: created exclusively with mode 0600 (umask 0 does not widen it); an own 0600
    file from a crashed `up` gets a new token."""
    import os

    old = os.umask(0)
    try:
        assert isinstance(_up_until_the_head(tmp_path, monkeypatch), _NoRay)
    finally:
        os.umask(old)
    token = tmp_path / "auth_token"
    first = token.read_text()
    assert (token.stat().st_mode & 0o777) == 0o600 and len(first.strip()) == 64
    assert isinstance(_up_until_the_head(tmp_path, monkeypatch), _NoRay)
    assert token.read_text() != first and (token.stat().st_mode & 0o777) == 0o600
