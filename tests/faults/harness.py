"""Drive a RunController in-process on an emulated cluster, and act on the cluster mid-run.

The controller runs in a thread; ``at_step`` actions (add a slice, remove a host, send a notice)
run in the test's main thread (Ray adds and removes nodes only from there), which reads the
controller's progress and fires each action once when its step is reached. Every run is torn
down by the controller itself (its ``finally``); ``alive_host_processes`` lets a test check
that no host actor process outlived its run.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
import structlog

from orchestrator.config import RunConfig, load_config
from orchestrator.controller import Controller, RunListener, RunSummary
from orchestrator.controller.config import ChaosFaultConfig
from orchestrator.controller.wiring import from_config
from orchestrator.raygroup.cluster_view import RayClusterView
from orchestrator.raygroup.factory import ray_group_factory
from orchestrator.raygroup.group import RayWorkerGroup
from orchestrator.raygroup.ram_holders import RamTier
from tests.support.ray_cluster import RunningCluster, emulated_cluster

log = structlog.get_logger(__name__)

DEVICES_PER_HOST = 1
"""What ``fault_config``'s runs give each host (see ``BASE_OVERRIDES``)."""

BASE_OVERRIDES = (
    "run.total_steps=20",
    "run.steps_per_call=5",
    "controller.checkpoint_interval.every_steps=5",
    "cluster.mode=emulate",
    "cluster.emulate.slices=1",
    "cluster.emulate.hosts_per_slice=2",
    # One CPU device per host: a slice of 2 hosts still shards the state over its 2 processes,
    # and each collective has 2 gloo ranks instead of 4. On shared cores a collective costs
    # several times its CPU on idle ones (2,000 psums of 2 processes: 1.8 CPU-s alone, 7.7
    # beside a busy loop; waiting for a sleeping peer costs nothing), so
    # tests/faults/test_group_faults.py took 124 CPU-s instead of 146 beside a busy loop.
    # Modules whose slices have one host ask for 2 devices
    # (``cluster.emulate.devices_per_host=2``) to shard within a slice.
    f"cluster.emulate.devices_per_host={DEVICES_PER_HOST}",
    "model.num_layers=1",
    "model.d_model=32",
    "model.d_ff=64",
    "model.num_heads=2",
    "model.seq_len=16",
    "model.vocab_size=64",
    "train.global_batch=8",
    "train.warmup_steps=2",
    "timeouts.init_s=60",
    "timeouts.heartbeat_s=5",
    "timeouts.step_s=20",
    "timeouts.compile_s=240",
    "timeouts.restore_s=120",
    "timeouts.save_s=30",
    "controller.backoff.base_s=0.2",
    "controller.backoff.max_s=1",
    "controller.max_wait_for_capacity_s=5",
    "events.metadata.enabled='off'",
    "events.inbox=false",
    # No standbys unless a test asks (``controller.warm.standby_slices=1``): on a cluster with
    # a spare slice the default starts a standby on every spare host and pre-forms the next
    # group there (a second JAX runtime, compile and step), which doubles the processes of
    # every run and proves nothing a test of another path asserts.
    "controller.warm.standby_slices=0",
)


def fault_config(run_dir: Path, *overrides: str,
                 chaos: Sequence[ChaosFaultConfig] = ()) -> RunConfig:
    """The small fault-test run (20 steps, save every 5, 1 slice × 2 hosts × 1 device).

    ``chaos`` is set on the built config, so kinds the YAML surface does not list yet (e.g.
    ``hang_init``) can be injected too.
    """
    cfg = load_config(None, [f"run.run_dir={run_dir}", *BASE_OVERRIDES, *overrides])
    if chaos:
        ctl = dataclasses.replace(cfg.controller, chaos=tuple(chaos))
        cfg = dataclasses.replace(cfg, controller=ctl)
    return cfg


@dataclass
class Action:
    """Run ``fn(controller)`` once the controller reached ``step``."""

    step: int
    fn: Callable[[Controller], None]
    name: str = ""
    fired_at: float | None = None


@dataclass
class RunResult:
    summary: RunSummary
    controller: Controller
    final_params: dict[str, np.ndarray] | None
    actions: list[Action] = field(default_factory=list)
    host_pids: list[int] = field(default_factory=list)
    """Every host actor process the run started."""
    ram_stats: dict[str, dict] = field(default_factory=dict)
    """What each RAM-tier holder kept at the end (node id -> copies, bytes)."""

    @property
    def timeline(self) -> list[dict]:
        path = self.controller.run_state.run_dir / "timeline.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @property
    def states(self) -> list[str]:
        return [t["state"] for t in self.timeline]

    def restored_steps(self) -> list[int | None]:
        """The checkpoint step each incarnation restored (None = fresh start)."""
        return [r.get("restored_step") for r in self.restores]

    @property
    def restores(self) -> list[dict]:
        return self.controller.run_state.ledger.restores


