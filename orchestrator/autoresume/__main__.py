"""``python -m orchestrator.autoresume --config autoresume.yaml [dotted.key=value ...]``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import structlog

from orchestrator.autoresume.config import load
from orchestrator.autoresume.intake import run_forever
from orchestrator.autoresume.ray_jobs import RayJobs
from orchestrator.autoresume.service import AutoresumeService
from orchestrator.shared.errors import ConfigError, OrchestratorError

log = structlog.get_logger("orchestrator.autoresume")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.autoresume",
        description="Resubmit dead training runs when their Cloud Monitoring alerts fire.")
    parser.add_argument("--config", help="autoresume YAML (see deploy/kuberay/autoresume.yaml)")
    parser.add_argument("--reset-run", metavar="RUN_ID",
                        help="clear a run's spent restart budget and exit")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. ray.address=http://...")
    args = parser.parse_args(argv)
    try:
        cfg = load(args.config, args.overrides)
        if args.reset_run:
            from orchestrator.autoresume.state import StateStore

            store = StateStore(cfg.state_dir)
            AutoresumeService(cfg, ray=_NoRay(), state=store).reset_run(args.reset_run)
            print(f"reset the restart budget of {args.reset_run}")
            return 0
        if not cfg.subscription:
            raise ConfigError("subscription", "is not set",
                              "set it to projects/<project>/subscriptions/<alerts subscription>")
        service = AutoresumeService(cfg, ray=RayJobs(cfg.ray))
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("autoresume_start", subscription=cfg.subscription, ray=cfg.ray.address,
             state_dir=cfg.state_dir, run_dirs=list(cfg.run_dirs))
    run_forever(service, cfg.subscription, stop)
    log.info("autoresume_stopped")
    return 0


class _NoRay:
    """--reset-run touches only local state."""

    def run_submissions(self, run_id, extra_ids=()):
        raise OrchestratorError("not connected to Ray")

    submit = stop = status = command = run_submissions


if __name__ == "__main__":
    sys.exit(main())
