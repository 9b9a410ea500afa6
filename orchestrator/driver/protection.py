"""The ``auto`` protection settings, decided before any host starts.

Users run defaults, so the defaults protect: the RAM tier is on whenever it can help and fits
(``checkpoint.ram.enabled: auto``) and every spare slice keeps standby processes
(``controller.warm.standby_slices: auto``). The tier helps when a peer host exists to hold a
copy off the node, and fits when each host's copies (``keep`` × 2 hosts × its share of the
state, from the task check's abstract shapes) stay within ``checkpoint.ram.max_host_bytes``
and, with the devices, within the host's RAM (the check turns it off rather than refusing the
run: ``workers/task/check.py``). The choices and their reasons are printed, logged and kept
for ``summary.json``; each is one setting to opt out of.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from policies.ram_tier import HOLDER_SHARE, holder_cap

log = structlog.get_logger(__name__)


def resolve(cfg: Any, memory: dict | None, *, hosts: int, spare_slices: int | None
            ) -> tuple[Any, dict]:
    """``cfg`` with ``checkpoint.ram.enabled`` decided (true or false), and the record of
    each protection choice. ``memory``: the task check's estimate (None: not made); ``hosts``:
    the hosts of the mesh; ``spare_slices``: complete slices beyond it (None: not known yet,
    the planner counts them at every formation)."""
    ram = cfg.checkpoint.ram
    holders = where_held(ram, memory)  # a tier turned on by hand: as the memory check chose
    if ram.enabled == "auto":
        on, why, holders = ram_auto(ram, memory, hosts=hosts)
        tier = {"enabled": on, "setting": "auto", "reason": why}
    else:
        on = ram.enabled
        tier = {"enabled": on, "setting": str(on).lower(),
                "reason": f"checkpoint.ram.enabled={str(on).lower()}"}
    cap = holder_budget(ram, memory)[0] if ram.max_host_bytes == "auto" else None
    ram = dataclasses.replace(ram, enabled=on, holders=holders,
                              **({"max_host_bytes": cap} if cap is not None else {}))
    cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, ram=ram))
    copy = (memory or {}).get("copy_bytes")
    if copy:
        tier["copy_bytes"] = int(copy)
    if ram.enabled:
        tier["holders"] = ram.holders
        tier["max_host_bytes"] = ram.max_host_bytes
        tier["every"] = ram.every
        tier["max_overhead"] = ram.max_overhead
    n = cfg.controller.warm.standby_slices
    if n == "auto":
        count = ("every complete spare slice" if spare_slices is None
                 else f"{spare_slices} spare slice(s) now")
        standby = {"setting": "auto", "reason": f"auto: standby processes on {count} (JAX "
                   "imported, no runtime): a re-form onto them skips the process start"}
    else:
        standby = {"setting": n, "reason": f"controller.warm.standby_slices={n}"}
    record = {"ram_tier": tier, "standby_slices": standby}
    log.info("protection", **record)
    return cfg, record


def spare_slices(hosts: Any, plan: Any) -> int:
    """Slices of the cluster's ``hosts`` that the first mesh ``plan`` leaves idle."""
    used = {h.slice_name for h in plan.hosts}
    return len({h.slice_name for h in hosts} - used)


