"""The fault matrix, one row per fault: what is done, what should follow, and the run that
checks it (``bench/faults.py`` runs them one at a time and prints the table).

A row whose fault cannot be injected from the outside yet has ``run=None`` and says why, and a
row that needs a feature this tree lacks says so (``requires``): the table never shows a result
that was not measured.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.fault_kit import (
    Background,
    Outcome,
    cli,
    drivers,
    recovery,
    resumed_first_step,
    running_slices,
    summary_line,
    transition,
)
from bench.orchestrated import RunDir

SPARE = "cluster.emulate.spare_slices=1"
TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1")


@dataclass(frozen=True)
class Row:
    name: str
    fault: str
    expect: str
    run: Callable[[Path, float], Outcome] | None = None
    """``run(scratch dir, timeout_s)``; None: not implemented yet (``missing`` says why)."""
    missing: str = ""
    requires: str = ""
    """A module the fault's handling lives in: without it the row says not implemented yet."""
    cluster: bool = True
    """Whether it starts drivers (then it waits for an idle machine first)."""

    def unavailable(self) -> str | None:
        if self.run is None:
            return f"not implemented yet: {self.missing}"
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"not implemented yet: {self.requires} is not in this tree"
        return None


def _chaos(*faults: str) -> str:
    return "controller.chaos=[" + ", ".join("{" + f + "}" for f in faults) + "]"


def _recovered(rd: RunDir, code: int, *, cause: str, max_lost: int | None = None,
               note: str = "") -> Outcome:
    s, rec = rd.summary, recovery(rd)
    lost = s.get("lost_steps")
    ok = (code == 0 and s.get("state") == "SUCCEEDED" and cause in (s.get("restarts") or {})
          and (max_lost is None or (lost is not None and lost <= max_lost)))
    return Outcome(ok=ok, outcome=summary_line(rd) + (f"; {note}" if note else ""),
                   lost_steps=lost, to_first_step_s=rec.get("to_first_step_s"),
                   detail={"exit_code": code, "recoveries": s.get("recoveries")})


def preempt_spare(d: Path, timeout_s: float) -> Outcome:
    # long enough for the handover (training on while the spare warms up) to end in a drain
    code, rd = cli(d / "run", SPARE, "run.total_steps=100",
                   _chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 60"),
                   timeout_s=timeout_s)
    out = _recovered(rd, code, cause="spot_preemption", max_lost=0)
    out.ok = out.ok and len({tuple(t.get("slices", ())) for t in rd.timeline
                             if t.get("state") == "RUNNING"}) == 2
    return out


def preempt_no_spare(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", *TWO_SLICES, _chaos("at_step: 10, host: 1, kind: preempt, "
                                                  "deadline_s: 60"), timeout_s=timeout_s)
    out = _recovered(rd, code, cause="spot_preemption", max_lost=0,
                     note=f"slices {running_slices(rd)}")
    out.ok = out.ok and running_slices(rd)[:2] == [2, 1]
    return out


def shrink_grow(d: Path, timeout_s: float) -> Outcome:
    # the slice goes at its deadline (5 s) and is back 3 s later; the run on one slice must
    # outlast that (~0.04 s a step here) and grow back at a checkpoint
    code, rd = cli(d / "run", *TWO_SLICES, "run.total_steps=500",
                   "controller.checkpoint_interval.every_steps=25",
                   "cluster.emulate.replace_after_s=3",
                   _chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 5"),
                   timeout_s=timeout_s)
    out = _recovered(rd, code, cause="spot_preemption", note=f"slices {running_slices(rd)}")
    out.ok = out.ok and running_slices(rd)[:3] == [2, 1, 2]
    return out


