"""The fault matrix's rows around the driver process, its saves and its disk: the driver
SIGKILLed or SIGTERMed, two drivers on one run directory, a save lost with its host, a disk
that fills, a decision racing a kill (``bench/fault_rows.py`` lists them in ``ROWS``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bench.fault_kit import (
    SPARE,
    Background,
    Outcome,
    chaos,
    cli,
    drivers,
    recovered,
    resumed_first_step,
    summary_line,
)
from bench.orchestrated import RunDir


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
    """chaos ``crash_in_notice``: a 30 s notice for host 1, its process SIGSEGVed 1 s later
    while the run trains on (handing over to the spare as it warms up)."""
    code, rd = cli(d / "run", SPARE, "run.total_steps=100", "controller.warm.handover_max_s=60",
                   chaos("at_step: 10, host: 1, kind: crash_in_notice, deadline_s: 30"),
                   timeout_s=timeout_s)
    released = next((t for t in rd.timeline if t.get("state") == "RELEASING"), {})
    cause = (released.get("payload") or {}).get("cause")
    out = recovered(rd, code, cause="spot_preemption", max_lost=5,
                     note=f"died in {released.get('prev')}, charged to {cause}")
    out.ok = (out.ok and "host_lost" not in (rd.summary.get("restarts") or {})
              and released.get("prev") in ("RUNNING", "HANDING_OVER")
              and cause == "spot_preemption"
              and not any(t.get("state") == "BACKOFF" for t in rd.timeline))
    return out


def final_save_lost(d: Path, timeout_s: float) -> Outcome:
    """kill -9 of host 1's process ~40 ms after the driver wrote "reached step N: final save"
    (a spare slice, the budget unused): the run re-forms, restores and saves again."""
    run, total = d / "run", 30
    bg = Background.start(run, SPARE, f"run.total_steps={total}")
    try:
        first = bg.wait_transition(lambda t: t.get("state") == "RUNNING", timeout_s)
        pid = bg.host_process(f"{first['slices'][0]}-w1") if first else None
        if pid is None:
            return Outcome(ok=False, outcome=f"host 1's process not found: {bg.log_tail(300)}")
        final = bg.wait_transition(lambda t: t.get("state") == "CHECKPOINTING" and
                                   "final save" in str(t.get("reason")), timeout_s)
        if final is None:
            return Outcome(ok=False, outcome=f"never reached the final save: {bg.log_tail(300)}")
        time.sleep(0.04)
        os.kill(pid, signal.SIGKILL)
        after_ms = round((time.time() - float(final["at"])) * 1000)
        code = bg.wait(timeout_s)
    finally:
        bg.end()
    rd = RunDir.read(run)
    seq = next(i for i, t in enumerate(rd.timeline) if t.get("seq") == final.get("seq"))
    then = rd.timeline[seq + 1]["state"] if len(rd.timeline) > seq + 1 else None
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    out = recovered(rd, code, cause="host_lost", max_lost=5,
                     note=f"killed {after_ms} ms after the final-save line, then {then}; "
                          f"checkpoints {ckpts}")
    out.ok = (out.ok and then == "RELEASING" and rd.summary.get("step") == total
              and str(total) in ckpts and not [c for c in ckpts if "tmp" in c])
    out.detail["killed_after_ms"] = after_ms
    return out


def disk_full(d: Path, timeout_s: float) -> Outcome:
    """The run dir's checkpoints on a 64 MiB tmpfs, filled at step 12 (``bench/fault_disk``):
    the run stops naming the fix, no retries; space freed, the same command resumes."""
    import json
    import subprocess

    from bench import fault_disk, procs

    run, result = d / "run", d / "disk-full.json"
    cmd = fault_disk.command("--run", str(run), "--out", str(result),
                             "--timeout-s", str(timeout_s))
    assert cmd is not None  # the row is skipped without unshare
    log = d / "unshare.log"
    d.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=procs.ROOT,
                              env=procs.child_env(), timeout=3 * timeout_s, check=False)
    if done.returncode != 0 or not result.exists():
        return Outcome(ok=False, outcome=f"harness exit {done.returncode}: "
                                         f"{log.read_text(errors='replace')[-300:]}")
    res = json.loads(result.read_text())
    if "error" in res:
        return Outcome(ok=False, outcome=res["error"][:300], detail=res)
    first = res.get("first_summary") or {}
    rerun = res.get("rerun") or {}
    rs = rerun.get("summary") or {}
    restore = (rs.get("restores") or [{}])[0]
    committed = res["full"]["steps"]
    ok = (res.get("exit_code") not in (0, None) and not res.get("leftovers")
          and "free space" in str(first.get("reason", ""))
          and not first.get("restarts") and rerun.get("exit_code") == 0
          and rs.get("state") == "SUCCEEDED" and bool(committed)
          and restore.get("restored_step") == committed[-1] and not restore.get("skipped"))
    return Outcome(ok=ok, lost_steps=first.get("lost_steps"), detail=res,
                   outcome=f"stopped: exit {res.get('exit_code')} "
                           f"{round(res['stopped_at'] - res['filled_at'], 1)} s after the "
                           f"fill, restarts {first.get('restarts') or 'none'}, "
                           f"\"{str(first.get('reason', ''))[:60]}...\"; space freed, rerun: "
                           f"{rs.get('state')} from step {restore.get('restored_step')} "
                           f"(committed {committed}, skipped {restore.get('skipped') or 'none'})")


def decision_drain_kill(d: Path, timeout_s: float) -> Outcome:
    """A notice decided on (a handover keeps the drain away for a while), the driver SIGKILLed
    before its drain; the next driver must still not train on the noticed slice."""
    run = d / "run"
    extra = (SPARE, "run.total_steps=200", "controller.warm.handover_max_s=60",
             chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 120"))
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


def disk_full_needs() -> str | None:
    from bench import fault_disk

    return fault_disk.unavailable()
