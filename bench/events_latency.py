"""Event intake benchmark: publish->recorded latency through the Pub/Sub emulator, and throughput.

    .venv/bin/python bench/events_latency.py [--latency-n 200] [--throughput-n 3000]

Starts Google's Pub/Sub emulator on a free loopback port (killed at the end), a real
EventIntake on a fresh topic/subscription, and a driver-like loop (``wait`` + ``poll``).
* latency: one event at a time; publish time is stamped in the event (observed_at) and
  compared with the time its line was written to events.jsonl ("at").
* throughput (emulator): N events published in publisher batches; events/s from the first
  publish until every event is recorded. Dedupe on (10% of ids repeated).
* throughput (in-process): the same through ``submit`` (parse + dedupe + record + persist),
  which is the intake's own ceiling without the transport.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.emulator import emulator_process
from orchestrator.events.eventlog import read_log
from orchestrator.events.intake import EventIntake
from orchestrator.events.model import Event, EventKind, Target
from orchestrator.events.pubsub_source import make_publisher, make_subscriber
from orchestrator.shared.hosts import HostRef

PROJECT = "bench-project"
HOSTS = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip=f"10.0.0.{i}",
                 instance=f"vm-{i}", devices=1) for i in range(4)]


def _event(event_id: str) -> bytes:
    now = time.time()
    event = Event(kind=EventKind.HOST_UNHEALTHY, target=Target(host=str(int(now) % 4)),
                  source="bench", id=event_id, observed_at=now)
    return json.dumps(event.to_json()).encode()


class DriverLoop:
    """What the driver does between steps: wait briefly, poll, repeat."""

    def __init__(self, intake: EventIntake) -> None:
        self.intake = intake
        self.stop = threading.Event()
        self.handled = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.intake.wait(0.05)
            self.handled += len(self.intake.poll(HOSTS, 0))


def _setup(host: str, tag: str) -> PubSubConfig:
    cfg = PubSubConfig(project=PROJECT, topic=f"t-{tag}", subscription=f"s-{tag}",
                       emulator_host=host, max_messages=1000)
    pub, sub = make_publisher(cfg), make_subscriber(cfg)
    pub.create_topic(request={"name": pub.topic_path(PROJECT, cfg.topic)})
    sub.create_subscription(request={"name": sub.subscription_path(PROJECT, cfg.subscription),
                                     "topic": pub.topic_path(PROJECT, cfg.topic),
                                     "ack_deadline_seconds": 60})
    sub.close()
    return cfg


def _wait_recorded(run_dir: Path, n: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [r for r in read_log(run_dir / "events.jsonl") if r.get("event")]
        if len(records) >= n:
            return records
        time.sleep(0.05)
    return [r for r in read_log(run_dir / "events.jsonl") if r.get("event")]


def bench_latency(host: str, n: int) -> dict:
    cfg = _setup(host, "lat")
    run_dir = Path(tempfile.mkdtemp(prefix="bench-lat-"))
    intake = EventIntake(EventsConfig(inbox=False, pubsub=cfg), run_dir=run_dir, job="bench")
    intake.start()
    loop = DriverLoop(intake)
    loop.thread.start()
    publisher = make_publisher(cfg)
    topic = publisher.topic_path(PROJECT, cfg.topic)
    try:
        publisher.publish(topic, _event("warmup")).result(timeout=30)
        _wait_recorded(run_dir, 1, 30)
        for i in range(n):
            publisher.publish(topic, _event(f"lat-{i}")).result(timeout=30)
            _wait_recorded(run_dir, i + 2, 10)
        records = _wait_recorded(run_dir, n + 1, 30)
    finally:
        loop.stop.set()
        loop.thread.join(timeout=5)
        intake.close()
        publisher.stop()
    lat = sorted((r["at"] - r["event"]["observed_at"]) * 1000 for r in records
                 if r["event"]["id"].startswith("lat-"))
    return {"n": len(lat), "median_ms": round(statistics.median(lat), 1),
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
            "max_ms": round(lat[-1], 1)}


def bench_throughput_pubsub(host: str, n: int) -> dict:
    cfg = _setup(host, "tp")
    run_dir = Path(tempfile.mkdtemp(prefix="bench-tp-"))
    intake = EventIntake(EventsConfig(inbox=False, pubsub=cfg), run_dir=run_dir, job="bench")
    intake.start()
    loop = DriverLoop(intake)
    loop.thread.start()
    publisher = make_publisher(cfg)
    topic = publisher.topic_path(PROJECT, cfg.topic)
    payloads = [_event(f"tp-{i if i % 10 else max(i - 1, 0)}") for i in range(n)]  # 10% dups
    try:
        time.sleep(1.0)  # let the stream open
        start = time.monotonic()
        for future in [publisher.publish(topic, p) for p in payloads]:
            future.result(timeout=60)
        records = _wait_recorded(run_dir, n, 120)
        elapsed = time.monotonic() - start
    finally:
        loop.stop.set()
        loop.thread.join(timeout=5)
        intake.close()
        publisher.stop()
    decisions: dict[str, int] = {}
    for r in records:
        decisions[r["decision"]] = decisions.get(r["decision"], 0) + 1
    return {"n": n, "recorded": len(records), "seconds": round(elapsed, 2),
            "events_per_s": round(len(records) / elapsed), "decisions": decisions}


def bench_throughput_inprocess(n: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-ip-"))
    payloads = [_event(f"ip-{i if i % 10 else max(i - 1, 0)}") for i in range(n)]
    with EventIntake(EventsConfig(inbox=False), run_dir=run_dir, job="bench") as intake:
        start = time.monotonic()
        for i, payload in enumerate(payloads):
            intake.submit(payload, source="bench")
            if i % 100 == 99:
                intake.poll(HOSTS, 0)
        intake.poll(HOSTS, 0)
        elapsed = time.monotonic() - start
        counts = dict(intake.counts)
    return {"n": n, "seconds": round(elapsed, 2), "events_per_s": round(n / elapsed),
            "decisions": counts}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-n", type=int, default=200)
    parser.add_argument("--throughput-n", type=int, default=3000)
    args = parser.parse_args()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    result: dict = {"inprocess_throughput": bench_throughput_inprocess(args.throughput_n * 3)}
    with emulator_process() as emu:
        result["pubsub_latency"] = bench_latency(emu.host_port, args.latency_n)
        result["pubsub_throughput"] = bench_throughput_pubsub(emu.host_port, args.throughput_n)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
