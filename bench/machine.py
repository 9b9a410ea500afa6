"""What the numbers were measured on: cores, memory, CPU model, load, library versions."""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

_PACKAGES = ("ray", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
             "google-cloud-pubsub", "google-cloud-monitoring", "structlog")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


IDLE_LOAD_1MIN = 1.5
"""A figure is a result only if the 1-minute load was below this before each measurement: on
2 cores, another job's load changes every time measured here (DEVELOPERS.md)."""


def validity(loads: list[dict]) -> dict:
    """Whether a bench run's figures are results: ``loads`` holds one ``{"measurement",
    "before": [1, 5, 15 min], "after": [...]}`` per measurement, in order."""
    busy = [(x["measurement"], x["before"][0]) for x in loads
            if x.get("before") and x["before"][0] >= IDLE_LOAD_1MIN]
    worst = max((x["before"][0] for x in loads if x.get("before")), default=None)
    return {"valid": bool(loads) and not busy and worst is not None,
            "max_load_1min_before": worst, "threshold": IDLE_LOAD_1MIN,
            "busy": [f"{name} started at 1-minute load {load:.2f}" for name, load in busy]}


def describe() -> dict:
    """A JSON-ready description of this machine and the software under test."""
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "load_average_1_5_15": load_average(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in _PACKAGES},
    }
