"""Figure 4, scheduled mode: each system trains for M minutes with a preemption every N seconds.

Capacity is modelled the same way for the orchestrator and the full restart: the mesh's slice
plus ``spare_slices`` spares; a preempted slice goes at its notice's deadline (``notice_deadline_s``
after the notice) and a new slice comes ``replace_after_s`` later. Every system checkpoints every
``goodput_checkpoint_every`` steps (the orchestrator's default interval).

- orchestrator: one ``orchestrator.main`` run with ``cluster.emulate.replace_after_s`` (the
  emulated cloud takes the noticed slice at the deadline and adds a new one later); every N s a
  preemption notice for mesh host 1 is published through the run dir's inbox (``python -m
  orchestrator.events publish``).
- full restart: the job does not read notices; its slice goes at the deadline (SIGINT, SIGKILL
  after a grace period) and it is resubmitted on the same run dir (restoring its latest
  checkpoint) as soon as a slice is free: at once while a spare is left, else when the
  preempted slice's replacement comes.
- Ray Train: ``bench.raytrain_baseline`` (JaxTrainer + FailureConfig), a worker killed every N s
  (no notice path); Ray Train restarts it on the local instance at once, which is what the
  capacity model gives whenever a spare is left (``spare_slices`` >= 1 and
  ``replace_after_s`` < N).

The preemption clock starts at the system's first productive step (a loaded machine can take
longer than N s to start); wall time, and so goodput, counts from the process start.
Goodput = useful steps at the window's end (where a resumed job would continue from) × the
system's own median step time / the window (M minutes from process start); lost steps = steps
reached and then thrown away by a restore to an earlier checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import machine, procs
from bench.config import BenchConfig
from bench.figures import goodput
from bench.orchestrated import RunDir, main_cmd, read_jsonl
from bench.sidebyside import wait_for_idle
from bench.stats import spread


def lost_steps(records: Sequence[dict]) -> int:
    """Steps thrown away: a step reached, then a restore to (or a resumed step after) an earlier
    one. ``{"restored": True, "step": s}`` markers count even when no step followed them."""
    lost, prev = 0, None
    for r in sorted(records, key=lambda r: r["wall_time"]):
        resumed_from = r["step"] if r.get("restored") else r["step"] - 1
        if prev is not None and resumed_from < prev:
            lost += prev - resumed_from
        prev = r["step"]
    return lost


def restore_markers(timeline: Sequence[dict]) -> list[dict]:
    """``restored step N`` transitions of a run dir's timeline as restore markers."""
    out = []
    for t in timeline:
        reason = str(t.get("reason", ""))
        if t.get("prev") == "RESTORING" and reason.startswith("restored step "):
            out.append({"step": int(reason.split()[2]), "wall_time": t["at"], "restored": True})
    return out


def summarize(records: Sequence[dict], *, t0: float, seconds: float, skip: int,
              **extra: object) -> dict:
    """Goodput over the window [t0, t0 + seconds]: steps and restores inside it only."""
    recs = sorted((r for r in records if r["wall_time"] <= t0 + seconds),
                  key=lambda r: r["wall_time"])
    steps = [r for r in recs if not r.get("restored")]
    step_s = spread([r["step_time_s"] for r in steps[skip:]])["median"]
    useful = recs[-1]["step"] if recs else 0  # where a resumed job would continue from
    return {"goodput": goodput(useful_steps=useful, step_s=step_s, wall_s=seconds),
            "useful_step_time_share": useful_step_time(steps, useful) / seconds,
            "wall_s": seconds, "useful_steps": useful, "steps_lost": lost_steps(recs),
            "step_s": step_s, "steps_executed": len(steps), **extra}


def useful_step_time(steps: Sequence[dict], useful: int) -> float:
    """Seconds spent in the steps that count: the last run of each step up to ``useful``
    (``steps`` in wall-time order, as ``summarize`` has them).

    Goodput weighs useful steps by the run's median step, which charges slow steps (saves, a
    standby starting, the VM's drift within the window) as lost time; this share does not, so
    the two together say how much of a gap is steps lost or waited for and how much is step
    speed."""
    last: dict[int, float] = {}
    for r in steps:
        last[r["step"]] = r["step_time_s"]
    return sum(t for s, t in last.items() if s <= useful)


