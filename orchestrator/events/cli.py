"""Operator CLI: ``python -m orchestrator.events publish|status|explain``.

``publish`` builds one event of our schema and sends it where the running job listens: the run
directory's inbox (default, needs only a shared filesystem) or a Pub/Sub topic (``--project P
--topic T``, or ``--via pubsub`` to use the emulator the driver started, recorded in
RUN_DIR/pubsub.json). PUBSUB_EMULATOR_HOST is honoured. A Pub/Sub message carries the attribute
``job=<run.name>`` (``--job``, else read from ``--run-dir``): every run has its own subscription
filtered on it, so an operator event reaches only the run it is for. ``status`` prints the tail of
events.jsonl and dead_letters.jsonl. ``explain`` says what the driver would do with payloads
(``explain.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.events.config import PubSubConfig
from orchestrator.events.eventlog import read_log
from orchestrator.events.inbox import write_inbox
from orchestrator.events.intake import DEAD_LETTERS_FILE, EVENTS_FILE, PUBSUB_INFO_FILE
from orchestrator.events.model import (
    HOST_KINDS,
    Event,
    EventKind,
    MalformedEvent,
    Target,
    new_event_id,
)
from orchestrator.shared.errors import OrchestratorError

RUN_FILE = "run.json"  # written by the driver: its `job` is the run's name


class CliError(OrchestratorError):
    """Bad command-line use; the message names the fix."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.events",
                                     description="Publish events to a running job; show its log.")
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="send one event to a running job")
    pub.add_argument("--run-dir", type=Path, help="the job's run directory (inbox mode)")
    pub.add_argument("--kind", required=True,
                     help="preemption, maintenance, unhealthy, lost, slice_lost, drain, resume, "
                          f"stop, ... (any of: {', '.join(k.value for k in EventKind)})")
    pub.add_argument("--host", help="host: mesh index, instance name, Ray node id or ip")
    pub.add_argument("--host-kind", choices=HOST_KINDS,
                     help="say which name --host is (default: any of them)")
    pub.add_argument("--slice", help="slice name")
    pub.add_argument("--job", help="only this job (run.name) may act on it; Pub/Sub: its "
                                   "message attribute `job` (default: read from --run-dir)")
    pub.add_argument("--all-jobs", action="store_true",
                     help="Pub/Sub: no `job` attribute, so every run's subscription gets it (as "
                          "a platform event); each run acts only if it names its hosts")
    pub.add_argument("--deadline-s", type=float, help="notice: seconds from now until it happens")
    pub.add_argument("--incarnation", type=int)
    pub.add_argument("--message", default="", help="free text for the event log")
    pub.add_argument("--id", help="event id (default: a fresh one; reuse to test dedupe)")
    pub.add_argument("--via", choices=("auto", "inbox", "pubsub"), default="auto",
                     help="auto = Pub/Sub when --project/--topic are given, else the inbox")
    pub.add_argument("--project", help="Pub/Sub project")
    pub.add_argument("--topic", help="Pub/Sub topic")
    st = sub.add_parser("status", help="tail of the run's event log")
    st.add_argument("--run-dir", type=Path, required=True)
    st.add_argument("-n", type=int, default=20, help="lines to show")
    from orchestrator.events.explain import add_parser

    add_parser(sub)
    return parser


def make_event(args: argparse.Namespace, *, now: float, job: str | None = None) -> Event:
    try:
        kind = EventKind.parse(args.kind)
        target = Target.from_json({"job": job or args.job, "slice": args.slice, "host": args.host,
                                   "host_kind": getattr(args, "host_kind", None)})
    except MalformedEvent as exc:
        raise CliError(exc.reason, fix=exc.fix) from None
    if args.deadline_s is not None and args.deadline_s < 0:
        raise CliError("--deadline-s must be >= 0", fix="pass the seconds until it happens")
    return Event(kind=kind, target=target, source="cli", id=args.id or new_event_id("cli"),
                 observed_at=now,
                 deadline=None if args.deadline_s is None else now + args.deadline_s,
                 incarnation=args.incarnation, message=args.message)