@contextmanager
def started_cluster(**kwargs: Any) -> Iterator[RunningCluster]:
    """``emulated_cluster`` with one retry: on a loaded machine a raylet can miss its startup
    deadline, which says nothing about the code under test."""
    for attempt in (1, 2):
        ctx = emulated_cluster(**kwargs)
        try:
            running = ctx.__enter__()  # a failed start tears its half-built cluster down
        except Exception as exc:
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            log.warning("cluster_start_retry", error=str(exc))
            continue
        try:
            yield running
        finally:
            ctx.__exit__(None, None, None)
        return


def run_controller(cfg: RunConfig, *, actions: Sequence[Action] = (), intake: Any = None,
                   collect_params: bool = False, timeout_s: float = 400.0,
                   release_ram: bool = True,
                   listeners: Sequence[RunListener] | None = None) -> RunResult:
    """Run to a terminal state; fire each of ``actions`` once when its step is reached.
    ``release_ram`` False leaves the RAM tier's holders up, as a driver that died would.
    ``listeners``: the controller's (``RunListener``s, run in its thread; default: the
    config's, i.e. its chaos); the harness adds one that gathers the final parameters."""
    box: dict[str, Any] = {}

    class FinalParams(RunListener):
        def on_final_group(self, group: Any) -> None:
            if collect_params:
                box["params"] = flatten(group.final_params())

    cluster = RayClusterView()
    pids: list[int] = []
    group_cls = type("RecordingGroup", (RecordingGroup,), {"pids": pids})
    ram = RamTier.for_config(cfg)
    groups = ray_group_factory(cfg, cluster, group_cls=group_cls, ram=ram)
    if listeners is None:
        listeners = from_config(cfg).listeners
    ctl = Controller(cfg, run_dir=Path(cfg.run.run_dir), cluster=cluster, make_group=groups,
                     intake=intake, listeners=[*listeners, FinalParams()])
    todo = sorted(actions, key=lambda a: a.step)
    box_out: dict[str, Any] = {}

    def drive() -> None:
        try:
            box_out["summary"] = ctl.run()
        except BaseException as exc:  # re-raised in the test's thread
            box_out["error"] = exc

    # Ray only adds/removes nodes from the main thread (signal handlers), so the controller
    # runs in a thread and the actions run here.
    runner = threading.Thread(target=drive, name="controller", daemon=True)
    runner.start()
    deadline = time.monotonic() + timeout_s
    pending = list(todo)
    while runner.is_alive() and time.monotonic() < deadline:
        if pending and ctl.run_state.ledger.step >= pending[0].step:
            a = pending.pop(0)
            log.info("test_action", name=a.name, at_step=ctl.run_state.ledger.step)
            a.fn(ctl)
            a.fired_at = time.time()
        runner.join(0.05)
    if runner.is_alive():
        raise AssertionError(f"the run did not end within {timeout_s:.0f}s")
    groups.close()  # warm processes kept between groups
    if ram is not None:  # the holders write durable saves at low priority: count them done
        ram.flush()
    ram_stats = ram.stats() if ram is not None else {}
    if ram is not None and release_ram:
        ram.release()  # the next test of the module's cluster starts with none
    if "error" in box_out:
        raise box_out["error"]
    return RunResult(summary=box_out["summary"], controller=ctl, final_params=box.get("params"),
                     actions=list(todo), host_pids=pids, ram_stats=ram_stats)


def flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k in sorted(tree):
        key = f"{prefix}/{k}" if prefix else str(k)
        v = tree[k]
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = np.asarray(v)
    return out


class RecordingGroup(RayWorkerGroup):
    """The real worker group, remembering the pid of every host actor it started."""

    pids: list[int] = []  # replaced per run by ``run_controller``

    def _start(self) -> None:
        super()._start()
        try:
            infos = ray.get([a.info.remote() for a in self.actors], timeout=120)
        except Exception as exc:  # an actor that cannot start is not a process to check
            log.warning("pid_probe_failed", error=str(exc))
            return
        self.pids.extend(int(i["pid"]) for i in infos)


def alive_host_processes(pids: Sequence[int], *, timeout_s: float = 30.0) -> list[int]:
    """Host actor processes of ``pids`` still running (not reaped or zombie) after a grace."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def print_recovery(label: str, result: RunResult) -> None:
    """The measured phase breakdown of each recovery (shown with ``pytest -s``)."""
    for r in result.summary.recoveries:
        phases = ", ".join(f"{k}={v:.2f}s" for k, v in r.get("phases_s", {}).items())
        print(f"\n[{label}] {r['kind']} recovery ({r['cause']}): "
              f"to first step {r.get('to_first_step_s', float('nan')):.2f}s; {phases}; "
              f"save {r.get('save_s', 0.0):.2f}s; lost {r.get('lost_steps', 0)} step(s)")
