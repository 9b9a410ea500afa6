"""Goodput as production runs (issue 32, items 2 and 3): every system submitted with Ray's job
API (what ``ray job submit`` calls) to **one standing** local TPU-like cluster, the window
counted from the submission, and each system's goodput beside its **relative goodput**: goodput
under the preemption schedule / goodput of the same job undisturbed, the two measured one after
the other in the same run.

``python -m bench.standing [--minutes 5] [--preempt-every-s 100] [--systems ...] [--repeats 1]``

The cluster (``orchestrator.cluster up``: ``slices`` slices x 2 hosts x 2 CPU devices, token
auth) is started once and stays up for every system. The cloud (``bench/standing_cloud.py``) is
the same for all: every N s after the system's first step, the slice it trains on is preempted
(Ray Core drains its hosts, reason preemption, deadline ``deadline_s``), it vanishes at the
deadline and a new slice joins ``replace_after_s`` later. Systems:

- ``orchestrator``: ``python -m orchestrator.main`` with the default config (standby processes
  on the spare slice, the RAM tier where it fits); it reads the drains as notices.
- ``full_restart``: the same driver, deaf to the drains (``events.ray_drains=false``), no standby
  or RAM tier, ending when a host is lost (``controller.budgets.host_lost=0``); resubmitted on
  the same run dir (its checkpoints and stored executables: fair caches) as soon as it ended.
- ``ray_train``: ``bench.raytrain_baseline --address auto``: Ray Train's JaxTrainer with its own
  preemption lifecycle (``PreemptionWatcher`` on the drains, ``get_preemption_info``, a
  just-in-time checkpoint, ``max_preemption_failures``; ``RAY_TRAIN_FEATURES``).

Every system checkpoints durably every ``checkpoint_every`` steps (the orchestrator's default,
50). Goodput = useful steps at the window's end × the system's own median step / the window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import machine
from bench.figures import goodput
from bench.orchestrated import RunDir, read_jsonl
from bench.schedule import restore_markers, summarize, useful_step_time
from bench.sidebyside import wait_for_idle, write_result
from bench.standing_cloud import StandingCloud
from bench.standing_figures import SYSTEMS, relative, table
from bench.stats import fmt
from orchestrator.cluster import local
from orchestrator.cluster.nodes import Shape
from orchestrator.shared.layout import committed_steps

ROOT = Path(__file__).resolve().parents[1]
RAY_TRAIN_FEATURES = {
    "trainer": "ray.train.v2.jax.JaxTrainer, JaxConfig(use_tpu=True) (jax.distributed on CPU)",
    "notices": "Ray Core node drains, reason preemption, with the deadline (the same drains "
               "the orchestrator reads)",
    "PreemptionWatcher": "on (Ray Train's default), polling every 1 s "
                         "(RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S=1; default 5)",
    "get_preemption_info": "every check_every steps (a barrier across workers)",
    "just-in-time checkpoint": "at once when a preemption is announced, and a last one just "
                               "before the deadline, after which the workers wait to be torn "
                               "down (no step that would be lost)",
    "FailureConfig": "max_failures=-1, max_preemption_failures=-1",
    "relax_collectives_on_preemption": "off (a step plus a checkpoint fits the 30 s notice, "
                                       "where Ray's docs say it is unnecessary)",
    "preemption_grace_s": "0 (default: the group restarts at the deadline)",
    "elastic (num_workers=(min, max))": "off: under this schedule a full group's hosts are "
                                        "free at every restart",
    "placement": "one worker per emulated TPU host (label_selector on the emulated-TPU label); "
                 "ScalingConfig(use_tpu=True, topology, accelerator_type) needs a real TPU "
                 "accelerator type, which CPU hosts cannot advertise",
}


@dataclass(kw_only=True)
class Settings:
    minutes: float = 5.0
    preempt_every_s: float = 100.0
    deadline_s: float = 30.0
    replace_after_s: float = 60.0
    checkpoint_every: int = 50
    check_every: int = 10
    slices: int = 2
    hosts_per_slice: int = 2
    devices_per_host: int = 2
    skip_steps: int = 5
    repeats: int = 1
    systems: tuple[str, ...] = SYSTEMS

    def __post_init__(self) -> None:
        bad = set(self.systems) - set(SYSTEMS)
        if bad:
            raise ValueError(f"unknown systems {sorted(bad)}; choose from {', '.join(SYSTEMS)}")
        if self.slices < 2:
            raise ValueError("--slices must be >= 2: one to train on and a spare")


@dataclass
class Jobs:
    """Ray's job API on the standing cluster, with its token."""

    state: local.ClusterState
    env_vars: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ray.job_submission import JobSubmissionClient

        headers = {}
        if self.state.auth:
            token = Path(self.state.token_path).read_text().strip()
            headers["Authorization"] = f"Bearer {token}"
        self.client = JobSubmissionClient(self.state.url, headers=headers)

    def submit(self, entrypoint: str, submission_id: str, env_vars: dict[str, str]) -> str:
        return self.client.submit_job(
            entrypoint=entrypoint, submission_id=submission_id,
            runtime_env={"working_dir": str(ROOT), "env_vars": env_vars})

    def ended(self, job: str) -> bool:
        return self.client.get_job_status(job).is_terminal()

    def stop(self, job: str, timeout_s: float = 60.0) -> None:
        try:
            self.client.stop_job(job)
        except Exception:  # already ended
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.ended(job):
            time.sleep(0.5)


