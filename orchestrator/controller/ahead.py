"""Compile ahead: once a group of several slices trains, ask it to compile the step of the mesh
an elastic shrink would form (one slice fewer), so an announced shrink loads that step instead
of compiling it inside its downtime.

The spec is built the way PLANNING builds a shrink's (``planning.resized_cfg``, ``plan_mesh``
over the first slices): whichever slice goes, the survivors' group has the same shape, config
and process count, which is all its executables' key holds besides the runtime (the key check
in ``workers.executables`` refuses anything else: a miss compiles, as without this).
"""

from __future__ import annotations

from orchestrator.controller.context import Run, log
from orchestrator.controller.planning import resized_cfg
from orchestrator.controller.seam import GroupSpec
from orchestrator.errors import TopologyError
from orchestrator.plan import plan_mesh


def shrink_spec(run: Run) -> GroupSpec | None:
    """The spec of the group a shrink by one slice would form now, or None when there is no
    such shrink (one slice, elastic off or at ``min_slices``, the resize policy refuses)."""
    p = run.placement
    plan, elastic = p.plan, run.ctl.elastic
    if plan is None or not elastic.enabled or plan.num_slices - 1 < max(1, elastic.min_slices):
        return None
    slices = plan.num_slices - 1
    hps = p.hosts_per_slice or len(plan.hosts) // plan.num_slices
    try:
        cfg, batch = resized_cfg(run, slices, hps)
        smaller = plan_mesh(cfg, plan.hosts, platform=plan.platform, hosts_per_slice=hps,
                            max_slices=slices)
    except TopologyError as exc:
        log.info("compile_ahead_skipped", reason=str(exc))
        return None
    return GroupSpec(plan=smaller, cfg=cfg, incarnation=run.ledger.incarnation,
                     run_dir=str(run.run_dir), accum_steps=batch.accum_steps if batch else 1)


def start(run: Run) -> None:
    """Ask the running group to compile a shrink's step in the background (``compile.ahead``)."""
    if run.group is None or not run.cfg.compile.ahead or run.cfg.compile.cache != "on":
        return
    spec = shrink_spec(run)
    if spec is None:
        return
    started = run.group.compile_ahead(spec)
    log.info("compile_ahead", slices=spec.plan.num_slices, processes=spec.plan.num_processes,
             started=started)
