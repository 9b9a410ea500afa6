"""How much RAM a host's holder may keep when the driver could not say (``max_host_bytes:
auto`` on hosts whose RAM is not known before the cluster is seen, e.g. TPU VMs): decided on
the host from its own ``/proc/meminfo`` by ``policies.ram_tier.holder_cap``."""

from __future__ import annotations

from pathlib import Path

from policies.ram_tier import holder_cap

MEMINFO = Path("/proc/meminfo")


def host_ram_bytes(meminfo: str | None = None) -> int | None:
    """``MemTotal`` of this host, None when unreadable (the seam: ``meminfo`` text)."""
    if meminfo is None:
        try:
            meminfo = MEMINFO.read_text()
        except OSError:
            return None
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            try:
                return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
            except (IndexError, ValueError):
                return None
    return None


def cap_bytes(cap: int | None, *, devices_bytes: int = 0, fallback: int = 2 * 1024**3) -> int:
    """``cap`` when the driver decided one, else ``holder_cap`` of this host's RAM (``fallback``
    when unreadable)."""
    if cap is not None:
        return int(cap)
    ram = host_ram_bytes()
    return holder_cap(ram, devices_bytes) if ram else fallback