def ram_auto(ram: Any, memory: dict | None, *, hosts: int) -> tuple[bool, str, str]:
    """(on, why, ``checkpoint.ram.holders`` decided) for ``checkpoint.ram.enabled: auto``."""
    holders = where_held(ram, memory)
    if hosts < 2:
        return False, ("auto: off, the mesh has one host, so no peer can hold a copy off its "
                       "node (checkpoint.ram.enabled=true keeps one on the same node)"), holders
    if memory and memory.get("ram_auto_off"):
        return False, f"auto: off, the copies do not fit: {memory['ram_auto_off']}", holders
    state = (memory or {}).get("state_bytes")
    copy = (memory or {}).get("copy_bytes") or (-(-int(state) // hosts) if state else None)
    cap, where = holder_budget(ram, memory)
    if copy is None:
        return True, ("auto: on, a peer exists (the state's size is not known before the "
                      "start; a host whose copies exceed checkpoint.ram.max_host_bytes stops "
                      "copying and says so)"), holders
    if (ram.holders == "auto" and holders == "both" and cap is not None
            and copy * ram.keep * 2 > cap):
        holders = "peer"  # half the copies per holder before the tier is turned off
    factor = 1 if holders == "peer" else 2
    need = copy * ram.keep * factor
    sizes = f"{_mib(copy)} per copy × {ram.keep} kept × {factor} host(s) = {_mib(need)}"
    if factor == 1:
        sizes += (" (checkpoint.ram.holders=peer)" if ram.holders == "peer" else
                  " (on a peer only: both the own node's and a peer's copies do not fit)")
    if cap is None:
        return True, (f"auto: on, a peer exists; {sizes}, checked on each host against "
                      f"checkpoint.ram.max_host_bytes{where}"), holders
    if need > cap:
        fix = ("set checkpoint.ram.max_host_bytes to a number of bytes to override, spread "
               "the state over more hosts, or give the hosts more RAM"
               if ram.max_host_bytes == "auto" else "raise it to turn the tier on")
        return (False, f"auto: off, {sizes} exceeds checkpoint.ram.max_host_bytes{where} "
                f"({fix})", holders)
    return True, (f"auto: on, a peer exists and the copies fit: {sizes} within "
                  f"checkpoint.ram.max_host_bytes{where}"), holders


def where_held(ram: Any, memory: dict | None) -> str:
    """``checkpoint.ram.holders`` decided: the setting, or under ``auto`` the memory check's
    choice (``peer`` when the own node's copies do not fit beside a peer's), else ``both``."""
    if ram.holders != "auto":
        return ram.holders
    return "peer" if (memory or {}).get("ram_holders") == "peer" else "both"


def holder_budget(ram: Any, memory: dict | None) -> tuple[int | None, str]:
    """(the bytes a node's holder may keep, how that was decided): the fixed setting, or under
    ``auto`` ``policies.ram_tier.holder_cap`` of the memory check's RAM bound for a host less
    its devices' state (CPU emulation); (None, ...) when the host's RAM is not known yet."""
    if ram.max_host_bytes != "auto":
        return int(ram.max_host_bytes), f"={ram.max_host_bytes} ({_mib(ram.max_host_bytes)})"
    host = (memory or {}).get("host_bytes")
    if not host:
        return None, (": auto, decided by each host from its own RAM (not known before the "
                      "cluster is seen)")
    devices = 0
    if memory.get("shared") and memory.get("device_total") and memory.get("devices_per_host"):
        devices = int(memory["device_total"]) * int(memory["devices_per_host"])
    cap = holder_cap(int(host), devices)
    beside = f" less its devices' state {_mib(devices)}" if devices else ""
    return cap, (f": auto, {_mib(cap)} ({HOLDER_SHARE:.0%} of a host's RAM share "
                 f"{_mib(host)}{beside})")


def line(record: dict) -> str:
    """The line the driver prints."""
    tier, standby = record["ram_tier"], record["standby_slices"]
    head = "RAM tier " + ("on" if tier["enabled"] else "off")
    if tier["enabled"]:
        every = tier.get("every")
        head += (f", copies every {every} step(s)" if every != "auto" else
                 f", copy interval auto (at most {tier['max_overhead']:.0%} of step time)")
    return (f"Protection: {head} ({tier['reason']}); standby: {standby['reason']}. "
            "Opt out: checkpoint.ram.enabled=false, controller.warm.standby_slices=0")


def _mib(n: float) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB" if n >= 1024**2 else f"{n / 1024:.1f} KiB"