def wait_first_step(path: Path, proc, *, until: float) -> float:
    """Wall time of the first step record in ``path`` (now, if the process died / time ran out)."""
    while time.time() < until and proc.poll() is None:
        recs = read_jsonl(path)
        if recs:
            return min(r["wall_time"] for r in recs)
        time.sleep(0.5)
    return time.time()


@dataclass
class Capacity:
    """Free slices for a job that needs one: ``1 + spare`` at first; a preempted slice comes
    back (as a new one) ``replace_after_s`` after it went."""

    spare: int
    replace_after_s: float
    returns: list[float] = field(default_factory=list)

    def lose(self, at: float) -> None:
        self.spare -= 1
        self.returns.append(at + self.replace_after_s)

    def ready_at(self, now: float) -> float:
        """When a slice is free for the next submission (``now`` if one is). A negative
        ``spare`` counts slices owed, each one of the pending ``returns``."""
        self.spare += sum(t <= now for t in self.returns)
        self.returns = sorted(t for t in self.returns if t > now)
        return now if self.spare >= 0 else self.returns[-self.spare - 1]


def orchestrator_schedule(cfg: BenchConfig, workdir: Path, topology: list[str]) -> dict:
    seconds = cfg.goodput_minutes * 60.0
    run_dir = workdir / "orchestrator"
    overrides = [*topology, "run.name=bench-goodput", "run.total_steps=1000000",
                 f"cluster.emulate.spare_slices={cfg.spare_slices}",
                 f"cluster.emulate.replace_after_s={cfg.replace_after_s}",
                 f"controller.warm.standby_slices={min(cfg.standby_slices, cfg.spare_slices)}",
                 f"controller.checkpoint_interval.every_steps={cfg.goodput_checkpoint_every}",
                 *cfg.orchestrator_settings.split()]
    t0 = time.time()
    proc = procs.start(main_cmd(run_dir, overrides), log_path=workdir / "orchestrator.log")
    notices: list[float] = []
    try:
        next_at = wait_first_step(run_dir / "metrics.jsonl", proc,
                                  until=t0 + seconds) + cfg.preempt_every_s
        while time.time() < t0 + seconds and proc.poll() is None:
            if time.time() >= next_at:
                code = procs.start(procs.python_cmd(
                    "orchestrator.events", "publish", "--run-dir", str(run_dir), "--kind",
                    "preemption", "--host", "1", "--deadline-s", str(cfg.notice_deadline_s)),
                    log_path=workdir / "publish.log").wait(timeout=120)
                if code == 0:
                    notices.append(time.time())
                next_at += cfg.preempt_every_s
            time.sleep(0.5)
        wall = time.time() - t0
        procs.interrupt_then_kill(proc, grace_s=90)
    finally:
        if proc.poll() is None:
            procs.kill_tree(proc)
    rd = RunDir.read(run_dir)
    return summarize(rd.metrics + restore_markers(rd.timeline), t0=t0, seconds=seconds,
                     skip=cfg.skip_steps, preemptions=len(notices), process_wall_s=wall,
                     recoveries=len(rd.summary.get("recoveries", [])),
                     summary_goodput=rd.summary.get("goodput"))


