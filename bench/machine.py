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
