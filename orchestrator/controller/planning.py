"""PLANNING: choose the slices to form on from the hosts alive now.

The placement policy decides form / shrink / wait / fail; this module only gathers the facts
(complete, healthy, not excluded slices) and builds the mesh plan and the config for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from orchestrator.config import RunConfig
from orchestrator.controller import stopping
from orchestrator.controller.context import Next, Run, log
from orchestrator.lifecycle import Failed, RunState, WaitingForCapacity
from orchestrator.shared.errors import TopologyError
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import plan_mesh
from policies.preemption import PlacementKind, PlacementObservation
from policies.resize import BatchPlan, ResizeObservation

S = RunState


def complete_slices(hosts: Sequence[HostRef], hosts_per_slice: int) -> list[str]:
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h.slice_name] = counts.get(h.slice_name, 0) + 1
    return sorted(s for s, n in counts.items() if n >= hosts_per_slice)


def usable_hosts(run: Run) -> list[HostRef]:
    return [h for h in run.cluster.hosts() if h.node_id not in run.placement.excluded]


def hosts_per_slice(run: Run, hosts: Sequence[HostRef]) -> int:
    c = run.cfg.cluster
    if c.mode != "tpu":
        return c.emulate.hosts_per_slice
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h.slice_name] = counts.get(h.slice_name, 0) + 1
    return max(counts.values()) if counts else 1


def initial_target_slices(cfg: RunConfig, hosts: Sequence[HostRef]) -> int:
    c = cfg.cluster
    if c.slices:
        return c.slices
    if c.mode != "tpu":
        return c.emulate.slices
    return max(1, len({h.slice_name for h in hosts}))


def planning(run: Run) -> Next:
    stop = stopping.stop_requested(run)
    if stop is not None:
        return stop
    p = run.placement
    hosts = usable_hosts(run)
    hps = p.hosts_per_slice or hosts_per_slice(run, hosts)
    now = run.now()
    available = hot_swap(run, complete_slices(hosts, hps))
    warm = {h.slice_name for h in p.standby} | (
        {h.slice_name for h in p.plan.hosts} if p.plan is not None else set())
    decision = run.policies.placement.decide(PlacementObservation(
        now=now, available_slices=tuple(available),
        target_slices=p.target_slices, waiting_since=p.waiting_since,
        warm_slices=tuple(sorted(warm))))
    if decision.kind in (PlacementKind.FORM, PlacementKind.SHRINK):
        wanted = set(decision.slices)  # a set: hosts x slices comparisons at pod scale
        chosen = [h for h in hosts if h.slice_name in wanted]
        try:
            cfg = cfg_for(run, len(decision.slices), hps)
            plan = plan_mesh(cfg, chosen, platform=run.cluster.platform(), hosts_per_slice=hps)
        except TopologyError as exc:
            return Next(S.FAILED, str(exc), Failed(reason=str(exc)))
        if p.plan is not None and plan.num_slices != p.plan.num_slices:
            p.last_resize_at = now
        p.plan, p.mesh_cfg, p.hosts_per_slice, p.waiting_since = plan, cfg, hps, None
        p.standby = standby_hosts(run, hosts, complete_slices(hosts, hps), wanted)
        return Next(S.FORMING, decision.reason)
    if decision.kind is PlacementKind.WAIT_FOR_REPLACEMENT:
        if p.waiting_since is None:
            p.waiting_since = now
        return Next(S.WAITING_FOR_CAPACITY, decision.reason,
                     WaitingForCapacity(deadline=decision.until or now,
                                        needed_slices=decision.needed))
    cause = run.pending.cause if run.pending else None
    return Next(S.FAILED, decision.reason, Failed(reason=decision.reason, cause=cause))


def hot_swap(run: Run, complete: list[str]) -> list[str]:
    """A slice whose host just failed is left out when a warm standby slice can take its place
    and the run still gets its target: the standby is ready now, the failed slice (its node
    may still be up) becomes a spare and gets a standby itself. Without a standby nothing
    changes: the failed slice is re-formed as before."""
    p = run.placement
    suspect, p.suspect = p.suspect, set()
    warm = {h.slice_name for h in p.standby} & set(complete)
    if not suspect or not warm:
        return complete
    kept = [s for s in complete if s not in suspect]
    if len(kept) < p.target_slices:
        return complete
    log.info("hot_swap", failed=sorted(suspect), standby=sorted(warm))
    return kept


def standby_hosts(run: Run, hosts: Sequence[HostRef], complete: Sequence[str],
                  used: set[str]) -> tuple[HostRef, ...]:
    """The hosts of the complete spare slices that keep standby processes
    (``controller.warm.standby_slices``: all of them under ``auto``)."""
    spare = [s for s in complete if s not in used]
    spare = spare[:run.ctl.warm.standby_count(len(spare))]
    return tuple(h for h in hosts if h.slice_name in set(spare))


def cfg_for(run: Run, slices: int, hps: int) -> RunConfig:
    """The config for a mesh of ``slices`` slices: global batch and LR per the resize policy."""
    cfg, decision = resized_cfg(run, slices, hps)
    run.placement.batch_plan = decision
    if decision is not None:
        log.info("batch_on_resize", mode=decision.mode.value, global_batch=decision.global_batch,
                 accum_steps=decision.accum_steps, lr_scale=decision.lr_scale,
                 reason=decision.reason)
    return cfg


def resized_cfg(run: Run, slices: int, hps: int) -> tuple[RunConfig, BatchPlan | None]:
    """``cfg_for`` without recording anything: also asked for a mesh the run may form next.
    Raises ``TopologyError`` when the resize policy refuses ``slices``."""
    p = run.placement
    cfg = run.cfg
    if slices == p.target_slices:
        return cfg, None
    dev = p.plan.devices_per_host if p.plan else cfg.cluster.emulate.devices_per_host
    base = cfg.validate_for(slices=p.target_slices, hosts_per_slice=hps, devices_per_host=dev)
    new = cfg.mesh.resolve(slices=slices, devices_per_slice=hps * dev)
    decision = run.policies.resize.decide(ResizeObservation(
        base_global_batch=cfg.train.global_batch, base_dp=base.batch_parallel,
        new_dp=new.batch_parallel, processes=slices * hps))
    if not isinstance(decision, BatchPlan):
        raise TopologyError(decision.reason, fix=decision.fix)
    train = dataclasses.replace(cfg.train, global_batch=decision.global_batch,
                                learning_rate=cfg.train.learning_rate * decision.lr_scale)
    return dataclasses.replace(cfg, train=train), decision