def restart_schedule(cfg: BenchConfig, workdir: Path, topology: list[str]) -> dict:
    seconds = cfg.goodput_minutes * 60.0
    run_dir = workdir / "full_restart"
    overrides = [*topology, "run.name=bench-goodput-restart", "run.total_steps=1000000",
                 f"controller.checkpoint_interval.every_steps={cfg.goodput_checkpoint_every}"]
    t0 = time.time()
    kills = 0
    waited = 0.0
    end = t0 + seconds
    first: float | None = None
    capacity = Capacity(spare=cfg.spare_slices, replace_after_s=cfg.replace_after_s)
    while time.time() < end:
        proc = procs.start(main_cmd(run_dir, overrides), log_path=workdir / "full_restart.log")
        try:
            if first is None:
                first = wait_first_step(run_dir / "metrics.jsonl", proc, until=end)
            # the notice comes on the same clock as the orchestrator's; the slice goes at its
            # deadline (this job does not read notices)
            gone_at = first + (kills + 1) * cfg.preempt_every_s + cfg.notice_deadline_s
            while time.time() < min(gone_at, end) and proc.poll() is None:
                time.sleep(0.5)
            procs.interrupt_then_kill(proc, grace_s=60)
            if time.time() < end:
                kills += 1
                capacity.lose(time.time())
        finally:
            if proc.poll() is None:
                procs.kill_tree(proc)
        now = time.time()
        if (wait := min(capacity.ready_at(now), end) - now) > 0:
            waited += wait
            time.sleep(wait)
    wall = time.time() - t0
    recs = read_jsonl(run_dir / "metrics.jsonl") + restore_markers(
        read_jsonl(run_dir / "timeline.jsonl"))
    return summarize(recs, t0=t0, seconds=seconds, skip=cfg.skip_steps, preemptions=kills,
                     process_wall_s=wall, waited_for_capacity_s=round(waited, 1))


def raytrain_schedule(cfg: BenchConfig, workdir: Path) -> dict:
    out = workdir / "ray_train"
    t0 = time.time()
    proc = procs.start(procs.python_cmd(
        "bench.raytrain_baseline", "--minutes", str(cfg.goodput_minutes), "--preempt-every-s",
        str(cfg.preempt_every_s), "--workdir", str(out), "--hosts", str(cfg.hosts),
        "--devices", str(cfg.devices), "--checkpoint-every", str(cfg.goodput_checkpoint_every)),
        log_path=workdir / "ray_train.log")
    try:
        code = proc.wait(timeout=cfg.goodput_minutes * 60.0 + cfg.run_timeout_s)
    except Exception:
        procs.interrupt_then_kill(proc, grace_s=30)
        code = None
    wall = time.time() - t0
    recs = read_jsonl(out / "records.jsonl")
    summary = read_jsonl(out / "summary.json")
    extra = summary[0] if summary else {}
    return summarize(recs, t0=t0, seconds=cfg.goodput_minutes * 60.0, skip=cfg.skip_steps,
                     exit_code=code, process_wall_s=wall,
                     preemptions=len([k for k in extra.get("kills", []) if k.get("pid")]),
                     error=extra.get("error"))


def run_schedule(cfg: BenchConfig, *, workdir: Path, progress: Callable[[str], None],
                 topology: list[str]) -> dict:
    """All systems, one after the other, each for ``goodput_minutes``."""
    workdir.mkdir(parents=True, exist_ok=True)
    systems: dict[str, dict] = {}
    runs: list[tuple[str, Callable[[], dict]]] = [
        ("orchestrator", lambda: orchestrator_schedule(cfg, workdir, topology)),
        ("full_restart", lambda: restart_schedule(cfg, workdir, topology))]
    if cfg.raytrain:
        runs.append(("ray_train_jaxtrainer", lambda: raytrain_schedule(cfg, workdir)))
    wanted = {s.strip() for s in cfg.goodput_systems.split(",")}
    for name, fn in runs:
        if name not in wanted:
            continue
        wait_for_idle()  # the previous system's processes leave the load up for a while
        load = machine.load_average()
        progress(f"figure 4: {name}, {cfg.goodput_minutes} min, preemption every "
                 f"{cfg.preempt_every_s} s (1-minute load {load[0] if load else '?'})")
        try:
            systems[name] = fn()
        except Exception as exc:  # one system failing must not lose the others' numbers
            systems[name] = {"error": f"{type(exc).__name__}: {exc}", "goodput": None,
                             "wall_s": None, "steps_lost": None}
        systems[name]["load_before"] = load
    return {"mode": f"scheduled: {cfg.goodput_minutes} min per system, preemption every "
                    f"{cfg.preempt_every_s} s", "systems": systems}
