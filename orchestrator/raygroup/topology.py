"""Topology discovery from the Ray cluster, and the emulated local cluster.

A host is an alive Ray node with ``TPU`` resources and a ``ray.io/tpu-slice-name`` label; a slice
is the set of such nodes sharing that label. The emulated cluster starts Ray nodes on this machine
carrying the very same labels and resources, so discovery is one code path for both.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from orchestrator.raygroup import ray_private
from orchestrator.raygroup.reaper import Reaper, marking
from orchestrator.shared.errors import ClusterUnreachableError, ConfigError
from orchestrator.shared.host_env import free_port
from orchestrator.shared.hosts import HostRef

log = structlog.get_logger(__name__)

SLICE_LABEL = "ray.io/tpu-slice-name"
WORKER_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
TOPOLOGY_LABEL = "ray.io/tpu-topology"
INSTANCE_LABEL = "tpu-orchestrator.dev/instance"
EMULATED_LABEL = "tpu-orchestrator.dev/emulated"
LOOPBACK = "127.0.0.1"
_NODE_START_LOCK = threading.Lock()
_MARK_LOCK = threading.Lock()


JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # Ray sets it for a driver started by a Ray job
_LOCAL_CLUSTER = ("start a local TPU-like cluster with `make cluster` (python -m "
                  "orchestrator.cluster up) and submit to it with cluster.mode=auto")


def check_cluster_mode(mode: str, address: str | None, env: Mapping[str, str]) -> None:
    """Refuse, before anything starts, a ``cluster.mode`` that cannot work where the driver runs.

    * ``emulate`` inside a Ray job: the emulated cluster started in the job cannot fetch the
      job's ``working_dir`` package from the outer cluster (Ray's RuntimeEnvSetupError). We refuse
      rather than join emulated nodes to the outer cluster: nodes started by a job die with it and
      would make the job's cluster depend on one job's lifetime.
    * ``emulate`` with ``cluster.address``: emulate starts its own cluster; the address would be
      silently ignored.
    * ``tpu`` with no cluster at all (no ``cluster.address``, no ``RAY_ADDRESS``): a new local Ray
      would have no TPU hosts.
    """
    in_job = JOB_CONFIG_ENV in env
    if mode == "emulate" and in_job:
        raise ConfigError(
            "cluster.mode", "is `emulate` but this driver runs inside a Ray job (`ray job "
            "submit`): an emulated cluster started inside a job cannot fetch the job's "
            "working_dir from the outer cluster",
            "submit with cluster.mode=auto (the default) to a cluster that has TPU hosts: "
            f"{_LOCAL_CLUSTER}; or run `python -m orchestrator.main cluster.mode=emulate` "
            "directly, without `ray job submit`")
    if mode == "emulate" and address:
        raise ConfigError(
            "cluster.address", f"is {address!r} but cluster.mode=emulate starts its own local "
            "cluster and would ignore it",
            "drop cluster.address to emulate locally, or use cluster.mode=auto to run on that "
            "cluster")
    if mode == "tpu" and not (address or env.get("RAY_ADDRESS")):
        raise ConfigError(
            "cluster.mode", "is `tpu` but no Ray cluster is named (cluster.address and "
            "RAY_ADDRESS are unset), so there would be no TPU hosts",
            "submit with `ray job submit` to a TPU cluster (it sets RAY_ADDRESS), set "
            f"cluster.address, or {_LOCAL_CLUSTER}")


def hosts_from_nodes(nodes: Sequence[dict[str, Any]], *,
                     exclude: Sequence[str] = ()) -> list[HostRef]:
    """Alive TPU nodes (``ray.nodes()`` entries) as unordered HostRefs (index = -1)."""
    out: list[HostRef] = []
    for n in nodes:
        labels = n.get("Labels") or {}
        chips = int(n.get("Resources", {}).get("TPU", 0))
        slice_name = labels.get(SLICE_LABEL)
        if not n.get("Alive") or chips <= 0 or not slice_name or n["NodeID"] in exclude:
            continue
        out.append(HostRef(
            index=-1, slice_name=slice_name, worker_id=int(labels.get(WORKER_LABEL, 0)),
            node_id=n["NodeID"], node_ip=n.get("NodeManagerAddress", ""),
            instance=labels.get(INSTANCE_LABEL) or n.get("NodeManagerHostname", ""),
            devices=chips))
    return out


def platform_of(nodes: Sequence[dict[str, Any]]) -> str:
    """"cpu" when the TPU nodes are emulated, else "tpu"."""
    for n in nodes:
        labels = n.get("Labels") or {}
        if labels.get(SLICE_LABEL) and n.get("Alive"):
            return "cpu" if labels.get(EMULATED_LABEL) == "true" else "tpu"
    return "cpu"


def accelerator_of(nodes: Sequence[dict[str, Any]]) -> str | None:
    """Chip generation from the pod-type label (``v5litepod-16`` → ``v5e``)."""
    for n in nodes:
        pod = (n.get("Labels") or {}).get(POD_TYPE_LABEL, "")
        if pod and (n.get("Labels") or {}).get(EMULATED_LABEL) != "true":
            gen = pod.split("-")[0]
            return {"v5litepod": "v5e", "v6e": "v6e", "v5p": "v5p", "v4": "v4"}.get(gen, gen)
    return None


@dataclass
class EmulatedCluster:
    """A multi-node Ray cluster on this machine whose worker nodes look like TPU hosts.

    Nodes bind to loopback. ``add_slice`` brings replacement capacity; ``remove_host`` takes a
    host away without notice (node death), as a preemption does.
    """

    devices_per_host: int
    cluster: Any = None
    nodes: dict[tuple[str, int], Any] = None  # (slice, worker) -> ray node handle
    _next_slice: int = 0

    reaper: Reaper | None = None

    def start(self, *, include_dashboard: bool = False) -> str:
        """The head node, with a reaper that kills every process of this cluster when the
        driver dies, however it dies (``orchestrator/raygroup/reaper.py``)."""
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        _pin_ray_to_loopback()
        self.nodes = {}
        self.reaper = Reaper()
        self.reaper.start()  # first: nothing may start before something reaps it
        with self._marked():
            self.cluster = Cluster(initialize_head=True,
                                   head_node_args=head_args(include_dashboard))
        return self.cluster.address

    @contextlib.contextmanager
    def _marked(self) -> Iterator[None]:
        """Processes a node starts inside carry this cluster's mark (one start at a time)."""
        with _MARK_LOCK, marking(self.reaper.marker if self.reaper else "unreaped"):
            yield

    def add_slice(self, hosts: int, *, name: str | None = None) -> str:
        name = name or f"emu-slice-{self._next_slice}"
        self._next_slice += 1
        for w in range(hosts):
            labels = {SLICE_LABEL: name, WORKER_LABEL: str(w), INSTANCE_LABEL: f"{name}-w{w}",
                      POD_TYPE_LABEL: f"cpu-emu-{hosts * self.devices_per_host}",
                      TOPOLOGY_LABEL: f"{hosts}x{self.devices_per_host}", EMULATED_LABEL: "true"}
            resources = {"TPU": self.devices_per_host}
            if w == 0:
                resources[f"TPU-cpu-emu-{hosts * self.devices_per_host}-head"] = 1
            with _sigterm_hook_off_main_thread(), self._marked():
                self.nodes[(name, w)] = self.cluster.add_node(
                    num_cpus=1, resources=resources, labels=labels, node_ip_address=LOOPBACK,
                    object_store_memory=80 * 1024 * 1024, dashboard_agent_listen_port=_agent_port())
        return name

    def slice_workers(self, slice_name: str) -> list[int]:
        """Worker ids of ``slice_name``'s hosts still up."""
        return sorted(w for (name, w) in self.nodes if name == slice_name)

    def remove_host(self, slice_name: str, worker_id: int) -> None:
        """The machine vanishes: its raylet and every process it started die at once.

        ``Cluster.remove_node`` kills only the node's Ray daemons; its worker processes notice
        the dead raylet seconds later (3 s on a loaded CI machine) and keep stepping meanwhile,
        which no real lost VM does. Their pids are taken before the raylet goes.
        """
        self._take_down(slice_name, worker_id, graceful=False)

    def retire_host(self, slice_name: str, worker_id: int) -> None:
        """The host leaves on purpose (a scale-down): its raylet stops gracefully and
        unregisters, so Ray lists it dead at once, where ``remove_host``'s vanished machine is
        listed dead only once Ray's health checks fail. Its processes go with it."""
        self._take_down(slice_name, worker_id, graceful=True)

    def _take_down(self, slice_name: str, worker_id: int, *, graceful: bool) -> None:
        node = self.nodes.pop((slice_name, worker_id))
        workers = _started_by(node)
        self.cluster.remove_node(node, allow_graceful=graceful)
        _kill_all(workers)

    def shutdown(self) -> None:
        """Every emulated machine goes, with every process its raylet started.

        A worker left to notice its dead raylet by itself once outlived the driver by more than
        30 s on a loaded CI machine (a ``ray::HostActor`` the driver's ``ray.kill`` had not yet
        reached); no process of an emulated cluster may outlive the run that started it.
        """
        if self.cluster is not None:
            nodes = [*self.cluster.worker_nodes]
            if self.cluster.head_node is not None:
                nodes.append(self.cluster.head_node)
            workers = [p for node in nodes for p in _started_by(node)]
            self.cluster.shutdown()
            self.cluster = None
            _kill_all(workers)
        if self.reaper is not None:  # kills what is left (Ray leaves its agents running)
            self.reaper.stop()
            self.reaper = None


