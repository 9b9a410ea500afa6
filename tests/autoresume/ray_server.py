"""A real local Ray cluster with the job server, for autoresume tests.

`ray start --head` (loopback, job API on a free port) and, optionally, worker nodes joined with
`ray start --address=<head>` that carry the resources and labels of TPU hosts, marked emulated
(see orchestrator/raygroup/topology.py: the driver then gives each host actor D CPU devices). A job
submitted here runs with RAY_ADDRESS set by Ray and finds those hosts in the SAME cluster
(cluster.mode=auto), exactly as a driver on a real TPU cluster finds its TPU nodes.

Token auth is ON, as Ray 2.60 and production run it: a fresh token in the cluster's temp dir is
given to every node (RAY_AUTH_TOKEN_PATH); clients send it (`RayCluster.headers()`, autoresume's
`ray.token_file`). Labels and resources come from `orchestrator.cluster.nodes`, the same code as
`python -m orchestrator.cluster up`.

Teardown never uses `ray stop`: that would kill other Ray clusters on this shared machine. Every
node runs `--block` in its own process group; we kill those groups, then whatever process still
names our temp dir.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from orchestrator.cluster.local import ClusterState, _node_env, free_port
from orchestrator.cluster.nodes import host_labels, host_resources
from orchestrator.raygroup.topology import INSTANCE_LABEL

READY_TIMEOUT_S = 90.0
START_ATTEMPTS = 3
STARTED = "Ray runtime started."
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class TpuSlices:
    """Emulated TPU slices to join to the head: `slices` x `hosts_per_slice` worker nodes."""

    slices: int = 1
    hosts_per_slice: int = 2
    devices_per_host: int = 2
    name_prefix: str = "e2e-slice"


@dataclass(frozen=True, kw_only=True)
class RayCluster:
    """Addresses of a running local cluster."""

    url: str  # job API / dashboard
    gcs_address: str  # what `ray start --address` and ray.init take
    temp_dir: str
    token_path: str  # the cluster's auth token (RAY_AUTH_TOKEN_PATH of every node)

    def headers(self) -> dict[str, str]:
        """What a job API client sends (JobSubmissionClient(url, headers=...))."""
        return _auth(self.token_path)


def _auth(token_path: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {Path(token_path).read_text().strip()}"}


def _ray_env(token_path: Path) -> dict[str, str]:
    """The same node environment as ``python -m orchestrator.cluster up`` with token auth: this
    venv's `python` first on PATH (jobs run it), and nothing inherited that stops a host joining
    (an earlier in-process emulated cluster leaves RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 behind)."""
    state = ClusterState(url="", gcs_address="", temp_dir=str(token_path.parent),
                         token_path=str(token_path), auth=True, shape={})
    return _node_env(state)


def _launch(args: list[str], log: IO[bytes], temp_dir: Path) -> subprocess.Popen[bytes]:
    ray_bin = str(Path(sys.executable).parent / "ray")
    return subprocess.Popen([ray_bin, "start", "--block", *args], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_ray_env(temp_dir / "auth_token"), start_new_session=True)


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 2, *, tpu: TpuSlices | None = None) -> Iterator[RayCluster]:
    """A fresh head (token auth on) and, with `tpu`, emulated TPU worker nodes; yields once the
    job API answers and every TPU node is registered."""
    temp_dir = Path(tempfile.mkdtemp(prefix="arr-", dir="/tmp"))
    token_path = temp_dir / "auth_token"
    token_path.write_text(secrets.token_hex(32) + "\n")
    token_path.chmod(0o600)
    logs: list[IO[bytes]] = []
    procs: list[subprocess.Popen[bytes]] = []
    gcs = ""
    try:
        url, gcs = _start_head(num_cpus, procs, logs, temp_dir)
        if tpu is not None:
            for s in range(tpu.slices):
                for w in range(tpu.hosts_per_slice):
                    _join_tpu_host(f"{tpu.name_prefix}-{s}", w, tpu, gcs, url, procs, logs,
                                   temp_dir)
            _wait_tpu_nodes(url, tpu.slices * tpu.hosts_per_slice, procs, temp_dir)
        yield RayCluster(url=url, gcs_address=gcs, temp_dir=str(temp_dir),
                         token_path=str(token_path))
    finally:
        _kill_all(procs, str(temp_dir), gcs)
        for log in logs:
            log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _json(value: dict[str, int]) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def _check_alive(procs: list[subprocess.Popen[bytes]], temp_dir: Path) -> None:
    for p in procs:
        if p.poll() is not None:
            tails = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                              for f in sorted(temp_dir.glob("*.log")))
            raise RuntimeError(f"`ray start` exited with {p.returncode}:\n{tails}")


def _start_head(num_cpus: int, procs: list[subprocess.Popen[bytes]], logs: list[IO[bytes]],
                temp_dir: Path) -> tuple[str, str]:
    """`ray start --head`; returns (job API URL, GCS address) once the node has started and the
    job API answers. Under heavy load Ray's own fixed startup timeouts can fail a start (the
    head raylet aborts when its Python agent is slow): such an attempt is killed and retried."""
    for attempt in range(START_ATTEMPTS):
        dash, gcs_port = free_port(), free_port()
        logs.append(open(temp_dir / f"head-{attempt}.log", "wb"))  # noqa: SIM115
        proc = _launch(
            ["--head", f"--port={gcs_port}", f"--node-ip-address={LOOPBACK}",
             f"--dashboard-port={dash}", f"--dashboard-host={LOOPBACK}",
             "--include-dashboard=true", f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", f"--num-cpus={num_cpus}",
             "--num-gpus=0", f"--object-store-memory={150 * 1024 * 1024}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats"], logs[-1], temp_dir)
        url = f"http://{LOOPBACK}:{dash}"
        if _started(proc, temp_dir / f"head-{attempt}.log") and _api_up(url, proc, temp_dir):
            procs.append(proc)
            return url, f"{LOOPBACK}:{gcs_port}"
        _kill_group(proc)
    procs.append(proc)
    _check_alive(procs, temp_dir)
    raise TimeoutError("the Ray head did not come up")


def _started(proc: subprocess.Popen[bytes], log_path: Path) -> bool:
    """True once `ray start` logged that the node runs; False if it exited or took too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if STARTED in log_path.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def _get(url: str, temp_dir: Path, timeout: float) -> urllib.request.Request:
    return urllib.request.Request(url, headers=_auth(str(temp_dir / "auth_token")))


