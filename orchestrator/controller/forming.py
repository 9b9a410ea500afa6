"""FORMING, RESTORING and COMPILING: bring a new group from nothing to its first step.

Each phase is one bounded call on the worker group; a failure becomes a recovery
(``recovering.after_failure``), never an exception out of the loop.
"""

from __future__ import annotations

import json

from orchestrator.controller import ahead, recovering, resuming, stopping
from orchestrator.controller.context import Next, Run, log
from orchestrator.controller.seam import Formed, GroupFailed, GroupSpec, WarmStandby
from orchestrator.lifecycle import Compiling, Restoring, RunState
from orchestrator.lifecycle.payloads import data_resumed_text
from orchestrator.shared.files import atomic_write_text, read_jsonl

S = RunState


def forming(run: Run) -> Next:
    p = run.placement
    assert p.plan is not None and p.mesh_cfg is not None
    run.ledger.incarnation += 1
    init_faults = run.listeners.init_faults(run)
    spec = GroupSpec(plan=p.plan, cfg=p.mesh_cfg, incarnation=run.ledger.incarnation,
                     run_dir=str(run.run_dir),
                     accum_steps=p.batch_plan.accum_steps if p.batch_plan else 1,
                     init_faults=tuple(init_faults), standby=p.standby)
    run.group = run.make_group(spec)
    if not isinstance(run.group, WarmStandby):
        p.standby = ()  # a seam that keeps no standby (the simulator): no hot swap onto one
    try:
        formed = run.group.form()
    except GroupFailed as exc:
        return recovering.after_failure(run, exc.status)
    log.info("group_formed", hosts=formed.hosts, metadata_watchers=formed.metadata_watchers,
             processes=formed.processes)
    run.ledger.formed(formed.processes)
    if formed.instance_ids and run.intake is not None:
        run.intake.set_instance_ids(formed.instance_ids)
    write_topology(run, formed)
    return Next(S.RESTORING, f"group of {p.plan.num_processes} hosts formed",
                Restoring(step=run.ledger.last_committed or 0))


def restoring(run: Run) -> Next:
    assert run.group is not None
    try:
        out = run.group.restore(skip_steps=sorted(run.placement.skip_steps))
    except GroupFailed as exc:
        return recovering.after_failure(run, exc.status)
    for skipped in out.skipped:
        run.placement.skip_steps.add(int(skipped["step"]))
        log.warning("checkpoint_skipped", **skipped)
    if run.ledger.recorded_upto is None:  # a driver's first restore: what an earlier one wrote
        run.ledger.recorded_upto = last_recorded_step(run)
    resuming.note_resume(run, restored_step=out.restored_step)
    lost = run.ledger.restored(restored_step=out.restored_step, step=out.step,
                               restore_s=out.restore_s, skipped=out.skipped, tier=out.tier,
                               tier_reason=out.tier_reason, nbytes=out.nbytes, data=out.data)
    if lost:
        log.warning("steps_lost", lost=lost, restored_step=out.restored_step,
                    reached=run.ledger.max_step_reached)
    reason = (f"restored step {out.restored_step} from {out.tier} tier"
              if out.restored_step is not None else "fresh start (seed)")
    if out.tier_reason:
        reason += f" ({out.tier_reason})"
    if out.skipped:
        reason += f" (skipped unreadable step(s) {[s['step'] for s in out.skipped]})"
    if out.data:
        reason += f"; {data_resumed_text(out.data)}"
    tier = out.tier if out.restored_step is not None else "seed"
    gap = run.ledger.metrics_gaps[-1] if run.ledger.metrics_gaps else None
    if gap is not None and gap[1] == out.restored_step:
        log.warning("metrics_gap", steps=gap, restored_step=out.restored_step,
                    why="trained and checkpointed, but no step record was written for them")
    return Next(S.COMPILING, reason, Compiling(tier=tier, restored_step=out.restored_step,
                                               restore_s=round(out.restore_s, 4),
                                               nbytes=out.nbytes, lost_steps=lost,
                                               data=out.data))


def compiling(run: Run) -> Next:
    group = run.group
    assert group is not None
    if (stop := stopping.stop_before_training(run)) is not None:
        return stop
    try:
        out = group.compile()
    except GroupFailed as exc:
        return recovering.after_failure(run, exc.status)
    if run.peak is None and run.listeners.wants("resolve_peak"):
        # MFU is a metric: a listener that fails to answer leaves it unknown, never stops
        run.peak = run.listeners.first("resolve_peak", group.measure_peak_flops) or (
            0.0, "unknown")
    run.ledger.compile_times.append(out.compile_s)
    run.ledger.compiles.append({"incarnation": run.ledger.incarnation,
                                "compile_s": round(out.compile_s, 3), "source": out.source,
                                "key": out.key})
    run.flops, run.tokens = out.flops, out.tokens
    log.info("compiled", compile_s=round(out.compile_s, 3), flops=out.flops, source=out.source,
             key=out.key)
    ahead.guarded(run, force_check=True)
    if out.source == "preformed":
        return Next(S.RUNNING, "step loaded and run once before the switch (pre-formed group)")
    if out.source == "loaded":
        return Next(S.RUNNING, f"step loaded from the executable store (key {out.key})")
    if out.source == "mixed":
        return Next(S.RUNNING, f"step loaded on some hosts, compiled on others (key {out.key})")
    return Next(S.RUNNING, "step compiled")


def write_topology(run: Run, formed: Formed) -> None:
    """RUN_DIR/topology.json: the mesh's hosts, the id -> name map, job and cluster, so an
    operator can ask ``python -m orchestrator.events explain --topology RUN_DIR`` what the run
    would do with a message. Evidence only: a failed write is logged."""
    plan = run.plan
    assert plan is not None
    data = {"job": run.cfg.run.name, "cluster": run.cfg.events.cluster,
            "incarnation": run.ledger.incarnation, "id_to_name": formed.instance_ids,
            "hosts": [dict(vars(h)) for h in plan.hosts]}  # flat fields: no asdict recursion
    try:
        # one host per line: readable, and compact JSON keeps the C encoder (4,096 hosts)
        body = ",\n  ".join(json.dumps(h) for h in data.pop("hosts"))
        head = json.dumps(data)[:-1]
        atomic_write_text(run.run_dir / "topology.json", f'{head}, "hosts": [\n  {body}\n]}}\n')
    except OSError as exc:
        log.error("topology_write_failed", error=str(exc))


_TAIL_BYTES = 64 * 1024


def last_recorded_step(run: Run) -> int | None:
    """The newest step in RUN_DIR/metrics.jsonl (0 when there is none yet); None when the run
    writes no metrics.jsonl (``metrics.jsonl`` off) or it cannot be read."""
    if not run.cfg.metrics.jsonl:
        return None
    best = 0  # also when there is no file yet
    try:  # a half-written line (a driver killed mid-write) is skipped
        for record in read_jsonl(run.run_dir / "metrics.jsonl", tail_bytes=_TAIL_BYTES):
            if isinstance(step := record.get("step"), int):
                best = max(best, step)
    except OSError as exc:
        log.warning("metrics_jsonl_unreadable", error=str(exc))
        return None
    return best