@dataclass
class System:
    """One system's job on the standing cluster: how it starts, where it trains, its records."""

    name: str
    workdir: Path
    settings: Settings
    jobs: Jobs
    submissions: list[dict] = field(default_factory=list)
    current: str | None = None

    def entrypoint(self) -> str:
        s = self.settings
        if self.name == "ray_train":
            return (f"python -m bench.raytrain_baseline --address auto --workdir {self.workdir}"
                    f" --hosts {s.hosts_per_slice} --checkpoint-every {s.checkpoint_every}"
                    f" --check-every {s.check_every}")
        overrides = ["run.name=bench-standing", "run.total_steps=1000000",
                     f"run.run_dir={self.workdir}",
                     f"cluster.emulate.hosts_per_slice={s.hosts_per_slice}",
                     f"cluster.emulate.devices_per_host={s.devices_per_host}",
                     f"controller.checkpoint_interval.every_steps={s.checkpoint_every}"]
        if self.name == "full_restart":
            overrides += ["events.ray_drains=false", "controller.budgets.host_lost=0",
                          "controller.warm.standby_slices=0", "checkpoint.ram.enabled=false"]
        return "python -m orchestrator.main --log-format json " + " ".join(overrides)

    def env_vars(self) -> dict[str, str]:
        env = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9",
               "PYTHONUNBUFFERED": "1"}
        if self.name == "ray_train":
            env.update({"JAX_PLATFORMS": "cpu", "RAY_TRAIN_V2_ENABLED": "1",
                        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
                        "XLA_FLAGS": "--xla_force_host_platform_device_count="
                                     f"{self.settings.devices_per_host}"})
        return env

    def submit(self) -> None:
        sid = f"{self.workdir.name}-{len(self.submissions)}"
        self.current = self.jobs.submit(self.entrypoint(), sid, self.env_vars())
        self.submissions.append({"id": sid, "at": time.time()})

    def records(self) -> list[dict]:
        if self.name == "ray_train":
            return read_jsonl(self.workdir / "records.jsonl")
        rd = RunDir.read(self.workdir)
        return rd.metrics + restore_markers(rd.timeline)

    def first_step_at(self) -> float | None:
        recs = [r for r in self.records() if not r.get("restored")]
        return min((r["wall_time"] for r in recs), default=None)

    def training_slice(self, cloud: StandingCloud) -> str | None:
        """The slice the job trains on now (rank / mesh host 1's)."""
        alive = cloud.alive()
        if self.name == "ray_train":
            by_node = {h["node_id"]: s for s, hosts in alive.items() for h in hosts}
            for rank in (1, 0):
                f = self.workdir / "nodes" / f"rank{rank}"
                if f.exists() and (s := by_node.get(f.read_text().strip())):
                    return s
            return None
        for t in reversed(read_jsonl(self.workdir / "timeline.jsonl")):
            names = [s for s in t.get("slices") or [] if s in alive]
            if names:
                return names[-1]
        return None


def measure(system: System, cloud: StandingCloud, *, disturbed: bool,
            progress: Callable[[str], None]) -> dict:
    """One window: submit, preempt on schedule (``disturbed``), stop at the window's end."""
    s = system.settings
    seconds = s.minutes * 60.0
    t0 = time.time()
    end = t0 + seconds
    system.submit()
    preemptions: list[dict] = []
    next_at: float | None = None
    while time.time() < end:
        cloud.tick()
        now = time.time()
        if next_at is None and (first := system.first_step_at()) is not None:
            next_at = first + s.preempt_every_s
        if disturbed and next_at is not None and now >= next_at:
            target = system.training_slice(cloud)
            if target is not None:
                preemptions.append(cloud.preempt(target, now=now))
                progress(f"    preempted {target} at +{now - t0:.0f} s")
            next_at += s.preempt_every_s
        if system.name == "full_restart" and system.jobs.ended(system.current) and (
                time.time() < end) and cloud.healthy():
            system.submit()
            progress(f"    resubmitted at +{time.time() - t0:.0f} s")
        time.sleep(0.5)
    records = system.records()
    committed = committed_steps(system.workdir / "checkpoints")
    system.jobs.stop(system.current)
    out = summarize(records, t0=t0, seconds=seconds, skip=s.skip_steps,
                    preemptions=len(preemptions), submissions=len(system.submissions))
    down_at_end(out, records, preemptions, committed, end=end)
    first = system.first_step_at()
    out.update({"system": system.name, "disturbed": disturbed, "t0": t0,
                "first_step_after_submit_s": None if first is None else round(first - t0, 2),
                "preemption_log": preemptions})
    if system.name == "ray_train":
        out["lifecycle"] = read_jsonl(system.workdir / "lifecycle.jsonl")
    else:
        summary = RunDir.read(system.workdir).summary
        out["recoveries"] = len(summary.get("recoveries", []))
    return out


