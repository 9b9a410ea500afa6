"""What a TPU host looks like to Ray, for nodes started on this machine: labels, resources and
the ``ray start`` arguments of the head and of each emulated host.

Real TPU VMs carry ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-pod-type``,
``ray.io/tpu-topology`` and the resources ``TPU`` (chips) and ``TPU-<pod>-head`` on worker 0
(README.md, "Production"). Emulated hosts carry the same, plus
``tpu-orchestrator.dev/emulated=true`` so the driver gives each host actor D CPU devices instead
of looking for chips. Pure: no processes here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.raygroup.topology import (
    EMULATED_LABEL,
    INSTANCE_LABEL,
    LOOPBACK,
    POD_TYPE_LABEL,
    SLICE_LABEL,
    TOPOLOGY_LABEL,
    WORKER_LABEL,
)

HEAD_OBJECT_STORE = 150 * 1024 * 1024
HOST_OBJECT_STORE = 80 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Shape:
    """``slices`` x ``hosts_per_slice`` emulated hosts of ``devices_per_host`` devices each."""

    slices: int = 2
    hosts_per_slice: int = 2
    devices_per_host: int = 2
    name_prefix: str = "local-slice"

    def __post_init__(self) -> None:
        for name in ("slices", "hosts_per_slice", "devices_per_host"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a whole number >= 1, "
                                 f"got {value!r}")

    def hosts(self) -> list[tuple[str, int]]:
        """(slice name, worker id) of every host, slice by slice."""
        return [(f"{self.name_prefix}-{s}", w) for s in range(self.slices)
                for w in range(self.hosts_per_slice)]


def host_labels(slice_name: str, worker_id: int, *, hosts: int, devices: int) -> dict[str, str]:
    """Labels a Ray TPU node carries, plus the marker that it is CPU-emulated."""
    return {SLICE_LABEL: slice_name, WORKER_LABEL: str(worker_id),
            INSTANCE_LABEL: f"{slice_name}-w{worker_id}",
            POD_TYPE_LABEL: f"cpu-emu-{hosts * devices}", TOPOLOGY_LABEL: f"{hosts}x{devices}",
            EMULATED_LABEL: "true"}


def host_resources(worker_id: int, *, hosts: int, devices: int) -> dict[str, int]:
    """`TPU` chips, and the `TPU-<pod>-head` marker resource on worker 0 (as real slices)."""
    res = {"TPU": devices}
    if worker_id == 0:
        res[f"TPU-cpu-emu-{hosts * devices}-head"] = 1
    return res


def head_args(*, gcs_port: int, dashboard_port: int, client_port: int, agent_port: int,
              temp_dir: str, num_cpus: int = 2) -> list[str]:
    """``ray start`` arguments of a loopback head with the dashboard (the job API needs it)."""
    return ["--head", f"--port={gcs_port}", f"--node-ip-address={LOOPBACK}",
            f"--dashboard-port={dashboard_port}", f"--dashboard-host={LOOPBACK}",
            "--include-dashboard=true", f"--ray-client-server-port={client_port}",
            f"--dashboard-agent-listen-port={agent_port}", f"--num-cpus={num_cpus}",
            "--num-gpus=0", f"--object-store-memory={HEAD_OBJECT_STORE}",
            f"--temp-dir={temp_dir}", "--disable-usage-stats"]


def host_args(slice_name: str, worker_id: int, shape: Shape, *, gcs_address: str,
              agent_port: int, temp_dir: str) -> list[str]:
    """``ray start`` arguments of one emulated TPU host joining ``gcs_address``."""
    labels = host_labels(slice_name, worker_id, hosts=shape.hosts_per_slice,
                         devices=shape.devices_per_host)
    resources = host_resources(worker_id, hosts=shape.hosts_per_slice,
                               devices=shape.devices_per_host)
    return [f"--address={gcs_address}", f"--node-ip-address={LOOPBACK}", "--num-cpus=1",
            "--num-gpus=0", f"--resources={json.dumps(resources, separators=(',', ':'))}",
            "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
            f"--object-store-memory={HOST_OBJECT_STORE}",
            f"--dashboard-agent-listen-port={agent_port}", f"--temp-dir={temp_dir}",
            "--disable-usage-stats"]