def _api_up(url: str, proc: subprocess.Popen[bytes], temp_dir: Path) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(_get(f"{url}/api/version", temp_dir, 2),
                                        timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def _join_tpu_host(slice_name: str, worker_id: int, tpu: TpuSlices, gcs: str, url: str,
                   procs: list[subprocess.Popen[bytes]], logs: list[IO[bytes]],
                   temp_dir: Path) -> None:
    """One `ray start --address` worker node that looks like a TPU host; waits until it is
    alive. Nodes join one at a time, and a node that hits Ray's fixed 30 s registration timeout
    (seen at load average 17 on 2 cores) is killed and started again."""
    labels = host_labels(slice_name, worker_id, hosts=tpu.hosts_per_slice,
                         devices=tpu.devices_per_host)
    resources = host_resources(worker_id, hosts=tpu.hosts_per_slice,
                               devices=tpu.devices_per_host)
    instance = labels[INSTANCE_LABEL]
    for attempt in range(START_ATTEMPTS):
        logs.append(open(temp_dir / f"{instance}-{attempt}.log", "wb"))  # noqa: SIM115
        proc = _launch(
            [f"--address={gcs}", f"--node-ip-address={LOOPBACK}", "--num-cpus=1",
             "--num-gpus=0", f"--resources={_json(resources)}",
             "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
             f"--object-store-memory={80 * 1024 * 1024}",
             f"--dashboard-agent-listen-port={free_port()}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats"], logs[-1], temp_dir)
        _check_alive(procs, temp_dir)  # the head is still there
        if _started(proc, temp_dir / f"{instance}-{attempt}.log"):
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                if instance in _alive_tpu_instances(url, temp_dir):
                    procs.append(proc)
                    return
                time.sleep(0.5)
        _kill_group(proc)
    procs.append(proc)  # so that _check_alive reports its log
    _check_alive(procs, temp_dir)
    raise TimeoutError(f"emulated TPU host {instance} did not join the Ray cluster")


def _alive_tpu_instances(url: str, temp_dir: Path) -> list[str]:
    """Instance labels of the alive nodes with TPU resources (dashboard node summary)."""
    import json

    try:
        with urllib.request.urlopen(_get(f"{url}/nodes?view=summary", temp_dir, 5),
                                    timeout=5) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    out = []
    for n in body.get("data", {}).get("summary", []):
        raylet = n.get("raylet", {})
        if raylet.get("state") == "ALIVE" and "TPU" in (raylet.get("resourcesTotal") or {}):
            out.append((raylet.get("labels") or {}).get(INSTANCE_LABEL, ""))
    return out


def _wait_tpu_nodes(url: str, expected: int, procs: list[subprocess.Popen[bytes]],
                    temp_dir: Path) -> None:
    """Until exactly `expected` TPU nodes are alive (a killed failed attempt must be dead)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen: list[str] = []
    while time.monotonic() < deadline:
        _check_alive(procs, temp_dir)
        seen = _alive_tpu_instances(url, temp_dir)
        if len(seen) == expected:
            return
        time.sleep(0.5)
    raise TimeoutError(f"alive emulated TPU nodes {sorted(seen)}, expected {expected}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _kill_all(procs: list[subprocess.Popen[bytes]], temp_dir: str, gcs_address: str) -> None:
    """SIGTERM every node's process group (workers first), SIGKILL what remains of ours.

    The nodes get 10 s together, not 10 s each: waiting node after node made the teardown of
    a head and two workers take 30 s."""
    for proc in reversed(procs):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in reversed(procs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    port = f":{gcs_address.rsplit(':', 1)[1]}" if gcs_address else ""
    ours = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if temp_dir in " ".join(p.info["cmdline"] or ()) or (
                    port and p.environ().get("RAY_ADDRESS", "").endswith(port)):
                ours.append(p)  # Ray's processes, and job drivers of our head (any of its IPs)
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(ours, timeout=10)
