"""Start, inspect and stop a local TPU-like Ray cluster: real ``ray start`` processes on loopback.

Every node runs ``ray start --block`` in its own process group, so ``down`` stops exactly what
``up`` started (never ``ray stop``, which would kill every Ray on the machine). What was started
is written to ``STATE_DIR/cluster.json`` after each node, so a half-finished ``up`` is stopped
by ``down`` too. Token auth is on: a fresh token in ``STATE_DIR/auth_token`` (mode 0600) is given
to every node as ``RAY_AUTH_TOKEN_PATH``; clients use the same file (``env`` prints the exports).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cluster.auth_token import write_token
from orchestrator.cluster.errors import LocalClusterError
from orchestrator.cluster.nodes import Shape, head_args, host_args, host_labels
from orchestrator.cluster.state_file import read_own_text
from orchestrator.raygroup.topology import INSTANCE_LABEL, LOOPBACK, SLICE_LABEL, WORKER_LABEL
from orchestrator.shared import host_env
from orchestrator.shared.files import atomic_write_json, open_append

STARTED = "Ray runtime started."
READY_TIMEOUT_S = 120.0
START_ATTEMPTS = 3
STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"
STATE_DIR_ENV = "TPU_ORCHESTRATOR_CLUSTER_DIR"


@dataclass
class ClusterState:
    """What ``up`` started; enough for ``down`` to stop it and for clients to reach it."""

    url: str
    gcs_address: str
    temp_dir: str
    token_path: str
    auth: bool
    shape: dict[str, Any]
    nodes: list[dict[str, Any]] = field(default_factory=list)  # name, pid, log

    def env(self) -> dict[str, str]:
        """What a client shell needs (``ray job submit``, ``ray job logs``, autoresume)."""
        out = {"RAY_ADDRESS": self.url, "RAY_AUTH_MODE": "token" if self.auth else "disabled"}
        if self.auth:
            out["RAY_AUTH_TOKEN_PATH"] = self.token_path
        return out


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$TPU_ORCHESTRATOR_CLUSTER_DIR``, else the per-user default (``env``: os.environ)."""
    env = os.environ if env is None else env
    return Path(env.get(STATE_DIR_ENV) or Path.home() / ".tpu-orchestrator" / "local-cluster")


def free_port(preferred: int = 0) -> int:
    """``preferred`` if it is free on loopback, else any free port (``host_env.free_port``)."""
    try:
        return host_env.free_port(LOOPBACK, preferred=preferred)
    except OSError:
        raise LocalClusterError("no free port on 127.0.0.1") from None


def load_state(state_dir: Path) -> ClusterState | None:
    """What ``up`` recorded in STATE_DIR; only from this user's own file (``state_file``)."""
    text = read_own_text(state_dir / STATE_FILE, "the cluster's state file")
    if text is None:
        return None
    fix = "stop leftover Ray processes by hand and delete it"
    try:
        return ClusterState(**json.loads(text))
    except ValueError as exc:
        raise LocalClusterError(f"{state_dir / STATE_FILE} is not readable JSON ({exc}).",
                                fix=fix) from None
    except TypeError as exc:
        raise LocalClusterError(f"{state_dir / STATE_FILE} is not a cluster's state ({exc}).",
                                fix=fix) from None


def _save(state_dir: Path, state: ClusterState) -> None:
    atomic_write_json(state_dir / STATE_FILE, asdict(state), indent=1, mode=0o600)


