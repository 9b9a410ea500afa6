"""What "fits" means per host before the cluster is seen, and the line the driver prints.

The task check (``python -m workers.task.check``) works out the train state's bytes per device
and per host from abstract shapes (``workers/training/memory.py``); this module, on the driver (no
JAX), says what to fit them into and words the result:

- ``cluster.device_memory_gib`` / ``cluster.host_memory_gib`` when set;
- else on the CPU emulation this machine's RAM (``MemTotal``, or the cgroup's limit when
  lower) shared by every emulated host (``(slices + spare_slices) × hosts_per_slice``: a spare
  slice's hosts hold state too, the standbys' pre-formed copy and their holders' copies of
  their peers') and, within a host, by its devices. The devices' state and the RAM tier's copies are
  the same RAM there, so a host's share has to hold both;
- else on TPU the chip's HBM for ``cluster.accelerator`` (``HBM_GIB_PER_CHIP``); a host's RAM
  and the devices per host are not known before the cluster is seen: the estimate is per
  device and a host's RAM is not checked (``cluster.host_memory_gib`` is for the emulation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3

HBM_GIB_PER_CHIP: dict[str, float] = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
"""HBM per chip from Cloud TPU's published system specs (keys as ``orchestrator.metrics.mfu``)."""

AXES = ("data", "fsdp", "tensor")


@dataclass(frozen=True, kw_only=True)
class MemoryBounds:
    """Bytes a device and a host may hold (None: not known, not checked) and where from."""

    device_bytes: int | None
    host_bytes: int | None
    devices_per_host: int | None
    """None on TPU before the cluster is seen: the estimate is per device only."""
    shared: bool
    """The devices live in the host's RAM (CPU emulation): a host holds both."""
    source: str

    def request(self, cfg: Any, mesh: Mapping[str, int]) -> dict | None:
        """The task check's ``memory`` input; None when the mesh is not fully known yet."""
        if any(mesh.get(a, 0) < 1 for a in AXES):
            return None
        ram = cfg.checkpoint.ram
        return {"mesh": {a: int(mesh[a]) for a in AXES},
                "devices_per_host": self.devices_per_host,
                "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "shared": self.shared, "accum_steps": 1,
                "ram_keep": ram.keep if ram.enabled else 0,
                "ram_max_host_bytes": ram.cap_bytes if ram.enabled else None,
                "ram_auto": ram.enabled == "auto", "ram_holders": ram.holders}


