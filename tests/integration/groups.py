"""Drive one JAX group through the real WorkerGroup (Ray actors) the way the controller does."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from orchestrator.config import RunConfig
from orchestrator.hosts import HostRef
from orchestrator.plan import MeshPlan, plan_mesh
from orchestrator.worker_group import WorkerGroup
from tests.integration.single_process import flatten

REPO = Path(__file__).resolve().parents[2]


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


def train_group(cfg: RunConfig, hosts: list[HostRef], run_dir: Path, *, until: int,
                checkpoint_every: int, hosts_per_slice: int, incarnation: int = 1,
                timeout_s: float = 300.0) -> GroupRun:
    """Form a group on ``hosts``, restore (or seed), train to ``until``, gather params, release.

    The group is always shut down (graceful: pending async saves finish first), so the next
    group on the same run_dir sees committed checkpoints only.
    """
    plan = plan_mesh(cfg, hosts, platform="cpu", hosts_per_slice=hosts_per_slice)
    group = WorkerGroup(cfg, plan, run_dir=run_dir, incarnation=incarnation)
    try:
        group.start()
        init = group.initialize()
        restored = group.build_and_restore(accum_steps=1)
        compiled = group.compile()
        results = ray.get(group.run_steps(until, checkpoint_every=checkpoint_every),
                          timeout=timeout_s)
        assert {r["step"] for r in results} == {until}, results
        params = group.call_all("params", timeout_s=timeout_s)[0]
        mesh = group.call_all("mesh_info", timeout_s=timeout_s)
        assert all(m == mesh[0] for m in mesh), "hosts disagree about the mesh"
        group.shutdown(graceful=True, timeout_s=timeout_s)
    finally:
        group.shutdown()
    return GroupRun(plan=plan, init=init, restored_step=restored[0]["restored_step"],
                    start_step=restored[0]["step"], final_step=until,
                    losses=[r["loss"] for r in results[0]["records"]], params=flatten(params),
                    compile=compiled[0], mesh=mesh[0])


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


def bit_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
