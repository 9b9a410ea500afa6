"""``python -m orchestrator.main [--config FILE] [key.sub=value ...]``: the Ray driver.
(``--print-config``: print the resolved config with each setting's default and doc, start
nothing: ``orchestrator/driver/show_config.py``.)

Validates the config before anything starts, connects to Ray (or starts the emulated local
cluster), wires the event intake and the metrics pipeline to the run controller, and exits with
the run's outcome: 0 succeeded, 1 failed (reason logged and in summary.json), 2 bad input
(config, cluster, checkpoint, a model that does not fit in memory) with a one-paragraph message
naming the fix, 143 stopped by SIGTERM (the step it stopped at saved first:
``orchestrator/driver/signals.py``; the run's state is STOPPED), 130 Ctrl-C before the run
started. An operator stop event ends the run STOPPED too, with exit 1 as before.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.config import RunConfig, load_config
from orchestrator.controller.listener import RunListener
from orchestrator.driver import logs, protection
from orchestrator.driver.key_place import check_key_place
from orchestrator.driver.lock import RunDirBusy, RunDirLock
from orchestrator.driver.ray_job import job_config, submission_id
from orchestrator.driver.signals import EXIT_SIGINT, EXIT_SIGTERM, StopSignals
from orchestrator.driver.task_check import check_task
from orchestrator.driver.worker_output import WORKERS_LOG, WorkerOutput
from orchestrator.shared import configtools
from orchestrator.shared.errors import (
    CheckpointError,
    ClusterUnreachableError,
    ConfigError,
    DoesNotFit,
    OrchestratorError,
    TaskCodeError,
    TopologyError,
)
from orchestrator.shared.files import UnsafeFile, atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from orchestrator.metrics.goodput import GoodputReport

log = structlog.get_logger("orchestrator.main")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, EXIT_SIGINT
EXIT_STOPPED = EXIT_SIGTERM  # 143: SIGTERM drained the run (saved), then it stopped


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.main",
        description="Fault-tolerant JAX training on a Ray cluster of TPU hosts (or emulated ones).",
        epilog="Overrides: dotted keys, e.g. model.num_layers=4 mesh.ici.fsdp=2 run.total_steps=50."
               " Every setting, its default and its doc: --print-config [--config FILE] "
               "[overrides]. Example TPU configs: deploy/configs/.")
    p.add_argument("--config", help="YAML config file (defaults are used for what it omits)")
    p.add_argument("--log-format", choices=("auto", "console", "json"), default=None,
                   help="console: state lines and a live progress bar; json: JSON records and "
                        "progress lines (Cloud Logging, ray job logs); auto (default, or "
                        "logs.format): console when stdout is a TTY")
    p.add_argument("--log-level", default="info")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (every setting with its value, default and "
                        "one-line doc) as YAML and exit 0, starting nothing")
    p.add_argument("overrides", nargs="*", help="key.sub=value settings")
    return p.parse_args(list(argv))


def explain(exc: OrchestratorError | UnsafeFile) -> str:
    """The one-paragraph message a user sees for bad input."""
    kind = {TaskCodeError: "Task code error", ConfigError: "Configuration error",
            ClusterUnreachableError: "Ray cluster unreachable",
            CheckpointError: "Checkpoint problem", TopologyError: "Cluster too small",
            RunDirBusy: "Run directory in use", DoesNotFit: "Does not fit in memory",
            UnsafeFile: "Unsafe file in the run directory"}
    title = next((v for k, v in kind.items() if isinstance(exc, k)), "Cannot start the run")
    body = exc.message + (f" Fix: {exc.fix}" if exc.fix else "")
    return textwrap.fill(f"{title}: {body}", width=100)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM (``ray job stop``, Kubernetes) drains the run once it runs; before, and for a
    # second signal or SIGINT, the driver unwinds through its teardown (a driver started from a
    # background job inherits SIGINT ignored: the handler resets it)
    signals = StopSignals(in_ray_job=submission_id() is not None)
    signals.install()
    tty = sys.stdout.isatty()
    logs.configure(json_logs=logs.choose_output(args.log_format, tty=tty).json,
                   level=args.log_level)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(explain(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.print_config:
        from orchestrator.driver.show_config import render

        print(render(cfg))
        return EXIT_OK
    output = logs.choose_output(args.log_format or cfg.logs.format, tty=tty,
                                verbose=cfg.logs.verbose)
    logs.configure(json_logs=output.json, level=args.log_level)
    driver = Driver(cfg, argv=list(sys.argv[1:] if argv is None else argv), signals=signals,
                    output=output)
    bad_input = (ConfigError, ClusterUnreachableError, CheckpointError, TopologyError, RunDirBusy,
                 DoesNotFit, UnsafeFile)
    try:
        return driver.run()
    except bad_input as exc:
        print(explain(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("Interrupted outside the run (starting it or closing); nothing was left running.",
              file=sys.stderr)
        return signals.exit_code()
    finally:
        driver.close()


class Driver:
    """Builds the run's parts in order and tears every one of them down, whatever happens."""

    def __init__(self, cfg: RunConfig, *, argv: list[str],
                 signals: StopSignals | None = None, output: logs.Output | None = None) -> None:
        self.cfg = cfg
        # what it prints; not given (tests, tools): what a driver off a TTY always printed
        self.output = output or logs.choose_output(cfg.logs.format, tty=False,
                                                   verbose=cfg.logs.verbose)
        # the workers' lines: RUN_DIR/workers.log, their warnings to the log, the terminal
        self.worker_output = WorkerOutput(echo=self.output.worker_logs)
        self.signals = signals or StopSignals()
        self.argv = argv
        self.run_dir = Path(cfg.run.run_dir).absolute()
        self.emulated: Any = None
        self.intake: Any = None
        self.metrics: Any = None
        self.node_watcher: Any = None
        self.cloud: Any = None
        self._ray_started = False
        self.lock = RunDirLock(self.run_dir)

    def run(self) -> int:
        from orchestrator.controller import Controller
        from orchestrator.controller.wiring import from_config
        from orchestrator.raygroup.cluster_view import RayClusterView
        from orchestrator.raygroup.factory import ray_group_factory
        from orchestrator.raygroup.ram_holders import RamTier

        check_key_place(self.cfg, self.run_dir)  # exit 2 before a key could be written over
        self.lock.acquire(submission_id=submission_id())  # before anything reads or writes
        # the task, its memory per host (printed; exit 2 if it cannot fit) and its checkpoints
        task = check_task(self.cfg, self.run_dir, show=self.worker_output.show)
        self._connect()
        self.signals.install()  # Ray's in-process head node installs its own SIGTERM handler
        cluster = RayClusterView()
        plan = self._check_capacity(cluster)
        # the auto protection settings (RAM tier, standby), decided now and printed
        spare = protection.spare_slices(cluster.hosts(), plan)
        self.cfg, chosen = protection.resolve(self.cfg, task.memory, hosts=len(plan.hosts),
                                              spare_slices=spare)
        print(protection.line(chosen), flush=True)
        ram = RamTier.for_run(self.cfg, self.run_dir)  # None: checkpoint.ram is off
        self._prepare_run_dir()
        self.metrics = self._build_metrics(task)
        self.intake = self._build_intake()
        self._emulate_cloud()
        wiring = from_config(self.cfg)  # the policies and the chaos plug-in
        listeners = [*wiring.listeners, self.metrics, _Answers(self, cluster)]
        groups = ray_group_factory(self.cfg, cluster, ram=ram)
        controller = Controller(self.cfg, run_dir=self.run_dir, cluster=cluster,
                                make_group=groups, intake=self.intake,
                                policies=wiring.policies, listeners=listeners,
                                stop_request=self.signals.request, protection=chosen)
        self._watch_ray_nodes(lambda: list(controller.plan.hosts) if controller.plan else [])
        self.signals.armed = True  # from here SIGTERM drains (the controller polls the flag)
        try:
            summary = controller.run()
        finally:
            groups.close()  # warm processes kept between groups
        self.metrics.flush(timeout=5.0)  # the console's last state line before the summary
        self.worker_output.quiet()  # the summary is the last thing printed
        if note := self.worker_output.note():
            print(note, flush=True)
        print(summary.as_text(self.run_dir), flush=True)
        if ram is not None and (line := ram.finish(succeeded=summary.state == "SUCCEEDED")):
            print(line, flush=True)
        return summary.exit_code  # 0, 1, or 143 after a SIGTERM drain

    # ---- parts --------------------------------------------------------------------------

    def _prepare_run_dir(self) -> None:
        import yaml

        from orchestrator.autoresume.runenv import redact_argv, redact_runtime_env

        self.run_dir.mkdir(parents=True, exist_ok=True)
        meta_path = self.run_dir / "run.json"
        prev: dict = {}
        if meta_path.exists():
            try:
                prev = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                prev = {}
        argv = redact_argv(["python", "-m", "orchestrator.main", *self.argv])  # no secrets
        meta = {
            "run_id": prev.get("run_id") or self.cfg.run.name,  # = the exported metrics' job
            "job": self.cfg.run.name,
            "entrypoint": argv,
            "entrypoint_shell": shlex.join(argv),
            "cwd": os.getcwd(),
            "runtime_env": redact_runtime_env(job_config().get("runtime_env") or {}),  # no secrets
            "incarnation": int(prev.get("incarnation", 0)) + 1,
            "config_digest": self.cfg.digest(),
            "run_dir": str(self.run_dir),
            "started_at": time.time(),
            "ray_job_submission_id": submission_id(),
        }
        atomic_write_json(meta_path, meta, indent=2)
        logs.attach_run_dir(self.run_dir)  # every log record, also those the terminal hid
        self.worker_output.attach(self.run_dir / WORKERS_LOG)  # and every line of the workers
        # write + rename: a link planted at the name is replaced, never written through
        atomic_write_text(self.run_dir / "config.yaml",
                          yaml.safe_dump(configtools.to_dict(self.cfg), sort_keys=False))
        structlog.contextvars.bind_contextvars(run_id=meta["run_id"], job=self.cfg.run.name)
        log.info("run_dir_ready", run_dir=str(self.run_dir), incarnation=meta["incarnation"])

    def _connect(self) -> None:
        import ray

        from orchestrator.raygroup.topology import EmulatedCluster, check_cluster_mode, connect_ray

        c = self.cfg.cluster
        check_cluster_mode(c.mode, c.address, os.environ)  # issue 16: misuse -> exit 2
        address = c.address or os.environ.get("RAY_ADDRESS")
        init = _ray_init(self.worker_output, verbose=self.output.worker_logs)
        if c.mode == "emulate" or (c.mode == "auto" and not address):
            em = c.emulate
            t0 = time.perf_counter()
            addr = self._start_emulated(EmulatedCluster, em)
            connect_ray(addr, timeout_s=c.connect_timeout_s, init=init)
            log.info("emulated_cluster_started", slices=em.slices, spare=em.spare_slices,
                     hosts_per_slice=em.hosts_per_slice, devices_per_host=em.devices_per_host,
                     seconds=round(time.perf_counter() - t0, 2))
        else:
            connect_ray(address, timeout_s=c.connect_timeout_s, init=init)
        self._ray_started = ray.is_initialized()

    def _start_emulated(self, cluster_cls: Any, em: Any, attempts: int = 2) -> str:
        """Start the emulated cluster; Ray's fixed node start-up limits can trip on a loaded
        machine, so a failed start is torn down and tried again once."""
        for attempt in range(1, attempts + 1):
            self.emulated = cluster_cls(devices_per_host=em.devices_per_host)
            try:
                addr = self.emulated.start()
                for _ in range(em.slices + em.spare_slices):
                    self.emulated.add_slice(em.hosts_per_slice)
                return addr
            except Exception as exc:  # Ray raises plain Exception on node start time-outs
                self.emulated.shutdown()
                self.emulated = None
                log.warning("emulated_cluster_start_failed", attempt=attempt, error=str(exc))
                if attempt == attempts:
                    raise ClusterUnreachableError(
                        f"The local emulated Ray cluster did not start ({exc}).",
                        fix="retry when the machine is less loaded, or lower "
                            "cluster.emulate.slices / hosts_per_slice") from None
        raise AssertionError("unreachable")

    def _check_capacity(self, cluster: Any) -> Any:
        """Fail fast (before any actor) when the cluster cannot host the requested mesh; the
        mesh plan it would have."""
        from orchestrator.shared.plan import plan_mesh

        hosts = cluster.hosts()
        if not hosts:
            raise TopologyError(
                "The Ray cluster has no TPU hosts (nodes with `TPU` resources and a "
                "ray.io/tpu-slice-name label).",
                fix="add TPU worker nodes, or run with cluster.mode=emulate")
        c = self.cfg.cluster
        hps = c.emulate.hosts_per_slice if c.mode != "tpu" else None
        want = c.slices or (c.emulate.slices if c.mode != "tpu" else None)
        plan = plan_mesh(self.cfg, hosts, platform=cluster.platform(), hosts_per_slice=hps,
                         max_slices=want)
        want = want or plan.num_slices
        if plan.num_slices < want:
            raise TopologyError(
                f"The mesh needs {want} complete slice(s) but the cluster has "
                f"{plan.num_slices} ({len(hosts)} TPU hosts).",
                fix="add hosts/slices to the cluster or lower cluster.slices / "
                    "cluster.emulate.slices")
        return plan

    def _build_metrics(self, task: Any) -> Any:
        from orchestrator.metrics.console import throughput_unit
        from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks, identity_for

        m = self.cfg.metrics
        identity = identity_for(m, run_name=self.cfg.run.name)
        live = self.cfg.run.total_steps if self.output.live else None
        unit = throughput_unit(task.tokens_per_step, self.cfg.train.global_batch)
        sinks = build_sinks(m, run_dir=self.run_dir, identity=identity, live_total=live,
                            unit=unit)
        return MetricsPipeline(sinks, queue_size=m.queue_size)

    def _build_intake(self) -> Any:
        from orchestrator.events.intake import EventIntake

        intake = EventIntake(self.cfg.events, run_dir=self.run_dir, job=self.cfg.run.name)
        intake.start()
        return intake

    def _emulate_cloud(self) -> None:
        """With cluster.emulate.replace_after_s: preempted emulated slices go away at their
        notice's deadline and new ones join later (orchestrator/cluster/cloud.py)."""
        em = self.cfg.cluster.emulate
        if self.emulated is None or em.replace_after_s is None:
            return
        from orchestrator.cluster.cloud import EmulatedCloud

        self.cloud = EmulatedCloud(self.emulated, replace_after_s=em.replace_after_s,
                                   hosts_per_slice=em.hosts_per_slice)
        self.cloud.start()
        self.intake.add_observer(self.cloud.on_event)
        log.info("emulated_cloud", replace_after_s=em.replace_after_s)

    def _watch_ray_nodes(self, hosts: Any) -> None:
        """Ray as an event source: a run host whose node dies becomes a HOST_LOST event."""
        from orchestrator.events.ray_source import RayNodeWatcher
        from orchestrator.raygroup import ray_private

        self.node_watcher = RayNodeWatcher(
            job=self.cfg.run.name,
            draining=ray_private.draining_nodes if self.cfg.events.ray_drains else None)
        self.node_watcher.start(lambda ev: self.intake.submit(ev, source="ray"), hosts,
                                interval_s=1.0)

    def _resolve_peak(self, cluster: Any, measure: Any, box: dict) -> tuple[float, str]:
        from orchestrator.metrics.mfu import resolve_peak
        from orchestrator.raygroup.topology import accelerator_of

        if "peak" not in box:
            import ray

            accel = self.cfg.cluster.accelerator or accelerator_of(ray.nodes())
            configured = self.cfg.metrics.cpu_peak_flops_per_device
            measured = None
            if configured is None and accel is None:
                # One device's matmul uses every core of the machine, and on the emulated
                # cluster all devices share those cores: each device's honest share is 1/N.
                em = self.cfg.cluster.emulate
                sharing = em.slices * em.hosts_per_slice * em.devices_per_host
                measured = measure() / sharing
            box["peak"] = resolve_peak(accel, configured, measured)
            if box["peak"][1].startswith("measured"):
                box["peak"] = (box["peak"][0], f"{box['peak'][1]}/{sharing}-devices-share")
            log.info("mfu_peak", peak_flops_per_device=box["peak"][0], source=box["peak"][1])
        return box["peak"]

    def _goodput(self) -> GoodputReport:
        """Goodput and badput from the run directory's timeline and metrics (for the summary)."""
        from orchestrator.metrics.rundir import load_run

        if self.metrics is not None:
            self.metrics.flush(timeout=10.0)
        return load_run(self.run_dir, now=time.time()).goodput

    def close(self) -> None:
        for name, part in (("ray-node-watcher", self.node_watcher), ("intake", self.intake),
                           ("emulated-cloud", self.cloud), ("metrics", self.metrics)):
            if part is None:
                continue
            try:
                part.stop() if hasattr(part, "stop") else part.close()
            except Exception as exc:
                log.warning("close_failed", part=name, error=str(exc))
        if self._ray_started:
            import ray

            from orchestrator.raygroup import ray_private

            ray.shutdown()
            ray_private.unroute_worker_output()
        if self.emulated is not None:
            self.emulated.shutdown()
        self.worker_output.close()  # after Ray: its last lines are kept
        self.lock.release()  # last: nothing of this driver writes the run dir any more


class _Answers(RunListener):
    """What the run asks its driver: the MFU peak (accelerator table, setting, or a matmul
    timed on host 0) and, as it ends, goodput from the run directory."""

    def __init__(self, driver: Driver, cluster: Any) -> None:
        self.driver, self.cluster, self.box = driver, cluster, {}

    def resolve_peak(self, measure: Any) -> tuple[float, str]:
        return self.driver._resolve_peak(self.cluster, measure, self.box)

    def goodput(self) -> GoodputReport | None:
        return self.driver._goodput()


def _ray_init(route: WorkerOutput, *, verbose: bool) -> Any:
    """``ray.init`` for ``connect_ray``: the workers' lines always reach the driver (their
    warnings must), but through ``route`` (RUN_DIR/workers.log; on the terminal only with
    ``logs.verbose``), never Ray's own printer; Ray's driver-side notes only when verbose."""
    import logging

    import ray

    from orchestrator.raygroup import ray_private

    def init(**kw: Any) -> Any:
        kw.update(log_to_driver=True, logging_level=logging.INFO if verbose else logging.ERROR)
        out = ray.init(**kw)
        ray_private.route_worker_output(route)
        return out

    return init


if __name__ == "__main__":
    sys.exit(main())