def machine_ram_bytes(meminfo: str | None = None, cgroup_limits: tuple[str, ...] | None = None,
                      ) -> int | None:
    """This machine's RAM: ``MemTotal`` of ``/proc/meminfo``, or a lower cgroup memory limit
    (v2 ``memory.max``, v1 ``memory.limit_in_bytes``). None when unreadable."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            meminfo = ""
    total = None
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            try:
                total = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
            except (IndexError, ValueError):
                total = None
    if cgroup_limits is None:
        cgroup_limits = tuple(_read(p) for p in ("/sys/fs/cgroup/memory.max",
                                                 "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
    for text in cgroup_limits:
        try:
            limit = int(text.strip())
        except (AttributeError, ValueError):  # absent, or "max"
            continue
        if 0 < limit < (total or math.inf):
            total = limit
    return total


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _gib(value: float | None) -> int | None:
    return None if value is None else int(value * GIB)


def bounds_for(cfg: Any, *, ram_bytes: int | None = None) -> MemoryBounds:
    """The bounds for ``cfg``'s cluster (see the module's doc); ``ram_bytes`` stands in for
    this machine's RAM (tests)."""
    c = cfg.cluster
    dev_set, host_set = _gib(c.device_memory_gib), _gib(c.host_memory_gib)
    if c.mode != "tpu":
        em = c.emulate
        hosts = (em.slices + em.spare_slices) * em.hosts_per_slice
        ram = ram_bytes if ram_bytes is not None else machine_ram_bytes()
        host = host_set if host_set is not None else (ram // hosts if ram else None)
        device = dev_set if dev_set is not None else (
            host // em.devices_per_host if host else None)
        if dev_set is not None and host_set is not None:
            source = "cluster.device_memory_gib and cluster.host_memory_gib"
        elif ram:
            spare = (f" ({em.spare_slices * em.hosts_per_slice} on spare slices)"
                     if em.spare_slices else "")
            source = (f"CPU emulation: this machine's {_size(ram)} of RAM shared by {hosts} "
                      f"emulated host(s){spare} of {em.devices_per_host} device(s)")
            source += "".join(f"; {k} set" for k, v in (("cluster.device_memory_gib", dev_set),
                                                       ("cluster.host_memory_gib", host_set))
                              if v is not None)
            source += "; cluster.device_memory_gib / cluster.host_memory_gib override it"
        else:
            source = "this machine's RAM is unknown (no /proc/meminfo): not checked"
        return MemoryBounds(device_bytes=device, host_bytes=host,
                            devices_per_host=em.devices_per_host, shared=True, source=source)
    from orchestrator.metrics.mfu import normalize_accelerator

    key = normalize_accelerator(c.accelerator) if c.accelerator else None
    if dev_set is not None:
        device, source = dev_set, "cluster.device_memory_gib"
    elif key in HBM_GIB_PER_CHIP:
        device, source = _gib(HBM_GIB_PER_CHIP[key]), f"{key} HBM per chip"
    else:
        device, source = None, ("device memory unknown before the cluster is seen: set "
                                "cluster.device_memory_gib or cluster.accelerator to check it")
    return MemoryBounds(device_bytes=device, host_bytes=None, devices_per_host=None,
                        shared=False, source=source)


def _size(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit != "KiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


PARTS = (("params", "parameters"), ("opt_state", "optimizer state"), ("grads", "gradients"),
         ("other", "step and RNG"))


def memory_line(mem: Mapping[str, Any], bounds: MemoryBounds | None = None) -> str:
    """The one line the driver prints: per host (or per device, hosts not known yet) the
    parameters, optimizer state, gradients and RAM-tier copies, the mesh and the bound."""
    if mem.get("device") is None:  # the mesh is not known yet (TPU, an axis sized by slices)
        return (f"Memory estimate (jax.eval_shape): the whole train state is "
                f"{_size(mem['state_bytes'])}; per device and per host once the cluster is "
                f"seen (mesh axes {', '.join(mem.get('unknown_axes') or ())} are sized by it)")
    dph = mem.get("devices_per_host")
    per = dph or 1
    parts = ", ".join(f"{label} {_size(mem['device'][k] * per)}" for k, label in PARTS)
    dev_total = mem["device_total"]
    mesh = " ".join(f"{a}={s}" for a, s in mem["mesh"].items())
    if dph:
        head = (f"Memory per host (jax.eval_shape estimate, activations not counted): {parts} = "
                f"{_size(dev_total * dph)} on {dph} device(s) ({_size(dev_total)} each)")
        if mem.get("ram_keep"):
            head += (f"; RAM-tier copies {_size(mem['ram_tier'])} in host RAM "
                     f"({mem['ram_keep']}×{mem['holder_factor']}+1 copies of "
                     f"{_size(mem['copy_bytes'])}"
                     + (", on a peer only" if mem.get("ram_holders") == "peer" else "") + ")")
        else:
            head += "; RAM tier off"
    else:
        head = (f"Memory per device (jax.eval_shape estimate, activations not counted): {parts}"
                f" = {_size(dev_total)}; per host: devices per host not known before the "
                "cluster is seen")
    head += f"; mesh {mesh} over {mem['hosts']} host(s)" if dph else f"; mesh {mesh}"
    if bounds is None:
        return head
    limits = [f"{_size(b)} per {what}" for b, what in ((bounds.device_bytes, "device"),
                                                       (bounds.host_bytes, "host"))
              if b is not None]
    if not limits:
        return f"{head}. Not checked ({bounds.source})"
    verdict = "Does NOT fit within" if mem.get("refused") else "Fits within"
    return f"{head}. {verdict} {' and '.join(limits)} ({bounds.source})"
