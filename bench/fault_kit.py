"""What the fault matrix's rows share: a run's outcome, the tiny run they all start from, the
driver in the foreground or in the background, and what a run dir says about a recovery.

Every run is ``python -m orchestrator.main`` on its own emulated cluster, as an operator runs it;
every process a run starts carries a marker in its environment, so what outlives a driver is
found exactly (and killed after it is counted).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import procs
from bench.orchestrated import RunDir, log_path, main_cmd, read_jsonl, run_main
from orchestrator.shared.procfs import stat_fields

MARK = "TPU_ORCH_BENCH_FAULT_RUN"

BASE = (
    "run.total_steps=30", "run.steps_per_call=5", "controller.checkpoint_interval.every_steps=5",
    "cluster.mode=emulate", "cluster.emulate.slices=1", "cluster.emulate.hosts_per_slice=2",
    "cluster.emulate.devices_per_host=2", "model.num_layers=1", "model.d_model=32",
    "model.d_ff=64", "model.num_heads=2", "model.seq_len=16", "model.vocab_size=64",
    "train.global_batch=8", "train.warmup_steps=2", "timeouts.init_s=60",
    "timeouts.heartbeat_s=5", "timeouts.step_s=20", "timeouts.compile_s=240",
    "timeouts.restore_s=120", "timeouts.save_s=30", "controller.backoff.base_s=0.2",
    "controller.backoff.max_s=1", "controller.max_wait_for_capacity_s=30",
    "events.metadata.enabled='off'", "metrics.console_every_steps=0",
)
"""The fault tests' run (tests/faults/harness.py): 1 slice x 2 hosts x 2 CPU devices, a tiny
model, a checkpoint every 5 steps; rows add their topology and fault."""


@dataclass
class Outcome:
    """What one row observed. ``ok``: the behaviour the row expects was seen."""

    ok: bool
    outcome: str
    lost_steps: int | None = None
    to_first_step_s: float | None = None
    detail: dict = field(default_factory=dict)


def cli(run_dir: Path, *overrides: str, timeout_s: float) -> tuple[int, RunDir]:
    """The driver to its end (a start Ray itself failed is retried), and its run dir."""
    return run_main(run_dir, [*BASE, f"run.name={run_dir.name}", *overrides],
                    timeout_s=timeout_s)


@dataclass
class Background:
    """A driver started in its own session; ``marker`` is in every process it starts."""

    proc: subprocess.Popen
    run_dir: Path
    marker: str

    @classmethod
    def start(cls, run_dir: Path, *overrides: str) -> Background:
        marker = uuid.uuid4().hex
        cmd = main_cmd(run_dir, [*BASE, f"run.name={run_dir.name}", *overrides])
        proc = procs.start(cmd, log_path=log_path(run_dir),
                           env=procs.child_env({MARK: marker}))
        return cls(proc=proc, run_dir=run_dir, marker=marker)

    def step(self) -> int:
        return max([int(m.get("step", 0)) for m in read_jsonl(self.run_dir / "metrics.jsonl")],
                   default=0)

    def wait_step(self, step: int, timeout_s: float) -> bool:
        """Whether the run reached ``step`` (False: it ended or the time ran out first)."""
        until = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < until:
            if self.step() >= step:
                return True
            time.sleep(0.2)
        return False

    def wait_transition(self, pred: Callable[[dict], bool], timeout_s: float,
                        poll_s: float = 0.005) -> dict | None:
        """The first timeline line ``pred`` accepts, read as the driver writes it (every
        ``poll_s``); None if the driver ended or the time ran out first."""
        path, offset, buf = self.run_dir / "timeline.jsonl", 0, b""
        until = time.monotonic() + timeout_s
        while time.monotonic() < until:
            alive = self.proc.poll() is None
            with contextlib.suppress(OSError), path.open("rb") as f:
                f.seek(offset)
                data = f.read()
                offset += len(data)
                *lines, buf = (buf + data).split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        if pred(t := json.loads(line)):
                            return t
            if not alive:
                return None
            time.sleep(poll_s)
        return None

    def host_process(self, instance: str, timeout_s: float = 30.0) -> int | None:
        """Pid of the host actor process on emulated node ``instance`` (its raylet's labels
        name it), once there is one."""
        until = time.monotonic() + timeout_s
        while time.monotonic() < until and self.proc.poll() is None:
            if (pid := host_process(self.marker, instance)) is not None:
                return pid
            time.sleep(0.2)
        return None

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def leftovers(self, grace_s: float) -> list[str]:
        """Command lines of this run's processes still alive ``grace_s`` after asking (the
        driver included, if alive); they are killed after being counted."""
        until = time.monotonic() + grace_s
        while (alive := marked(self.marker)) and time.monotonic() < until:
            time.sleep(0.5)
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return list(alive.values())

    def end(self) -> None:
        """Whatever state it is in: nothing of this run stays."""
        if self.proc.poll() is None:
            procs.kill_tree(self.proc)
        procs.reap_group(self.proc)
        self.leftovers(0.0)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return log_path(self.run_dir).read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def marked(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``MARK=marker``."""
    needle = f"{MARK}={marker}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            if (stat_fields(entry) or ["Z"])[0] == "Z":  # a zombie, or gone meanwhile
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            found[int(entry)] = cmd.decode(errors="replace").strip()[:160]
        except (OSError, IndexError):
            continue
    return found


