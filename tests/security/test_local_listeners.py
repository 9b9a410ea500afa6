"""The local (emulated) cluster lives on loopback, so must every listener of its JAX groups
(issue 49, finding 5): JAX's coordinator listened on every interface, and a client from the
machine's external address joined a group as process 1 and killed the real one. A real
one-process group is joined through ``JaxRuntime.join`` as a host joins it; its listening
sockets are read back from the kernel and its coordinator's port is dialled at every
non-loopback address of this machine. On GKE nothing changes (``deploy/README.md``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.nodes import LOOPBACK as LOCAL_CLUSTER_IP
from orchestrator.raygroup.topology import LOOPBACK as EMULATED_IP
from orchestrator.shared.host_env import coordinator_bind, free_port, loopback_host

ROOT = Path(__file__).resolve().parents[2]

_MEMBER = r"""
import ipaddress, json, socket, sys
import psutil
from workers.host.warm import JaxRuntime

port = int(sys.argv[1])
JaxRuntime().join(f"127.0.0.1:{port}", 1, 0, survive_peers=False, init_timeout_s=60,
                  heartbeat_s=10)


def ip(text):
    addr = ipaddress.ip_address(text.split("%")[0])
    return getattr(addr, "ipv4_mapped", None) or addr


listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
                    if c.status == psutil.CONN_LISTEN})
external = sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                   if a.family in (socket.AF_INET, socket.AF_INET6)
                   and not ip(a.address).is_loopback and not ip(a.address).is_link_local})
reached = []
for address in external:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.settimeout(2)
        if s.connect_ex((address, port)) == 0:
            reached.append(address)
print("RESULT " + json.dumps({"listening": listening, "off_loopback": [
    a for a in listening if not ip(a).is_loopback], "external": external, "reached": reached}),
    flush=True)
import jax
jax.distributed.shutdown()
"""

_HOSTS_SWAP = """mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@" """


def _join_alone(prefix: list[str] | None = None) -> dict:
    """Join a one-process group on a loopback coordinator in a fresh process; what listens."""
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.run([*(prefix or []), sys.executable, "-c", _MEMBER, str(port)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def _external_address() -> str | None:
    """One non-loopback IPv4 address of this machine (no packet is sent)."""
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_the_local_clusters_coordinator_binds_where_it_is_reached():
    """Both local clusters put every node on loopback; a host builds its coordinator's address
    from its node's ip (``HostActor.coordinator_address``)."""
    for node_ip in (EMULATED_IP, LOCAL_CLUSTER_IP):
        assert coordinator_bind(f"{node_ip}:8476") == f"{node_ip}:8476"
        assert loopback_host(f"{node_ip}:8476") == node_ip
    assert coordinator_bind("[::1]:8476") == "[::1]:8476"
    assert coordinator_bind("localhost:8476") == "localhost:8476"
    # a real cluster's hosts reach process 0 from other machines: JAX's default, every interface
    for remote in ("10.0.0.2:8476", "[fd00::2]:8476", "tpu-host-0:8476"):
        assert coordinator_bind(remote) is None
        assert loopback_host(remote) is None


def test_a_loopback_group_listens_on_loopback_only_and_is_unreachable_from_outside():
    got = _join_alone()
    assert got["listening"], got  # the coordinator at least
    assert got["off_loopback"] == [], got
    assert got["reached"] == [], f"the coordinator answered at {got['reached']}"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare (a host name resolving off loopback)")
def test_gloo_stays_on_loopback_when_the_host_name_resolves_to_an_external_address(tmp_path):
    """On a cloud VM the host name resolves to the VM's external address, where gloo (the CPU
    backend's collectives) listened; here a private mount and UTS namespace make it so."""
    external = _external_address()
    if external is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{external} emulated-vm\n")
    got = _join_alone(["unshare", "-m", "-u", "sh", "-c", _HOSTS_SWAP, "sh", str(hosts),
                       "emulated-vm"])
    assert got["off_loopback"] == [], got
    assert got["reached"] == [], got
