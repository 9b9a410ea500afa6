"""Identity of the run's hosts, shared by topology discovery, events, metrics and the controller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class HostRef:
    """One TPU host (one Ray node, one host actor) as the run knows it.

    ``index`` is the host's position in the current mesh (JAX process id); it changes when the
    mesh re-forms. ``instance`` is the VM / GCE instance name (what GCE events name), ``node_id``
    the Ray node id (what Ray death events name).
    """

    index: int
    slice_name: str
    worker_id: int
    node_id: str
    node_ip: str
    instance: str
    devices: int

    def matches(self, name: str) -> bool:
        """True if an event target string names this host (instance, node id, ip or index)."""
        return name in (self.instance, self.node_id, self.node_ip, str(self.index))