def down_at_end(out: dict, records: list[dict], preemptions: list[dict],
                committed: list[int], *, end: float) -> None:
    """A system whose slice vanished and that has not stepped since (a restart under way at the
    window's end) would resume from its newest committed checkpoint, not from its last step:
    count that one as useful and the steps past it as lost."""
    gone = [p["deadline"] for p in preemptions if p["deadline"] <= end]
    if not gone or any(r["wall_time"] > max(gone) for r in records
                       if not r.get("restored") and r["wall_time"] <= end):
        out["down_at_end"] = False
        return
    resume = max((c for c in committed if c <= out["useful_steps"]), default=0)
    lost = out["useful_steps"] - resume
    steps = sorted((r for r in records if not r.get("restored") and r["wall_time"] <= end),
                   key=lambda r: r["wall_time"])
    out.update(down_at_end=True, steps_lost=out["steps_lost"] + lost, useful_steps=resume,
               goodput=goodput(useful_steps=resume, step_s=out["step_s"], wall_s=out["wall_s"]),
               useful_step_time_share=useful_step_time(steps, resume) / out["wall_s"])


def run(settings: Settings, *, out: Path, progress: Callable[[str], None] = print) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="bench-standing-"))
    progress(f"scratch: {scratch}")
    state_dir = scratch / "cluster"
    shape = Shape(slices=settings.slices, hosts_per_slice=settings.hosts_per_slice,
                  devices_per_host=settings.devices_per_host)
    started = time.time()
    state = local.up(shape, state_dir=state_dir, dashboard_port=0)
    runs: list[dict] = []
    loads: list[dict] = []
    try:
        os.environ.update({k: v for k, v in state.env().items() if k != "RAY_ADDRESS"})
        cloud = StandingCloud(state_dir=state_dir, deadline_s=settings.deadline_s,
                              replace_after_s=settings.replace_after_s, slices=settings.slices)
        jobs = Jobs(state)
        for repeat in range(settings.repeats):
            for name in settings.systems:
                for disturbed in (True, False):
                    cloud.restore()
                    wait_for_idle()
                    load = machine.load_average()
                    tag = f"{repeat}-{name}-{'d' if disturbed else 'u'}"
                    progress(f"{tag}: {settings.minutes} min "
                             f"{'with preemptions' if disturbed else 'undisturbed'} "
                             f"(1-minute load {load[0] if load else '?'})")
                    system = System(name=name, workdir=scratch / tag, settings=settings,
                                    jobs=jobs)
                    try:
                        r = measure(system, cloud, disturbed=disturbed, progress=progress)
                    except Exception as exc:  # one failing must not lose the others' numbers
                        r = {"system": name, "disturbed": disturbed, "goodput": None,
                             "error": f"{type(exc).__name__}: {exc}"}
                    r.update(repeat=repeat, load_before=load, load_after=machine.load_average())
                    runs.append(r)
                    loads.append({"measurement": tag, "before": load,
                                  "after": r["load_after"]})
                    progress(f"  goodput {fmt(r.get('goodput'))}, useful steps "
                             f"{r.get('useful_steps')}, lost {r.get('steps_lost')}, "
                             f"preemptions {r.get('preemptions')}")
    finally:
        local.down(state_dir)
    result = {"machine": machine.describe(), "settings": vars(settings) | {
                  "systems": list(settings.systems)},
              "started_at": started, "ended_at": time.time(), "scratch": str(scratch),
              "validity": machine.validity(loads), "loads": loads,
              "ray_train_features": RAY_TRAIN_FEATURES, "cloud_log": cloud.log,
              "runs": runs, "figures": relative(runs)}
    path = write_result("standing", str(out), result)
    progress(table(result))
    progress(f"result: {path}")
    shutil.rmtree(state_dir, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.standing", description=__doc__.split(
        "\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--preempt-every-s", type=float, default=100.0)
    p.add_argument("--deadline-s", type=float, default=30.0)
    p.add_argument("--replace-after-s", type=float, default=60.0)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--render", type=Path, default=None,
                   help="print the table of a result file again (figures recomputed)")
    a = p.parse_args(argv)
    if a.render is not None:
        result = json.loads(a.render.read_text())
        result["figures"] = relative(result["runs"])
        print(table(result))
        return 0
    try:
        settings = Settings(minutes=a.minutes, preempt_every_s=a.preempt_every_s,
                            deadline_s=a.deadline_s, replace_after_s=a.replace_after_s,
                            checkpoint_every=a.checkpoint_every, repeats=a.repeats,
                            systems=tuple(x.strip() for x in a.systems.split(",") if x.strip()))
    except ValueError as exc:
        print(f"bench.standing: {exc}", file=sys.stderr)
        return 2
    result = run(settings, out=a.out)
    return 0 if all(r.get("goodput") is not None for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
