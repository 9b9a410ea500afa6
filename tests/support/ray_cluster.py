"""Emulated TPU clusters for tests: start, connect this process, yield, and always tear down.

A cluster start costs ~20-45 s on 2 cores, so tests share one per module (or session) through
``cluster_fixture``. Teardown runs whatever happened (``finally``): ``ray.shutdown()`` first,
then every Ray node of the emulated cluster, so no raylet or worker outlives the tests.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.raygroup.topology import EmulatedCluster, connect_ray, hosts_from_nodes
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.procfs import stat_fields

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RunningCluster:
    """A live emulated cluster this process is connected to."""

    emulated: EmulatedCluster
    address: str
    slice_names: tuple[str, ...]
    devices_per_host: int

    def hosts(self, *slices: str) -> list[HostRef]:
        """Alive emulated hosts as topology discovery sees them (only ``slices`` if given)."""
        import ray

        found = hosts_from_nodes(ray.nodes())
        return [h for h in found if not slices or h.slice_name in slices]


@contextmanager
def emulated_cluster(*, slices: int = 1, hosts_per_slice: int = 2, devices_per_host: int = 2,
                     layout: Sequence[int] | None = None, names: Sequence[str] | None = None,
                     connect_timeout_s: float = 120.0, start_attempts: int = 3
                     ) -> Iterator[RunningCluster]:
    """``slices`` × ``hosts_per_slice`` hosts of ``devices_per_host`` CPU devices each.

    ``layout`` (hosts per slice, e.g. ``[2, 1, 1]``) overrides ``slices``/``hosts_per_slice`` for
    clusters with unequal slices; ``names`` names the slices (default ``emu-slice-<i>``).
    """
    import ray

    sizes = list(layout) if layout is not None else [hosts_per_slice] * slices
    if names is not None and len(names) != len(sizes):
        raise ValueError("names must name every slice of the layout")
    t0 = time.perf_counter()
    cluster = EmulatedCluster(devices_per_host=devices_per_host)
    try:
        made = _start(cluster, sizes, names, attempts=start_attempts)
        connect_ray(cluster.cluster.address, timeout_s=connect_timeout_s)
        running = RunningCluster(emulated=cluster, address=cluster.cluster.address,
                                 slice_names=made, devices_per_host=devices_per_host)
        _wait_for_hosts(running, sum(sizes), timeout_s=connect_timeout_s)
        log.info("test_cluster_up", layout=sizes, seconds=round(time.perf_counter() - t0, 1))
        yield running
    finally:
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            cluster.shutdown()


def _start(cluster: EmulatedCluster, sizes: list[int], names: Sequence[str] | None, *,
           attempts: int) -> tuple[str, ...]:
    """Start head and slices; on a loaded machine a raylet can miss Ray's fixed 30 s
    registration window, so a failed start is torn down and tried again from scratch.

    One such failure is understood and gone: a raylet aborted by grpcio's fork handlers before
    it ran (``orchestrator/__init__.py``). What this process's children are doing at a failed
    start still goes into the warning and the error, to tell a stuck fork from a dead raylet."""
    for attempt in range(1, attempts + 1):
        try:
            cluster.start()
            return tuple(cluster.add_slice(n, name=names[i] if names else None)
                         for i, n in enumerate(sizes))
        except Exception as exc:
            children = _children()
            cluster.shutdown()
            if attempt == attempts:
                exc.add_note(f"this process's children at the failure: {children}")
                raise
            log.warning("test_cluster_start_retry", attempt=attempt, error=str(exc)[:200],
                        children=children)
            # in the run's warnings summary too, which CI prints even when the retry saved it
            warnings.warn(f"emulated cluster start {attempt} of {attempts} failed "
                          f"({str(exc)[:120]}); children: {children}", RuntimeWarning,
                          stacklevel=2)
            cluster._next_slice = 0
    raise AssertionError("unreachable")


def _children() -> list[str]:
    """``pid comm state wchan`` of this process's children, with a zombie's wait status
    (``/proc/<pid>/stat`` field 52: 9 = SIGKILL, 11 = SIGSEGV, 256 * n = exit n). A
    diagnostic; never raises."""
    out = []
    try:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = stat_fields(entry.name)
                if fields is None or int(fields[1]) != os.getpid():
                    continue
                comm = (entry / "comm").read_text().strip()
                wchan = (entry / "wchan").read_text().strip() or "-"
                status = f" status={fields[49]}" if fields[0] == "Z" and len(fields) > 49 else ""
                out.append(f"{entry.name} {comm} {fields[0]} {wchan}{status}")
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        pass
    return out


def _wait_for_hosts(running: RunningCluster, count: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(running.hosts()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(running.hosts())} of {count} emulated hosts came up")
        time.sleep(0.2)


def cluster_fixture(*, scope: str = "module", **kwargs: Any) -> Any:
    """A pytest fixture yielding a ``RunningCluster`` shared by every test in ``scope``.

    Usage in a test module or conftest: ``cluster = cluster_fixture(layout=[2, 1, 1])``.
    """

    @pytest.fixture(scope=scope)  # type: ignore[arg-type]
    def _cluster() -> Iterator[RunningCluster]:
        with emulated_cluster(**kwargs) as running:
            yield running

    return _cluster
