"""The host environment both sides need: what the driver sets up for a host process and where
the host finds what the driver chose (the executable store, its key). Standard library only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from pathlib import Path

HOST_INIT_SHARE = 0.5  # of timeouts.init_s: JAX gives up ~3 s after; the driver names who hung

ENV_KEY = "TPU_ORCH_EXECUTABLES_KEY"
DEFAULT_KEY = "~/.config/tpu-orchestrator/executables.key"
"""The key that signs the executable store's files (``workers.training.exec_auth``)."""

DIR_NAME = "executables"
"""Under the run directory: RUN_DIR/executables."""
ENV_DIR = "TPU_ORCH_EXECUTABLES_DIR"
"""A store shared by every run started with it set (compile.dir overrides it)."""


def device_env(*, platform: str, devices_per_host: int, extra: dict[str, str] | None = None
               ) -> dict[str, str]:
    """Environment a host process needs before JAX starts."""
    env: dict[str, str] = {}
    if platform == "cpu":
        # Each XLA flag needs its leading "--"; an unknown flag aborts the process.
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_host}"
        env["JAX_PLATFORMS"] = "cpu"
    env.update(extra or {})
    return env


def free_port(host: str = "", *, preferred: int = 0) -> int:
    """A TCP port free on ``host`` now: "" (every interface) for what other hosts reach (a JAX
    coordinator), "127.0.0.1" for loopback-only services; ``preferred`` when it is free. The one
    copy for the driver, the hosts, the tests and the bench. OSError when none is free."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                continue
            return int(s.getsockname()[1])
    raise AssertionError("unreachable: port 0 either binds or raises")


def loopback_host(address: str) -> str | None:
    """The host of ``address`` ("host:port", "[v6]:port") when it is loopback, else None."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return host
    try:
        return host if ipaddress.ip_address(host).is_loopback else None
    except ValueError:  # a host name: resolved by JAX, reached from other hosts
        return None


def coordinator_bind(coordinator: str) -> str | None:
    """Where process 0's JAX coordinator listens: on ``coordinator`` itself when its host is
    loopback (the emulated and local clusters: every process is on this machine), else None,
    JAX's default, every interface (other hosts reach it; on GKE only the cluster's own pods
    may, ``deploy/README.md``). JAX's default on loopback let a client from the machine's
    external address join the group as a process and kill the real one."""
    return coordinator if loopback_host(coordinator) else None


def key_path(env: Mapping[str, str] | None = None) -> str:
    """Where the key is: ``$TPU_ORCH_EXECUTABLES_KEY``, else the per-user default."""
    env = os.environ if env is None else env
    return env.get(ENV_KEY) or os.path.expanduser(DEFAULT_KEY)


def store_dir(configured: str, run_dir: str | Path, env: Mapping[str, str]) -> str:
    """Where a run's store lives: ``compile.dir``, else ``$TPU_ORCH_EXECUTABLES_DIR``, else
    RUN_DIR/executables (a resumed run finds what its earlier groups stored)."""
    return configured or env.get(ENV_DIR) or f"{run_dir}/{DIR_NAME}"
