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
        group.shutdown(graceful=True, timeout_s=timeout_s)
    finally:
        group.shutdown()
    return GroupRun(plan=plan, init=init, restored_step=restored[0]["restored_step"],
                    start_step=restored[0]["step"], final_step=until,
                    losses=[r["loss"] for r in results[0]["records"]], params=flatten(params),
                    compile=compiled[0])


@dataclass(frozen=True)
class ReferenceRun:
    losses: np.ndarray
    params: dict[str, np.ndarray]


def single_process(tmp: Path, *, devices: int, steps: int, overrides: list[str]) -> ReferenceRun:
    """The same config trained in one plain process with ``devices`` CPU devices."""
    out = tmp / f"reference-{devices}-{steps}-{abs(hash(tuple(overrides)))}.npz"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.single_process", "--devices", str(devices),
         "--steps", str(steps), "--out", str(out), *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as z:
        params = {k.removeprefix("param:"): z[k] for k in z.files if k.startswith("param:")}
        return ReferenceRun(losses=z["losses"], params=params)


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
               for k in a)


def bit_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
