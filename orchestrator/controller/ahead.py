"""Compile ahead: while a group of several slices trains with no spare slice, ask it to compile
the step of the mesh an elastic shrink would form (one slice fewer), so an announced shrink
loads that step instead of compiling it inside its downtime.

The spec is built the way PLANNING builds a shrink's (``planning.resized_cfg``, ``plan_mesh``
over the first slices): whichever slice goes, the survivors' group has the same shape, config
and process count, which is all its executables' key holds besides the runtime (the key check
in ``workers.training.executables`` refuses anything else: a miss compiles, as without this).
"""

from __future__ import annotations

from orchestrator.controller.context import Run, log
from orchestrator.controller.planning import complete_slices, resized_cfg, usable_hosts
from orchestrator.controller.seam import CompilesAhead, GroupSpec
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.plan import plan_mesh


def shrink_spec(run: Run) -> GroupSpec | None:
    """The spec of the group a shrink by one slice would form now, or None when there is no
    such shrink (one slice, elastic off or at ``min_slices``, the resize policy refuses)."""
    p = run.placement
    plan, elastic = p.plan, run.ctl.elastic
    if plan is None or not elastic.enabled or plan.num_slices - 1 < max(1, elastic.min_slices):
        return None
    slices, hps = plan.num_slices - 1, plan.hosts_per_slice
    try:
        cfg, batch = resized_cfg(run, slices, hps)
        smaller = plan_mesh(cfg, plan.hosts, platform=plan.platform, hosts_per_slice=hps,
                            max_slices=slices)
    except OrchestratorError as exc:  # the resize policy or the mesh refuses that shrink
        log.info("compile_ahead_skipped", reason=str(exc))
        return None
    return GroupSpec(plan=smaller, cfg=cfg, incarnation=run.ledger.incarnation,
                     run_dir=str(run.run_dir), accum_steps=batch.accum_steps if batch else 1)


RECHECK_S = 10.0
"""While spares exist the next mesh is not a shrink; how often RUNNING looks again."""


def maybe_start(run: Run, *, force_check: bool = False) -> None:
    """Ask the running group to compile a shrink's step in the background (``compile.ahead``),
    once per group, and only while a notice would shrink the run: with a spare slice or a
    standby the next mesh has the same size (its step is stored already), and a compile in
    flight is waited for when the group leaves. Looked at after COMPILING and, while spares
    exist, every ``RECHECK_S`` in RUNNING (capacity comes and goes)."""
    p, group = run.placement, run.group
    if run.pending is not None or p.ahead_for == run.ledger.incarnation \
            or not run.cfg.compile.ahead or run.cfg.compile.cache != "on" \
            or not isinstance(group, CompilesAhead):
        return  # with a drain pending, the group leaves soon: it would wait for the compile
    now = run.now()
    if not force_check and p.ahead_checked_at is not None and now - p.ahead_checked_at < RECHECK_S:
        return
    p.ahead_checked_at = now
    spec = shrink_spec(run)
    if spec is None:
        p.ahead_for = run.ledger.incarnation  # nothing to compile for this group
        return
    if _spares(run):
        return
    p.ahead_for = run.ledger.incarnation
    started = group.compile_ahead(spec)
    log.info("compile_ahead", slices=spec.plan.num_slices, processes=spec.plan.num_processes,
             started=started)


def _spares(run: Run) -> list[str]:
    """Complete slices, alive now, that a notice's re-form would use instead of shrinking (a
    standby's slice is one of them while its hosts are up)."""
    plan = run.placement.plan
    assert plan is not None
    current = set(plan.slice_names)
    return [s for s in complete_slices(usable_hosts(run), plan.hosts_per_slice)
            if s not in current]


def guarded(run: Run, *, force_check: bool = False) -> None:
    """``maybe_start``, logged instead of raised: an optimisation never stops a healthy group."""
    try:
        maybe_start(run, force_check=force_check)
    except Exception as exc:
        run.placement.ahead_for = run.ledger.incarnation  # once per group, not every re-check
        log.warning("compile_ahead_failed", error=f"{type(exc).__name__}: {exc}")