def host_process(marker: str, instance: str) -> int | None:
    """The ``ray::HostActor`` process started by the raylet of this run (``marker``) whose
    node labels name ``instance`` (an emulated host, e.g. ``emu-slice-0-w1``); None if none."""
    import psutil

    for pid in marked(marker):
        try:
            raylet = psutil.Process(pid)
            cmd = raylet.cmdline()
            if not cmd or Path(cmd[0]).name != "raylet" or f'"{instance}"' not in " ".join(cmd):
                continue
            for child in raylet.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if " ".join(child.cmdline()).startswith("ray::HostActor"):
                        return child.pid
        except psutil.Error:
            continue
    return None


def node_processes(marker: str, instance: str) -> list[int]:
    """The raylet of this run's emulated node ``instance`` and every process under it (its
    workers, their children): what goes when that machine vanishes; [] if none."""
    import psutil

    for pid in marked(marker):
        try:
            raylet = psutil.Process(pid)
            cmd = raylet.cmdline()
            if cmd and Path(cmd[0]).name == "raylet" and f'"{instance}"' in " ".join(cmd):
                return [pid, *(c.pid for c in raylet.children(recursive=True))]
        except psutil.Error:
            continue
    return []


def recovery(rd: RunDir) -> dict:
    return (rd.summary.get("recoveries") or [{}])[0]


def first_record_after(rd: RunDir, t: float) -> float | None:
    """Wall time of the first step record written after ``t`` (a resumed run's first step)."""
    times = [float(m["wall_time"]) for m in rd.metrics if float(m.get("wall_time", 0)) > t]
    return min(times) if times else None


def drivers(rd: RunDir) -> list[list[dict]]:
    """The timeline cut into each driver's part (a driver's first line has ``prev`` null)."""
    out: list[list[dict]] = []
    for t in rd.timeline:
        if t.get("prev") is None or not out:
            out.append([])
        out[-1].append(t)
    return out


def resumed_first_step(rd: RunDir, signal_at: float) -> float | None:
    """Seconds from a signal to the driver that a resubmission started: its first step record
    (not one the signalled driver wrote while it stopped)."""
    parts = drivers(rd)
    if len(parts) < 2:
        return None
    first = first_record_after(rd, float(parts[-1][0]["at"]))
    return round(first - signal_at, 2) if first is not None else None


def running_slices(rd: RunDir) -> list[int]:
    """Slice count of each RUNNING entry of the timeline, in order (repeats collapsed)."""
    out: list[int] = []
    for t in rd.timeline:
        if t.get("state") == "RUNNING" and (not out or out[-1] != len(t.get("slices", []))):
            out.append(len(t.get("slices", [])))
    return out


def transition(rd: RunDir, prev: str, state: str) -> dict | None:
    return next((t for t in rd.timeline if t.get("prev") == prev and t.get("state") == state),
                None)


def summary_line(rd: RunDir) -> str:
    s = rd.summary
    return (f"{s.get('state', 'no summary')} at step {s.get('step')}, restarts "
            f"{s.get('restarts') or 'none'}")


SPARE = "cluster.emulate.spare_slices=1"
TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1")


def chaos(*faults: str) -> str:
    return "controller.chaos=[" + ", ".join("{" + f + "}" for f in faults) + "]"


def recovered(rd: RunDir, code: int, *, cause: str, max_lost: int | None = None,
               note: str = "") -> Outcome:
    s, rec = rd.summary, recovery(rd)
    lost = s.get("lost_steps")
    ok = (code == 0 and s.get("state") == "SUCCEEDED" and cause in (s.get("restarts") or {})
          and (max_lost is None or (lost is not None and lost <= max_lost)))
    return Outcome(ok=ok, outcome=summary_line(rd) + (f"; {note}" if note else ""),
                   lost_steps=lost, to_first_step_s=rec.get("to_first_step_s"),
                   detail={"exit_code": code, "recoveries": s.get("recoveries")})
