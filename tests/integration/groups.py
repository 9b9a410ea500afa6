"""Drive one JAX group of host actors through the actor contract, the way the driver does.

No controller and no driver seam: these helpers create the Ray actors from ``HostSpec`` and
call the host API directly (initialize, build, restore, compile, run_steps, save, ...), so the
integration tests check the host side on real Ray, JAX and Orbax.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.config import RunConfig
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.host_env import device_env, store_dir
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MeshPlan, plan_mesh
from tests.integration.single_process import flatten
from workers.host.actor import HostActor

REPO = Path(__file__).resolve().parents[2]

_RemoteHost = ray.remote(HostActor)


class Group:
    """One JAX group: an actor per host of ``plan``, pinned to its node, built from specs."""

    def __init__(self, cfg: RunConfig, hosts: Sequence[HostRef], run_dir: Path, *,
                 hosts_per_slice: int, timeout_s: float = 300.0,
                 survive_peers: bool = False) -> None:
        self.plan = plan_mesh(cfg, hosts, platform="cpu", hosts_per_slice=hosts_per_slice)
        self.timeout_s = timeout_s
        ckpt = str(run_dir / "checkpoints")
        # the store a run of this config uses (the suite's shared one): a group of a mesh seen
        # before loads its step, as the driver's groups do
        store = store_dir(cfg.compile.dir, run_dir, os.environ)
        self.actors: list[Any] = []
        self.specs: list[HostSpec] = []
        for h in self.plan.hosts:
            env = device_env(platform="cpu", devices_per_host=h.devices)
            spec = HostSpec.for_host(cfg, self.plan, h, checkpoint_dir=ckpt,
                                     executables_dir=store, survive_peers=survive_peers)
            self.specs.append(spec)
            self.actors.append(_RemoteHost.options(
                num_cpus=0, resources={"TPU": h.devices}, max_concurrency=4, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=h.node_id,
                                                                   soft=False),
                runtime_env={"env_vars": env}).remote(spec, env))

    def call(self, method: str, *args: Any, **kw: Any) -> list[Any]:
        """Call ``method`` on every host at once and wait; an OrchestratorError raised in an
        actor is re-raised as itself (not wrapped in Ray's RayTaskError)."""
        return self.get([getattr(a, method).remote(*args, **kw) for a in self.actors])

    def get(self, refs: Sequence[Any]) -> list[Any]:
        try:
            return ray.get(list(refs), timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, OrchestratorError):
                raise exc.cause from None
            raise

    def initialize(self) -> list[dict]:
        coord = ray.get(self.actors[0].coordinator_address.remote(), timeout=self.timeout_s)
        return self.get([a.initialize.remote(coord, len(self.actors), i)
                         for i, a in enumerate(self.actors)])

    def form(self, *, skip_steps: Sequence[int] = ()) -> tuple[list[dict], list[dict]]:
        """initialize, build and restore; returns (init results, restore results)."""
        init = self.initialize()
        self.call("build")
        return init, self.call("restore", list(skip_steps))

    def kill(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(a, no_restart=True)
        self.actors = []


@dataclass(frozen=True)
class GroupRun:
    """What one incarnation did: where it started, its losses and final parameters."""

    plan: MeshPlan
    init: list[dict]
    restored_step: int | None
    start_step: int
    final_step: int
    losses: list[float]
    params: dict[str, np.ndarray]
    compile: dict
    mesh: dict
    result: dict
    """Host 0's run_steps result."""


def train_group(cfg: RunConfig, hosts: list[HostRef], run_dir: Path, *, until: int,
                save_steps: Sequence[int], hosts_per_slice: int, timeout_s: float = 300.0
                ) -> GroupRun:
    """Form a group on ``hosts``, restore (or seed), train to ``until``, gather params, release.

    Saves after the steps in ``save_steps`` (the driver's choice). The group is always shut
    down (graceful: pending async saves finish first), so the next group on the same run_dir
    sees committed checkpoints only.
    """
    group = Group(cfg, hosts, run_dir, hosts_per_slice=hosts_per_slice, timeout_s=timeout_s)
    try:
        init, restored = group.form()
        compiled = group.call("compile")
        results = group.get([a.run_steps.remote(until, chunk=1, save_steps=list(save_steps),
                                                report=(i == 0))
                             for i, a in enumerate(group.actors)])
        assert {r["step"] for r in results} == {until}, results
        params = group.call("params")[0]  # a collective: every host gathers
        mesh = group.call("mesh_info")
        assert all(m == mesh[0] for m in mesh), "hosts disagree about the mesh"
        group.call("shutdown")
    finally:
        group.kill()
    return GroupRun(plan=group.plan, init=init, restored_step=restored[0]["restored_step"],
                    start_step=restored[0]["step"], final_step=until,
                    losses=[r["loss"] for r in results[0]["records"]], params=flatten(params),
                    compile=compiled[0], mesh=mesh[0], result=results[0])


@dataclass(frozen=True)
class ReferenceRun:
    losses: np.ndarray
    params: dict[str, np.ndarray]


class References:
    """Single-process reference runs, started in the background so they overlap cluster work.

    One subprocess with ``devices`` CPU devices trains the base config and every variant
    (name -> extra overrides); ``get(name)`` waits for it and loads that run's results.
    """

    def __init__(self, tmp: Path, *, devices: int, steps: int, overrides: list[str],
                 variants: dict[str, list[str]]) -> None:
        self.out = tmp / "reference.npz"
        self.log = tmp / "reference.log"
        cmd = [sys.executable, "-m", "tests.integration.single_process", "--devices",
               str(devices), "--steps", str(steps), "--out", str(self.out)]
        for name, extra in variants.items():
            cmd += ["--variant", f"{name}={','.join(extra)}"]
        self._logfile = self.log.open("w")
        self.proc = subprocess.Popen([*cmd, *overrides], cwd=REPO, stdout=self._logfile,
                                     stderr=subprocess.STDOUT)

    def get(self, name: str | None = None, *, timeout_s: float = 600.0) -> ReferenceRun:
        code = self.proc.wait(timeout=timeout_s)
        assert code == 0, self.log.read_text()[-3000:]
        path = self.out if name is None else self.out.with_suffix(f".{name}.npz")
        with np.load(path) as z:
            params = {k.removeprefix("param:"): z[k] for k in z.files if k.startswith("param:")}
            return ReferenceRun(losses=z["losses"], params=params)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._logfile.close()


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    assert {k: a[k].shape for k in a} == {k: b[k].shape for k in b}
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
               for k in a)

