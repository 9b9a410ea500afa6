"""Runs the figures side by side (interleaved per repeat, so load drifts hit every system alike)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from bench import figures, machine
from bench.bare import run_bare
from bench.config import BenchConfig
from bench.orchestrated import run_main
from bench.sidebyside import wait_for_idle
from bench.stats import spread

log = structlog.get_logger(__name__)

FIGURE_KEYS = ("1_steady_state_overhead", "2_announced_preemption", "3_recovery_vs_full_restart",
               "4_goodput_under_preemptions", "5_checkpoint_inflation")


class Suite:
    """One benchmark run: its settings, its scratch directory, and the raw results it gathers."""

    def __init__(self, cfg: BenchConfig, *, workdir: Path,
                 progress: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.progress = progress
        self.raw: dict[str, list] = {"bare": [], "orch_overhead": [], "announced": [],
                                     "restart": [], "derived_goodput": []}
        self.loads: list[dict] = []

    # ---- shared settings ----------------------------------------------------------------

    def topology(self) -> list[str]:
        c = self.cfg
        return [f"cluster.emulate.hosts_per_slice={c.hosts}",
                f"cluster.emulate.devices_per_host={c.devices}"]

    def total_with_preempt(self) -> int:
        return self.cfg.preempt_at_step + self.cfg.steps_after_preempt

    # ---- one repeat of each measurement -------------------------------------------------

    def bare_once(self, i: int) -> None:
        c = self.cfg
        self.progress(f"[{i}] bare multi-process JAX loop ({c.overhead_steps} steps)")
        out = run_bare(processes=c.hosts, devices=c.devices, steps=c.overhead_steps,
                       overrides=[], workdir=self.workdir / f"bare-{i}",
                       checkpoint_every=c.checkpoint_every, timeout_s=c.run_timeout_s)
        self.raw["bare"].append(out)

    def overhead_once(self, i: int) -> None:
        c = self.cfg
        self.progress(f"[{i}] orchestrated steady-state run ({c.overhead_steps} steps)")
        run_dir = self.workdir / f"overhead-{i}"
        code, rd = run_main(run_dir, [*self.topology(), "run.name=bench-overhead",
                                      f"run.total_steps={c.overhead_steps}",
                                      f"controller.checkpoint_interval.every_steps="
                                      f"{c.overhead_steps}"], timeout_s=c.run_timeout_s)
        if code != 0:
            raise RuntimeError(f"orchestrated run failed (exit {code}); see {run_dir}.log")
        self.raw["orch_overhead"].append(rd.metrics)

    def announced_once(self, i: int) -> None:
        c = self.cfg
        self.progress(f"[{i}] orchestrator: announced preemption at step {c.preempt_at_step}")
        run_dir = self.workdir / f"announced-{i}"
        chaos = (f"controller.chaos=[{{at_step: {c.preempt_at_step}, host: 1, kind: preempt, "
                 f"deadline_s: {c.notice_deadline_s}}}]")
        t0 = time.time()
        code, rd = run_main(run_dir, [*self.topology(), "run.name=bench-announced",
                                      "cluster.emulate.spare_slices=1",
                                      f"controller.warm.standby_slices={c.standby_slices}",
                                      f"run.total_steps={self.total_with_preempt()}",
                                      f"controller.checkpoint_interval.every_steps="
                                      f"{c.checkpoint_every}", chaos], timeout_s=c.run_timeout_s)
        wall = time.time() - t0
        fig = figures.announced_recovery(rd)
        fig.update({"exit_code": code, "process_wall_s": wall,
                    "ray_start_failed": rd.ray_start_failed})
        self.raw["announced"].append(fig)
        if c.mode == "smoke" and not self.raw["orch_overhead"]:
            self.raw["orch_overhead"].append(
                [m for m in rd.metrics if m["step"] <= c.preempt_at_step])
        st = spread([m["step_time_s"] for m in figures.steady_steps(rd.metrics,
                                                                    skip=c.skip_steps)])
        self.raw["derived_goodput"].append({
            "system": "orchestrator", "wall_s": wall, "useful_steps": rd.summary.get("step"),
            "steps_lost": fig.get("steps_lost"), "step_s": st["median"],
            "goodput": figures.goodput(useful_steps=rd.summary.get("step"),
                                       step_s=st["median"], wall_s=wall),
            "summary_goodput": rd.summary.get("goodput")})

    def restart_once(self, i: int) -> None:
        c = self.cfg
        self.progress(f"[{i}] full-restart baseline: kill at step {c.preempt_at_step}, resubmit")
        run_dir = self.workdir / f"restart-{i}"
        overrides = [*self.topology(), "run.name=bench-restart",
                     f"run.total_steps={self.total_with_preempt()}",
                     f"controller.checkpoint_interval.every_steps={c.checkpoint_every}"]
        # The kill lands at a step, not when a poll of the metrics file sees one: host 1 is
        # killed -9 at step preempt_at_step and with no restart allowed the job ends there.
        kill = (f"controller.chaos=[{{at_step: {c.preempt_at_step}, host: 1, kind: kill}}]",
                "controller.budgets.host_lost=0")
        t0 = time.time()
        _, first = run_main(run_dir, [*overrides, *kill], timeout_s=c.run_timeout_s)
        killed = figures.kill_moment(first, exited_at=time.time())
        if killed is None:
            raise RuntimeError(f"the job was not killed at step {c.preempt_at_step} (state "
                               f"{first.summary.get('state')}); see {run_dir}.log")
        shutil.copy(run_dir / "metrics.jsonl", run_dir.parent / f"restart-{i}-first.jsonl")
        code, second = run_main(run_dir, overrides, timeout_s=c.run_timeout_s)
        wall = time.time() - t0
        fig = figures.full_restart(killed, first, second)
        fig.update({"exit_code": code, "process_wall_s": wall,
                    "ray_start_failed": second.ray_start_failed})
        self.raw["restart"].append(fig)
        st = spread([m["step_time_s"] for m in figures.steady_steps(first.metrics,
                                                                    skip=c.skip_steps)])
        self.raw["derived_goodput"].append({
            "system": "full_restart", "wall_s": wall, "useful_steps": second.summary.get("step"),
            "steps_lost": fig.get("steps_lost"), "step_s": st["median"],
            "goodput": figures.goodput(useful_steps=second.summary.get("step"),
                                       step_s=st["median"], wall_s=wall)})

    # ---- the whole run ------------------------------------------------------------------

    def run(self) -> dict:
        c = self.cfg
        started = time.time()
        before = machine.describe()
        errors: list[str] = []
        for i in range(0 if c.only_goodput else c.repeats):
            steps = [self.bare_once, self.announced_once, self.restart_once]
            if c.mode != "smoke":
                steps.insert(1, self.overhead_once)
            for step in steps:
                try:
                    self._measured(f"{step.__name__}[{i}]", step, i)
                except Exception as exc:  # one failed measurement must not hide the others
                    log.error("measurement_failed", step=step.__name__, repeat=i, error=str(exc))
                    errors.append(f"{step.__name__}[{i}]: {exc}")
        goodput = self._measured("goodput_figure", self.goodput_figure)
        result = {
            "mode": c.mode, "settings": asdict(c), "machine": before,
            "load_average_after": machine.load_average(),
            "loads": self.loads, "validity": machine.validity(self.loads),
            "duration_s": round(time.time() - started, 1), "errors": errors,
            "figures": {
                FIGURE_KEYS[0]: figures.overhead(self.raw["orch_overhead"], self.raw["bare"],
                                                 skip=c.skip_steps),
                FIGURE_KEYS[1]: self.announced_figure(),
                FIGURE_KEYS[2]: figures.recovery_vs_restart(self.raw["announced"],
                                                            self.raw["restart"]),
                FIGURE_KEYS[3]: goodput,
                FIGURE_KEYS[4]: figures.checkpoint_inflation(self.raw["bare"],
                                                             skip=c.skip_steps),
            },
        }
        return result

    def _measured(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one measurement with the machine's load recorded before and after it; outside
        smoke mode it first waits (bounded) for the previous one's load to settle."""
        if self.cfg.mode != "smoke":
            wait_for_idle()
        entry = {"measurement": name, "before": machine.load_average(), "after": None}
        self.loads.append(entry)
        try:
            return fn(*args)
        finally:
            entry["after"] = machine.load_average()

    def announced_figure(self) -> dict:
        runs = self.raw["announced"]
        phases: dict[str, list[float]] = {}
        for r in runs:
            for k, v in (r.get("phases_s") or {}).items():
                phases.setdefault(k, []).append(v)
        return {
            "steps_lost": [r.get("steps_lost") for r in runs],
            "notice_to_committed_s": spread([r["notice_to_committed_s"] for r in runs
                                             if r.get("notice_to_committed_s") is not None]),
            "notice_to_first_step_s": spread([r["notice_to_first_step_s"] for r in runs
                                              if r.get("notice_to_first_step_s") is not None]),
            "phases_s": {k: spread(v) for k, v in phases.items()},
            "runs": runs, "target": "0 steps lost",
        }

    def goodput_figure(self) -> dict:
        c = self.cfg
        if c.goodput_minutes:
            from bench.schedule import run_schedule

            out = run_schedule(c, workdir=self.workdir / "schedule", progress=self.progress,
                               topology=self.topology())
            # each system's start load counts for the run's validity too
            self.loads += [{"measurement": f"goodput:{name}", "before": entry.get("load_before"),
                            "after": None} for name, entry in out["systems"].items()]
            return out
        by: dict[str, list[dict]] = {}
        for r in self.raw["derived_goodput"]:
            by.setdefault(r["system"], []).append(r)
        return {
            "mode": "derived: one preemption per run (figure 3's runs); not the >=10-minute "
                    "schedule",
            "systems": {k: {"goodput": spread([r["goodput"] for r in v if r["goodput"]]),
                            "wall_s": spread([r["wall_s"] for r in v]),
                            "steps_lost": [r["steps_lost"] for r in v],
                            "useful_steps": [r["useful_steps"] for r in v]}
                        for k, v in by.items()},
            "ray_train_jaxtrainer": "not run in derived mode (needs the scheduled mode)",
        }


def write_result(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kind = "-goodput" if result["settings"].get("only_goodput") else ""
    path = out_dir / f"{result['mode']}{kind}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    return path