def _started_by(node: Any) -> list[Any]:
    """The processes a Ray node's raylet started (its workers and their children)."""
    import psutil

    found: list[psutil.Process] = []
    for info in node.all_processes.get("raylet", []):
        with contextlib.suppress(psutil.NoSuchProcess):
            found += psutil.Process(info.process.pid).children(recursive=True)
    return found


def _kill_all(processes: Sequence[Any]) -> None:
    import psutil

    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


@contextlib.contextmanager
def _sigterm_hook_off_main_thread() -> Iterator[None]:
    """Let a thread other than the main one add a node (the emulated cloud's replacements).

    Ray's ``Node`` installs a SIGTERM handler, which Python allows from the main thread only.
    Off it, that one step is skipped: the node keeps its exit hook and its reaper, and the
    process's SIGTERM handling stays as the head node and the driver set it.
    """
    if threading.current_thread() is threading.main_thread():
        yield
        return
    with _NODE_START_LOCK, ray_private.sigterm_handler_skipped():
        yield


def head_args(include_dashboard: bool = False) -> dict[str, Any]:
    """The emulated head node's settings. Its ports are free ones: Ray's fixed defaults (8265
    for the dashboard, whose HTTP server starts even without ``include_dashboard``) collide
    with another Ray on the machine, and Ray then prints "Failed to bind" among the run's own
    output."""
    return {"num_cpus": 2, "include_dashboard": include_dashboard,
            "no_monitor": True,  # the autoscaler's monitor: nothing here autoscales
            "node_ip_address": LOOPBACK, "object_store_memory": 150 * 1024 * 1024,
            "dashboard_port": free_port(LOOPBACK),
            "dashboard_agent_listen_port": _agent_port()}


