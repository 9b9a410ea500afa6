"""A pre-formed group: when the standbys of spare slices can hold the whole mesh, they join
their own JAX runtime for that mesh while the group trains, build and load the step and run it
once (``HostActor.preform``). A re-form onto exactly that mesh (a notice or a failure that
moves a one-slice job to its spare slice) then adopts them and only restores: no runtime to
join, no step to load, and no slow first step (XLA:CPU's first run of an executable is slower
than the steps after it; measured in bench/RESULTS.md).

Everything here is an optimisation: a mesh that differs from the pre-formed one, a pre-form
that failed or did not finish in time, and the standbys are replaced by fresh processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import structlog

from orchestrator.controller.seam import GroupSpec
from orchestrator.shared.errors import ConfigError, TopologyError
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MeshPlan, plan_mesh

log = structlog.get_logger(__name__)

ADOPT_WAIT_S = 30.0
"""How long a re-form waits for a pre-form still in flight (as long as for a standby's rejoin:
the pre-form is that rejoin and a few seconds more)."""


def spare_plan(spec: GroupSpec) -> MeshPlan | None:
    """The mesh the complete standby slices would form if the whole of ``spec``'s mesh moved
    there (what planning makes of them: ``plan_mesh`` with this mesh's config), or None when
    the standbys cannot hold it."""
    plan = spec.plan
    per_slice = plan.num_processes // plan.num_slices
    try:
        spare = plan_mesh(spec.cfg, spec.standby, platform=plan.platform,
                          hosts_per_slice=per_slice, max_slices=plan.num_slices)
    except (TopologyError, ConfigError):  # no complete spare slice, or fewer than the mesh's
        return None
    return spare if spare.num_slices == plan.num_slices else None


@dataclass
class Preformed:
    """One pre-form in flight or done: each host's spec and env (plan order), its process and
    its ``preform`` call."""

    specs: list[HostSpec]
    envs: list[dict[str, str]]
    actors: list[Any]
    refs: list[Any]
    started: float = field(default_factory=time.monotonic)

    @property
    def node_ids(self) -> list[str]:
        return [s.host.node_id for s in self.specs]

    def done(self) -> bool:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def succeeded(self, timeout_s: float) -> bool:
        """Whether every host's pre-form ended well within ``timeout_s`` (logged either way)."""
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
        if len(ready) < len(self.refs):
            log.warning("preform_unfinished", waited_s=timeout_s)
            return False
        try:
            outs = ray.get(self.refs)
        except Exception as exc:  # a standby died or its runtime failed: fresh processes
            log.warning("preform_failed", error=str(exc)[:300])
            return False
        log.info("preformed", hosts=len(outs),
                 preform_s=round(max(o["preform_s"] for o in outs), 3),
                 first_run_s=round(max(o["first_run_s"] for o in outs), 3),
                 source=outs[0]["source"])
        return True


def start(actors: Sequence[Any], specs: list[HostSpec], envs: list[dict[str, str]]) -> Preformed:
    """Fire every standby's ``preform``, never waiting: process 0 picks the coordinator's port
    on its host and Ray hands it to every call once picked (a standby still importing JAX
    does that first, in ``preform``; a client that finds no service yet retries)."""
    coordinator = actors[0].coordinator_address.remote(specs[0].host.node_ip)
    n = len(actors)
    refs = [a.preform.remote(s, e, coordinator, n, i)
            for i, (a, s, e) in enumerate(zip(actors, specs, envs, strict=True))]
    log.info("preform_started", hosts=n, slices=list(specs[0].plan.slice_names))
    return Preformed(specs=list(specs), envs=list(envs), actors=list(actors), refs=refs)


def matches(preformed: Preformed, specs: Sequence[HostSpec],
            envs: Sequence[dict[str, str]]) -> bool:
    """Whether a group of ``specs`` and ``envs`` is exactly the pre-formed one (the same hosts
    in the same order, mesh, config, run: everything a host was built from)."""
    return list(specs) == preformed.specs and list(envs) == preformed.envs