def kill_9(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", _chaos("at_step: 7, host: 1, kind: kill"), timeout_s=timeout_s)
    return _recovered(rd, code, cause="host_lost", max_lost=5)


def kill_in_save(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", _chaos("at_step: 10, host: 1, kind: kill_in_save"),
                   timeout_s=timeout_s)
    return _recovered(rd, code, cause="host_lost", max_lost=5)


def hang_step(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", "timeouts.step_s=3", _chaos("at_step: 7, host: 1, kind: hang"),
                   timeout_s=timeout_s)
    hung = transition(rd, "RUNNING", "RELEASING") or {}
    reason = str(hung.get("reason", ""))
    named = "on hosts [1] (" in reason
    out = _recovered(rd, code, cause="timeout",
                     note="hang names host 1 only" if named else f"hang reason: {reason[:120]}")
    out.ok = out.ok and named
    out.detail["reason"] = reason
    return out


def hang_init(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", "timeouts.init_s=10",
                   _chaos("at_step: 0, host: 1, kind: hang_init"), timeout_s=timeout_s)
    hung = transition(rd, "FORMING", "RELEASING") or {}
    bound_s = hung.get("prev_duration_s")
    bound_s = None if bound_s is None else round(float(bound_s), 1)
    named = "on hosts [1]" in str(hung.get("reason", ""))
    out = _recovered(rd, code, cause="timeout", note=f"FORMING {bound_s} s for init_s=10"
                     + (", names host 1" if named else ""))
    out.ok = out.ok and named and bound_s is not None and bound_s < 15
    return out


def corrupt_newest(d: Path, timeout_s: float) -> Outcome:
    run = d / "run"
    code, rd = cli(run, "run.total_steps=10", timeout_s=timeout_s)
    shards = sorted((run / "checkpoints" / "10" / "state").glob("ocdbt.process_1/d/*"))
    if code != 0 or not shards:
        return Outcome(ok=False, outcome=f"setup failed: exit {code}, {len(shards)} shards")
    for f in shards:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, rd = cli(run, "run.total_steps=20", timeout_s=timeout_s)
    s = rd.summary
    restores = s.get("restores") or [{}]
    skipped = [k.get("step") for k in restores[0].get("skipped", [])]
    ok = code == 0 and s.get("state") == "SUCCEEDED" and restores[0].get("restored_step") == 5
    return Outcome(ok=ok and skipped == [10], lost_steps=s.get("lost_steps"),
                   outcome=f"{summary_line(rd)}; restored step "
                           f"{restores[0].get('restored_step')}, skipped {skipped}",
                   to_first_step_s=None, detail={"restores": restores})


def driver_sigkill(d: Path, timeout_s: float) -> Outcome:
    """SIGKILL the driver mid-run, count what outlives it, then run the command again (what
    autoresume resubmits). Lost steps: the step the driver had seen minus the step restored
    (the hosts may finish and save a chunk the driver never heard of: then 0)."""
    run = d / "run"
    bg = Background.start(run, "run.total_steps=60")
    try:
        if not bg.wait_step(12, timeout_s):
            return Outcome(ok=False, outcome=f"never reached step 12: {bg.log_tail(300)}")
        reached = bg.step()
        os.kill(bg.proc.pid, signal.SIGKILL)
        killed_at = time.time()
        bg.wait(30)
        left = bg.leftovers(20.0)
    finally:
        bg.end()
    code, rd = cli(run, "run.total_steps=60", timeout_s=timeout_s)
    restores = rd.summary.get("restores") or [{}]
    restored = restores[0].get("restored_step")
    ok = not left and code == 0 and rd.summary.get("state") == "SUCCEEDED"
    return Outcome(ok=ok, outcome=f"{len(left)} process(es) outlived the driver by 20 s; "
                                  f"resumed: {summary_line(rd)} from step {restored}",
                   lost_steps=max(0, reached - restored) if restored is not None else None,
                   to_first_step_s=resumed_first_step(rd, killed_at),
                   detail={"leftovers": left, "reached": reached, "restored": restored})


def two_drivers(d: Path, timeout_s: float) -> Outcome:
    run = d / "run"
    first = Background.start(run, "run.total_steps=60")
    try:
        if not first.wait_step(5, timeout_s):
            return Outcome(ok=False, outcome=f"first driver never ran: {first.log_tail(300)}")
        code2, _ = cli(run, "run.total_steps=60", timeout_s=120)
        code1 = first.wait(timeout_s)
    finally:
        first.end()
    rd = RunDir.read(run)
    ok = code2 == 2 and code1 == 0 and rd.summary.get("state") == "SUCCEEDED"
    return Outcome(ok=ok, outcome=f"second driver exit {code2}; first: {summary_line(rd)}",
                   lost_steps=rd.summary.get("lost_steps"))


def sigterm(d: Path, timeout_s: float) -> Outcome:
    run = d / "run"
    bg = Background.start(run, "run.total_steps=60")
    try:
        if not bg.wait_step(12, timeout_s):
            return Outcome(ok=False, outcome=f"never reached step 12: {bg.log_tail(300)}")
        os.kill(bg.proc.pid, signal.SIGTERM)
        at = time.time()
        code = bg.wait(120)
        left = bg.leftovers(20.0)
    finally:
        bg.end()
    stopped = RunDir.read(run).summary
    code2, rd = cli(run, "run.total_steps=60", timeout_s=timeout_s)
    ok = (code == 143 and not left and code2 == 0 and rd.summary.get("state") == "SUCCEEDED")
    return Outcome(ok=ok, outcome=f"stopped: exit {code}, committed step "
                                  f"{stopped.get('last_committed_step')}, {len(left)} process(es) "
                                  f"left; resumed: {summary_line(rd)}",
                   lost_steps=stopped.get("lost_steps"),
                   to_first_step_s=resumed_first_step(rd, at))


def notice_crash(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", SPARE, _chaos("at_step: 10, host: 1, kind: kill",
                                            "at_step: 10, host: 1, kind: preempt, "
                                            "deadline_s: 60"), timeout_s=timeout_s)
    out = _recovered(rd, code, cause="spot_preemption", max_lost=5)
    out.ok = out.ok and "host_lost" not in (rd.summary.get("restarts") or {})
    return out