def _agent_port() -> int:
    """A free port for a node's dashboard agent. Ray's default is one fixed port (52365) for
    every node: a second emulated cluster on the machine (two runs at once, two test workers)
    then failed to start its head, whose agent could not bind."""
    return free_port(LOOPBACK)


def _pin_ray_to_loopback() -> None:
    """Keep the emulated cluster on 127.0.0.1.

    ``ray.init`` rewrites a loopback bootstrap address to the machine's external address unless
    Ray believes multi-node clusters are disabled (its macOS/Windows mode). Only the emulated
    cluster, which lives on this machine alone, flips that switch; a real cluster never does.
    """
    ray_private.disable_multi_node()


def connect_ray(address: str | None, *, timeout_s: float,
                init: Callable[..., Any] | None = None) -> None:
    """``ray.init`` bounded by ``timeout_s``; an unreachable address becomes an error with a fix.

    Ray retries an unreachable GCS forever, so the call runs in a daemon thread and the driver
    gives up after the timeout (the process exits right after, taking the thread with it).
    """
    import threading

    import ray

    init = init or ray.init
    outcome: dict[str, BaseException | None] = {}

    def _connect() -> None:
        try:
            init(address=address, log_to_driver=True, ignore_reinit_error=True)
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc

    t = threading.Thread(target=_connect, name="ray-connect", daemon=True)
    t.start()
    t.join(timeout_s)
    fix = ("start it (`ray start --head`), fix cluster.address / RAY_ADDRESS, or unset both to "
           "run on a local emulated cluster")
    if "error" not in outcome:
        raise ClusterUnreachableError(
            f"Cannot reach the Ray cluster at {address!r} within {timeout_s:g}s.", fix=fix)
    if outcome["error"] is not None:
        raise ClusterUnreachableError(
            f"Cannot reach the Ray cluster at {address!r}: {outcome['error']}", fix=fix)