def _node_env(state: ClusterState) -> dict[str, str]:
    """Env of every node: token auth, this venv's `python` first on PATH (jobs run it)."""
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="token" if state.auth else "disabled",
               # the raylet waits this long for its Python agent: slow on a loaded machine
               RAY_agent_register_timeout_ms="120000",
               PATH=f"{venv_bin}:{os.environ.get('PATH', '')}")
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (set by an in-process emulated cluster to stay on
    # loopback) makes `ray start --address` refuse to join: never hand it to a node.
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(name, None)
    if state.auth:
        env["RAY_AUTH_TOKEN_PATH"] = state.token_path
    return env


def _launch(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    ray_bin = str(Path(sys.executable).parent / "ray")
    with open_append(log_path, binary=True, truncate=True) as log:  # never through a link
        return subprocess.Popen([ray_bin, "start", "--block", *args], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def _get(state: ClusterState, path: str, timeout: float = 5.0) -> Any:
    req = urllib.request.Request(state.url + path)
    if state.auth:
        token = read_own_text(Path(state.token_path), "the token file") or ""
        req.add_header("Authorization", f"Bearer {token.strip()}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def alive_hosts(state: ClusterState) -> list[str]:
    """Instance labels of the alive nodes with TPU resources; [] if the head does not answer."""
    try:
        body = _get(state, "/nodes?view=summary")
    except (urllib.error.URLError, OSError, ValueError):
        return []
    out = []
    for n in body.get("data", {}).get("summary", []):
        raylet = n.get("raylet", {})
        if raylet.get("state") == "ALIVE" and "TPU" in (raylet.get("resourcesTotal") or {}):
            out.append((raylet.get("labels") or {}).get(INSTANCE_LABEL, ""))
    return sorted(out)


def _wait(pred: Any, proc: subprocess.Popen[bytes], timeout_s: float = READY_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if pred():
            return True
        time.sleep(0.5)
    return False


def _log_says_started(log_path: Path) -> bool:
    return STARTED in log_path.read_text(errors="replace")


def _api_up(state: ClusterState) -> bool:
    try:
        return "ray_version" in _get(state, "/api/version", timeout=2)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def up(shape: Shape, *, state_dir: Path | None = None, dashboard_port: int = 8265,
       auth: bool = True) -> ClusterState:
    """Start the head and every emulated host; return once all hosts are alive."""
    state_dir = Path(state_dir or default_state_dir())
    state_dir.mkdir(parents=True, exist_ok=True)
    old = load_state(state_dir)
    if old is not None:
        raise LocalClusterError(
            f"A local cluster started from {state_dir} may still be running ({old.url}).",
            fix=f"stop it first: python -m orchestrator.cluster down --state-dir {state_dir}")
    token_path = state_dir / TOKEN_FILE
    if auth:
        write_token(token_path)
    # Ray's unix sockets live under temp_dir: keep the path short (107-byte socket limit).
    temp_dir = tempfile.mkdtemp(prefix="tpuo-", dir="/tmp")
    state = ClusterState(url="", gcs_address="", temp_dir=temp_dir, token_path=str(token_path),
                         auth=auth, shape=asdict(shape))
    try:
        _start_head(state, state_dir, dashboard_port)
        for slice_name, worker in shape.hosts():
            _start_host(state, state_dir, shape, slice_name, worker)
        expected = len(shape.hosts())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(alive_hosts(state)) != expected:
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"alive TPU hosts {alive_hosts(state)}, expected {expected}",
                    fix=f"see the node logs in {state_dir}; retry when the machine is less "
                        "loaded or with fewer hosts")
            time.sleep(0.5)
    except BaseException:
        down(state_dir)
        raise
    return state


def _start_head(state: ClusterState, state_dir: Path, dashboard_port: int) -> None:
    """Under heavy load Ray's fixed start-up timeouts can fail a start: kill and retry."""
    env = _node_env(state)
    for attempt in range(START_ATTEMPTS):
        dash, gcs = free_port(dashboard_port), free_port()
        state.url, state.gcs_address = f"http://{LOOPBACK}:{dash}", f"{LOOPBACK}:{gcs}"
        log_path = state_dir / f"head-{attempt}.log"
        proc = _launch(head_args(gcs_port=gcs, dashboard_port=dash, client_port=free_port(),
                                 agent_port=free_port(), temp_dir=state.temp_dir),
                       log_path, env)
        state.nodes.append({"name": "head", "pid": proc.pid, "log": str(log_path)})
        _save(state_dir, state)
        if _wait(lambda p=log_path: _log_says_started(p), proc) and _wait(
                lambda: _api_up(state), proc):
            return
        _kill_group(proc.pid)
        state.nodes.pop()
        _save(state_dir, state)
    raise LocalClusterError(
        f"the Ray head did not start after {START_ATTEMPTS} attempts; its log ends:\n"
        f"{_tail(log_path)}", fix=f"read the logs in {state_dir}/head-*.log; retry when the "
        "machine is less loaded")


def _start_host(state: ClusterState, state_dir: Path, shape: Shape, slice_name: str,
                worker: int) -> None:
    instance = host_labels(slice_name, worker, hosts=shape.hosts_per_slice,
                           devices=shape.devices_per_host)[INSTANCE_LABEL]
    env = _node_env(state)
    for attempt in range(START_ATTEMPTS):
        log_path = state_dir / f"{instance}-{attempt}.log"
        # Its own temp dir: nodes sharing one would unpack (and garbage-collect) a job's
        # working_dir package in the same place at once, and the driver imports a torn tree.
        # A fresh one per start (a removed slice's hosts leave theirs): never a dead node's.
        node_dir = Path(state.temp_dir) / f"h{len(list(Path(state.temp_dir).glob('h*')))}"
        node_dir.mkdir()
        proc = _launch(host_args(slice_name, worker, shape, gcs_address=state.gcs_address,
                                 agent_port=free_port(), temp_dir=str(node_dir)),
                       log_path, env)
        state.nodes.append({"name": instance, "pid": proc.pid, "log": str(log_path)})
        _save(state_dir, state)
        if _wait(lambda p=log_path: _log_says_started(p), proc) and _wait(
                lambda: instance in alive_hosts(state), proc):
            return
        _kill_group(proc.pid)
        state.nodes.pop()
        _save(state_dir, state)
    raise LocalClusterError(
        f"emulated TPU host {instance} did not join after {START_ATTEMPTS} attempts "
        f"(last exit code {proc.poll()}); its log ends:\n{_tail(log_path)}",
        fix=f"read the logs in {state_dir}; retry when the machine is less loaded")


def slice_nodes(state: ClusterState) -> dict[str, list[dict[str, str]]]:
    """Alive emulated TPU hosts by slice: ``{slice: [{"instance", "node_id"}, ...]}``, by worker
    id; {} if the head does not answer."""
    try:
        body = _get(state, "/nodes?view=summary")
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    out: dict[str, list[dict[str, str]]] = {}
    for n in body.get("data", {}).get("summary", []):
        raylet = n.get("raylet", {})
        labels = raylet.get("labels") or {}
        if raylet.get("state") == "ALIVE" and SLICE_LABEL in labels:
            out.setdefault(labels[SLICE_LABEL], []).append(
                {"instance": labels.get(INSTANCE_LABEL, ""), "node_id": raylet.get("nodeId", ""),
                 "worker": labels.get(WORKER_LABEL, "0")})
    return {s: sorted(h, key=lambda h: int(h["worker"])) for s, h in sorted(out.items())}


def add_slice(slice_name: str, *, state_dir: Path | None = None) -> ClusterState:
    """A new slice of the cluster's shape joins (a replacement the cloud hands out): its hosts
    start and join; returns once they are alive. Refused if the name is already a node's."""
    state_dir = Path(state_dir or default_state_dir())
    state = _require_state(state_dir)
    shape = Shape(**state.shape)
    if any(n["name"].startswith(f"{slice_name}-w") for n in state.nodes):
        raise LocalClusterError(f"slice {slice_name} is already part of the cluster",
                                fix="give the new slice a name no node has had")
    for worker in range(shape.hosts_per_slice):
        _start_host(state, state_dir, shape, slice_name, worker)
    return state


def remove_slice(slice_name: str, *, state_dir: Path | None = None) -> list[str]:
    """The slice's VMs stop at once (a preemption's deadline): every process of its hosts is
    SIGKILLed; returns the instances stopped. The head and other slices are untouched."""
    state_dir = Path(state_dir or default_state_dir())
    state = _require_state(state_dir)
    gone = [n for n in state.nodes if n["name"].startswith(f"{slice_name}-w")]
    if not gone:
        raise LocalClusterError(f"no host of slice {slice_name} was started by this cluster",
                                fix="name a slice `python -m orchestrator.cluster status` lists")
    for node in gone:
        _kill_group(node["pid"])
    state.nodes = [n for n in state.nodes if n not in gone]
    _save(state_dir, state)
    return [n["name"] for n in gone]


def _require_state(state_dir: Path) -> ClusterState:
    state = load_state(state_dir)
    if state is None:
        raise LocalClusterError(f"no local cluster recorded in {state_dir}",
                                fix="start one with `python -m orchestrator.cluster up`")
    return state


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _group_members(leaders: list[int]) -> list[int]:
    """Live processes in the process groups of ``leaders``, the leaders themselves left out."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(OSError):
            if (p.info["pid"] not in leaders and p.info["status"] != psutil.STATUS_ZOMBIE
                    and os.getpgid(p.info["pid"]) in leaders):
                found.append(p.info["pid"])
    return found


def down(state_dir: Path | None = None) -> str:
    """Stop every node ``up`` started and the job drivers of this head; forget the state."""
    import psutil

    state_dir = Path(state_dir or default_state_dir())
    state = load_state(state_dir)
    if state is None:
        return f"no local cluster recorded in {state_dir}"
    groups = [n["pid"] for n in state.nodes]
    # The hosts' Ray processes stop on SIGTERM within seconds while the head is up (with it gone
    # they wait out the grace); `ray start --block` itself never does, nor do the head's GCS,
    # raylet and dashboard (still up 20 s later). So: SIGTERM the hosts, wait for their Ray
    # processes, then SIGKILL every group.
    hosts = [n["pid"] for n in state.nodes if n["name"] != "head"]
    for pid in hosts:
        _kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _group_members(hosts):
        time.sleep(0.3)
    for pid in groups:
        _kill_group(pid)
    port = f":{state.gcs_address.rsplit(':', 1)[1]}" if state.gcs_address else "\0"
    ours = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if state.temp_dir in " ".join(p.info["cmdline"] or ()) or (
                    p.environ().get("RAY_ADDRESS", "").endswith(port)):
                ours.append(p)  # Ray's own processes, and job drivers of this head
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(ours, timeout=10)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    Path(state.token_path).unlink(missing_ok=True)
    shutil.rmtree(state.temp_dir, ignore_errors=True)
    return f"stopped {len(state.nodes)} Ray node(s) and {len(ours)} leftover process(es)"