def decision_drain_kill(d: Path, timeout_s: float) -> Outcome:
    """A notice decided on (a handover keeps the drain away for a while), the driver SIGKILLed
    before its drain; the next driver must still not train on the noticed slice."""
    run = d / "run"
    extra = (SPARE, "run.total_steps=200", "controller.warm.handover_max_s=60",
             _chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 120"))
    bg = Background.start(run, *extra)
    try:
        bg.wait_step(10, timeout_s)
        until = time.monotonic() + 60
        while time.monotonic() < until and bg.proc.poll() is None and not _states(run) & {
                "HANDING_OVER", "DRAINING"}:
            time.sleep(0.05)
        reached = bg.step()
        os.kill(bg.proc.pid, signal.SIGKILL)  # the decision is made: training on, no drain yet
        killed_at = time.time()
        bg.wait(30)
    finally:
        bg.end()
    if "HANDING_OVER" not in _states(run) or "DRAINING" in _states(run):
        return Outcome(ok=False, outcome="could not kill between the decision and the drain "
                                         f"(states seen {sorted(_states(run))})")
    code, rd = cli(run, *extra, timeout_s=timeout_s)
    running = [[t["slices"] for t in part if t.get("state") == "RUNNING"]
               for part in drivers(rd)]
    # the noticed host's slice: the killed driver's only one; the next driver's first mesh
    avoided = (len(running) == 2 and bool(running[0]) and bool(running[1])
               and running[0][0][0] not in running[1][0])
    restored = (rd.summary.get("restores") or [{}])[0].get("restored_step")
    return Outcome(ok=code == 0 and avoided and rd.summary.get("state") == "SUCCEEDED",
                   outcome=f"resumed: {summary_line(rd)} from step {restored}; noticed slice "
                           f"{'avoided' if avoided else 'trained on again'}",
                   lost_steps=max(0, reached - restored) if restored is not None else None,
                   to_first_step_s=resumed_first_step(rd, killed_at),
                   detail={"meshes_per_driver": running})


def _states(run: Path) -> set[str]:
    return {str(t.get("state")) for t in RunDir.read(run).timeline}


def stale_megascale(d: Path, timeout_s: float) -> Outcome:
    from bench.fault_checks import megascale_after_slice_loss

    stale = megascale_after_slice_loss()
    return Outcome(ok=not stale, outcome=("no host of the 1-slice mesh keeps a MEGASCALE_* key "
                                          "(fresh, parked, standby)") if not stale else
                   f"stale MEGASCALE_* on: {stale}")


ROWS: tuple[Row, ...] = (
    Row("preempt-spare", "preemption notice for host 1 (60 s), a spare slice",
        "drain, checkpoint, re-form on the spare, 0 lost", preempt_spare),
    Row("preempt-no-spare", "preemption notice, 2 one-host slices, no spare",
        "shrink to 1 slice, 0 lost", preempt_no_spare),
    Row("shrink-grow", "notice, no spare; the slice returns 10 s after its deadline",
        "shrink to 1 slice, grow back to 2", shrink_grow),
    Row("kill-9", "kill -9 of host 1 mid-step", "restore the last checkpoint, <= 5 lost",
        kill_9),
    Row("kill-in-save", "kill -9 of host 1 right after an async save started",
        "restore the last complete checkpoint, <= 5 lost", kill_in_save),
    Row("hang-step", "host 1 stops before a step (timeouts.step_s=3)",
        "timeout, stacks dumped, the hang names host 1 only, recovered", hang_step),
    Row("hang-init", "host 1 never joins the distributed init (timeouts.init_s=10)",
        "FORMING bounded by init_s, names host 1, recovered", hang_init),
    Row("corrupt-newest", "host 1's shards of the newest checkpoint truncated",
        "restore the previous step, the bad one moved aside", corrupt_newest),
    Row("driver-sigkill", "SIGKILL of the driver mid-run, then the same command again",
        "no process left, the rerun resumes from the last checkpoint", driver_sigkill),
    Row("two-drivers", "a second driver on the same run dir",
        "the second exits 2 naming the holder, the first finishes", two_drivers),
    Row("sigterm", "SIGTERM to the driver mid-run, then the same command again",
        "exit 143 after a checkpoint, nothing left, the rerun resumes", sigterm,
        requires="orchestrator.driver.signals"),
    Row("notice-crash", "host 1 dies inside its notice window",
        "counted as the preemption (no host_lost), recovered", notice_crash),
    Row("decision-drain-kill", "driver SIGKILLed after a notice's decision, before its drain",
        "the next driver still avoids the noticed slice", decision_drain_kill),
    Row("final-save-lost", "a host lost during the final save",
        "recovered, the final save done again", None,
        missing="no chaos kind reaches a host inside the final save() from outside; the "
                "controller path is tested on the fake seam (tests/controller/"
                "test_fault_endings.py)"),
    Row("disk-full", "the run dir's disk fills up (ENOSPC)",
        "the run stops with its own message and fix, no retries", None,
        missing="needs a size-limited filesystem for the run dir (a mount needs root); the "
                "mapping is tested in tests/controller/test_ray_mapping.py"),
    Row("stale-megascale", "a 2-slice TPU mesh loses a slice (plan and host env, no cluster)",
        "no MEGASCALE_* of the old mesh in any host process", stale_megascale, cluster=False),
)