def run_dir_job(run_dir: Path) -> str | None:
    """The run's name (run.name) as its driver recorded it in RUN_DIR: pubsub.json (embedded
    emulator), else run.json's ``job``, else its ``run_id``; None if neither file says."""
    for name, keys in ((PUBSUB_INFO_FILE, ("job",)), (RUN_FILE, ("job", "run_id"))):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read {path} ({exc})",
                           fix="pass --job RUN_NAME (the run's run.name)") from None
        for key in keys:
            value = data.get(key) if isinstance(data, dict) else None
            if isinstance(value, str) and value:
                return value
    return None


def pubsub_job(args: argparse.Namespace) -> str | None:
    """The ``job`` attribute of a Pub/Sub event: --job, else the run directory's run name; None
    only with --all-jobs. Anything else is refused: a message with no ``job`` attribute passes
    every run's subscription filter, so a `stop` would stop every run."""
    if args.all_jobs:
        if args.job:
            raise CliError("--all-jobs and --job contradict each other",
                           fix="drop --all-jobs to address one run, or --job to address all")
        return None
    job = args.job or (run_dir_job(args.run_dir) if args.run_dir is not None else None)
    if not job:
        where = (f"{args.run_dir} has no run.json naming it" if args.run_dir is not None
                 else "no --job or --run-dir was given")
        raise CliError(f"which run is this Pub/Sub event for? ({where})",
                       fix="pass --job RUN_NAME (the run's run.name) or --run-dir RUN_DIR; "
                           "--all-jobs sends it to every run on purpose")
    return job


def publish(args: argparse.Namespace) -> dict:
    now = time.time()
    via = args.via
    if via == "auto":
        via = "pubsub" if (args.project or args.topic) else "inbox"
    job = pubsub_job(args) if via == "pubsub" else None
    event = make_event(args, now=now, job=job)
    data = json.dumps(event.to_json(), separators=(",", ":")).encode("utf-8")
    if via == "inbox":
        if args.run_dir is None:
            raise CliError("inbox mode needs --run-dir",
                           fix="pass --run-dir RUN_DIR, or --project P --topic T for Pub/Sub")
        path = write_inbox(args.run_dir, data)
        return {"published": event.to_json(), "via": "inbox", "path": str(path)}
    project, topic, host = args.project, args.topic, None
    if not (project and topic) and args.run_dir is not None:
        info_path = Path(args.run_dir) / PUBSUB_INFO_FILE
        if info_path.exists():
            info = json.loads(info_path.read_text(encoding="utf-8"))
            project, topic = project or info.get("project"), topic or info.get("topic")
            host = info.get("emulator_host")
    if not (project and topic):
        raise CliError("Pub/Sub mode needs --project and --topic",
                       fix="pass --project P --topic T (set PUBSUB_EMULATOR_HOST for an "
                           "emulator), or use the inbox with --run-dir")
    from orchestrator.events.pubsub_source import make_publisher

    cfg = PubSubConfig(project=project, topic=topic, emulator_host=host)
    attributes = {"kind": event.kind.value, **({"job": job} if job else {})}
    publisher = make_publisher(cfg)
    try:
        message_id = publisher.publish(publisher.topic_path(project, topic), data,
                                       **attributes).result(timeout=30)
    finally:
        publisher.stop()
    return {"published": event.to_json(), "via": "pubsub", "topic": topic,
            "attributes": attributes, "message_id": message_id}


def status(args: argparse.Namespace) -> dict:
    run_dir = Path(args.run_dir)
    return {"events": read_log(run_dir / EVENTS_FILE, limit=args.n),
            "dead_letters": read_log(run_dir / DEAD_LETTERS_FILE, limit=args.n)}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "explain":
        from orchestrator.events.explain import run

        return run(args)
    try:
        result = publish(args) if args.command == "publish" else status(args)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str))
    return 0
