"""The fault matrix, one row per fault: what is done, what should follow, and the run that
checks it (``bench/faults.py`` runs them one at a time and prints the table).

A row whose fault cannot be injected from the outside yet has ``run=None`` and says why, and a
row that needs a feature this tree lacks says so (``requires``): the table never shows a result
that was not measured.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.fault_kit import (
    SPARE,
    TWO_SLICES,
    Background,
    Outcome,
    chaos,
    cli,
    node_processes,
    recovered,
    running_slices,
    summary_line,
    transition,
)
from bench.fault_process import (
    decision_drain_kill,
    disk_full,
    disk_full_needs,
    driver_sigkill,
    final_save_lost,
    notice_crash,
    sigterm,
    stale_megascale,
    two_drivers,
)
from bench.orchestrated import RunDir


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
    needs: Callable[[], str | None] | None = None
    """What this machine must allow (``needs()``: None, or why not): without it the row is
    skipped, saying what it needs."""

    def unavailable(self) -> str | None:
        if self.run is None:
            return f"not implemented yet: {self.missing}"
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"not implemented yet: {self.requires} is not in this tree"
        return None

    def skipped(self) -> str | None:
        why = self.needs() if self.needs is not None else None
        return None if why is None else f"skipped: {why}"


def preempt_spare(d: Path, timeout_s: float) -> Outcome:
    # long enough for the handover (training on while the spare warms up) to end in a drain
    code, rd = cli(d / "run", SPARE, "run.total_steps=100",
                   chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 60"),
                   timeout_s=timeout_s)
    out = recovered(rd, code, cause="spot_preemption", max_lost=0)
    out.ok = out.ok and len({tuple(t.get("slices", ())) for t in rd.timeline
                             if t.get("state") == "RUNNING"}) == 2
    return out


def preempt_no_spare(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", *TWO_SLICES, chaos("at_step: 10, host: 1, kind: preempt, "
                                                  "deadline_s: 60"), timeout_s=timeout_s)
    out = recovered(rd, code, cause="spot_preemption", max_lost=0,
                     note=f"slices {running_slices(rd)}")
    out.ok = out.ok and running_slices(rd)[:2] == [2, 1]
    return out


def shrink_grow(d: Path, timeout_s: float) -> Outcome:
    # the slice goes at its deadline (5 s) and is back 3 s later; the run on one slice must
    # outlast that (~0.04 s a step here) and grow back at a checkpoint
    code, rd = cli(d / "run", *TWO_SLICES, "run.total_steps=500",
                   "controller.checkpoint_interval.every_steps=25",
                   "cluster.emulate.replace_after_s=3",
                   chaos("at_step: 10, host: 1, kind: preempt, deadline_s: 5"),
                   timeout_s=timeout_s)
    out = recovered(rd, code, cause="spot_preemption", note=f"slices {running_slices(rd)}")
    out.ok = out.ok and running_slices(rd)[:3] == [2, 1, 2]
    return out


def kill_9(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", chaos("at_step: 7, host: 1, kind: kill"), timeout_s=timeout_s)
    return recovered(rd, code, cause="host_lost", max_lost=5)


def kill_in_save(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", chaos("at_step: 10, host: 1, kind: kill_in_save"),
                   timeout_s=timeout_s)
    return recovered(rd, code, cause="host_lost", max_lost=5)


def machines_lost(d: Path, timeout_s: float, *, workers: tuple[int, ...]) -> Outcome:
    """kill -9 of the raylets of the mesh slice's hosts ``workers`` and every process under
    them at step 12, all at once: the machines vanish (no notice), a spare slice is free."""
    run = d / "run"
    bg = Background.start(run, SPARE, "run.total_steps=60")
    try:
        first = bg.wait_transition(lambda t: t.get("state") == "RUNNING", timeout_s)
        if first is None or not bg.wait_step(12, timeout_s):
            return Outcome(ok=False, outcome=f"never reached step 12: {bg.log_tail(300)}")
        victims = [p for w in workers
                   for p in node_processes(bg.marker, f"{first['slices'][0]}-w{w}")]
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        code = bg.wait(timeout_s)
    finally:
        bg.end()
    rd = RunDir.read(run)
    out = recovered(rd, code, cause="host_lost", max_lost=5,
                     note=f"{len(victims)} processes killed; meshes {_meshes(rd)}")
    out.ok = out.ok and bool(victims) and len(_meshes(rd)) == 2
    return out


def _meshes(rd: RunDir) -> list[list[str]]:
    """The distinct slice sets the run trained on, in order."""
    out: list[list[str]] = []
    for t in rd.timeline:
        if t.get("state") == "RUNNING" and list(t.get("slices", ())) not in out:
            out.append(list(t.get("slices", ())))
    return out


def node_lost(d: Path, timeout_s: float) -> Outcome:
    return machines_lost(d, timeout_s, workers=(1,))


def slice_lost(d: Path, timeout_s: float) -> Outcome:
    return machines_lost(d, timeout_s, workers=(0, 1))


def unhealthy(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", SPARE, "run.total_steps=60", "controller.health.cordon_after=1",
                   chaos("at_step: 10, host: 1, kind: unhealthy"), timeout_s=timeout_s)
    out = recovered(rd, code, cause="hardware_health", max_lost=0,
                     note=f"meshes {_meshes(rd)}")
    out.ok = out.ok and len(_meshes(rd)) == 2
    return out


def short_notice(d: Path, timeout_s: float) -> Outcome:
    """A notice whose deadline (50 ms) leaves no time to stop and save: no drain save (the
    deadline policy falls back to the last checkpoint), charged to the preemption."""
    code, rd = cli(d / "run", SPARE, "run.total_steps=60",
                   chaos("at_step: 12, host: 1, kind: preempt, deadline_s: 0.05"),
                   timeout_s=timeout_s)
    saved = any((t.get("payload") or {}).get("purpose") == "drain" for t in rd.timeline)
    restored = (rd.summary.get("restores") or [{}])[-1].get("restored_step")
    out = recovered(rd, code, cause="spot_preemption", max_lost=5,
                     note="saved inside the notice" if saved else
                     f"no drain save, restored step {restored}")
    out.ok = out.ok and not saved
    return out


def hang_step(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", "timeouts.step_s=3", chaos("at_step: 7, host: 1, kind: hang"),
                   timeout_s=timeout_s)
    hung = transition(rd, "RUNNING", "RELEASING") or {}
    reason = str(hung.get("reason", ""))
    named = "on hosts [1] (" in reason
    out = recovered(rd, code, cause="timeout",
                     note="hang names host 1 only" if named else f"hang reason: {reason[:120]}")
    out.ok = out.ok and named
    out.detail["reason"] = reason
    return out


def hang_init(d: Path, timeout_s: float) -> Outcome:
    code, rd = cli(d / "run", "timeouts.init_s=10",
                   chaos("at_step: 0, host: 1, kind: hang_init"), timeout_s=timeout_s)
    hung = transition(rd, "FORMING", "RELEASING") or {}
    bound_s = hung.get("prev_duration_s")
    bound_s = None if bound_s is None else round(float(bound_s), 1)
    named = "on hosts [1]" in str(hung.get("reason", ""))
    out = recovered(rd, code, cause="timeout", note=f"FORMING {bound_s} s for init_s=10"
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
    Row("node-lost", "kill -9 of host 1's raylet and every process under it (the VM vanishes)",
        "re-form on the spare slice, <= 5 lost", node_lost),
    Row("slice-lost", "kill -9 of both hosts' raylets and their processes (the slice vanishes)",
        "re-form on the spare slice, <= 5 lost", slice_lost),
    Row("unhealthy", "an unhealthy report for host 1 (health.cordon_after=1), a spare slice",
        "cordon, drain onto the spare, 0 lost", unhealthy),
    Row("short-notice", "a preemption notice for host 1 with 50 ms left (no time to save)",
        "fall back to the last checkpoint, <= 5 lost, charged to the preemption",
        short_notice),
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
    Row("notice-crash", "SIGSEGV of host 1 1 s after its 30 s notice (chaos crash_in_notice)",
        "the preemption: its budget, no backoff, no host_lost; recovered", notice_crash),
    Row("decision-drain-kill", "driver SIGKILLed after a notice's decision, before its drain",
        "the next driver still avoids the noticed slice", decision_drain_kill),
    Row("final-save-lost", "kill -9 of host 1 ~40 ms after \"reached step N: final save\"",
        "recovered on the spare, the final save done again", final_save_lost),
    Row("disk-full", "the checkpoints' disk fills up at step 12 (ENOSPC, a 64 MiB tmpfs)",
        "stops naming the fix (free space), no retries; freed, the rerun resumes", disk_full,
        needs=disk_full_needs),
    Row("stale-megascale", "a 2-slice TPU mesh loses a slice (plan and host env, no cluster)",
        "no MEGASCALE_* of the old mesh in any host process", stale_megascale, cluster=False),
)
