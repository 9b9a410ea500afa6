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
