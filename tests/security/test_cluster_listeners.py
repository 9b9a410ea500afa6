"""Every listener of the local cluster is on loopback (issue 49, finding 5), not just the JAX
coordinator (``test_local_listeners.py``): an emulated cluster of two 1-host slices forms a group
through the orchestrator's real path with the RAM tier on (the hosts join JAX, the holders serve
copies), and while that group is still up, after its final save, every listening TCP socket of
the cluster's processes (the GCS, raylets, agents, workers, host actors, RAM holders: those
carrying the cluster's mark, and their descendants) and of the driver is read from the kernel.
Each must be bound to 127.0.0.1 or ::1, never 0.0.0.0 or ::. Real Ray, JAX and holders."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import psutil
import pytest

from orchestrator.controller import RunListener
from orchestrator.controller.wiring import from_config
from orchestrator.raygroup import reaper
from tests.faults.harness import fault_config, run_controller, started_cluster
from tests.support.ray_cluster import RunningCluster

pytestmark = pytest.mark.cluster

TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
              "cluster.emulate.devices_per_host=2")
RAM = ("checkpoint.ram.enabled=true", "checkpoint.ram.every=1")
SHORT = ("run.total_steps=2", "run.steps_per_call=1",
         "controller.checkpoint_interval.every_steps=2")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=2, hosts_per_slice=1, devices_per_host=2) as running:
        yield running


def _listeners(pids: list[int]) -> list[dict]:
    """Each listening TCP socket of ``pids``: pid, process title, address, port."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            title = " ".join(" ".join([proc.name(), *proc.cmdline()]).split())[:160]
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        out += [{"pid": pid, "title": title, "ip": c.laddr.ip, "port": c.laddr.port}
                for c in conns if c.status == psutil.CONN_LISTEN]
    return out


class _Snapshot(RunListener):
    """What listens while the final group is up (its hosts joined, its holders serving)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.found: list[dict] | None = None

    def on_final_group(self, group) -> None:
        self.found = _listeners([os.getpid(), *reaper.cluster(self.marker)])


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


def test_every_listener_of_a_running_local_cluster_is_on_loopback(cluster, tmp_path):
    cfg = fault_config(tmp_path / "run", *TWO_SLICES, *RAM, *SHORT)
    snap = _Snapshot(cluster.emulated.reaper.marker)
    result = run_controller(cfg, listeners=[*from_config(cfg).listeners, snap], timeout_s=180)
    assert result.summary.state == "SUCCEEDED", result.summary
    found = snap.found
    assert found, "nothing was seen listening while the final group was up"
    # what the snapshot must include, else it proves nothing: Ray's daemons, both hosts (the
    # coordinator and gloo), the RAM holders' wire servers, the driver's own core worker
    titles = " ".join(f["title"] for f in found)
    for daemon in ("gcs_server", "raylet", "ray::RamHolder"):
        assert daemon in titles, f"no {daemon} listening among {sorted({*titles.split()})}"
    listening = {f["pid"] for f in found}
    assert set(result.host_pids) <= listening, (result.host_pids, found)
    assert os.getpid() in listening
    off = [f for f in found if not _loopback(f["ip"])]
    seen = sorted({(f["title"].split()[0], f["ip"]) for f in found})
    assert off == [], (f"listening off loopback (of {len(found)} listeners, {seen}):\n"
                       + "\n".join(map(str, off)))
