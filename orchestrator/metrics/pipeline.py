"""Fan metric records out to sinks off the training path.

Each sink gets its own bounded queue and worker thread: a slow or failing sink (Cloud Monitoring
retrying with backoff) fills only its own queue, and what no longer fits is dropped and counted
for that sink alone. ``on_step`` / ``on_transition`` / ``on_event`` / ``on_eval`` never block and
never raise into the driver's loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import EvalRecord, StepRecord
from orchestrator.metrics.config import MetricsConfig
from orchestrator.metrics.identity import ResourceIdentity

if TYPE_CHECKING:
    from orchestrator.lifecycle import Transition

log = structlog.get_logger(__name__)

_STOP = object()


@dataclass
class _Counters:
    delivered: int = 0
    dropped: int = 0
    errors: int = 0


class _Flush:
    """A marker that a worker acknowledges once everything queued before it was handled."""

    def __init__(self) -> None:
        self.done = threading.Event()


class _SinkWorker:
    """One sink, its queue and its thread."""

    def __init__(self, sink: RunListener, queue_size: int) -> None:
        self.sink = sink
        self.name = getattr(sink, "name", type(sink).__name__)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.counters = _Counters()
        self._logged: set[str] = set()
        self.thread = threading.Thread(target=self._run, name=f"metrics-{self.name}", daemon=True)
        self.thread.start()

    def offer(self, item: tuple[str, Any]) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.counters.dropped += 1
            if self.counters.dropped == 1 or self.counters.dropped % 1000 == 0:
                log.warning("metrics.sink_queue_full", sink=self.name,
                            dropped=self.counters.dropped, queue_size=self.queue.maxsize)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                self._call("close", None)
                return
            if isinstance(item, _Flush):
                self._call("flush", None)
                item.done.set()
                continue
            kind, payload = item
            if self._call(kind, payload):
                self.counters.delivered += 1

    def _call(self, method: str, payload: Any) -> bool:
        try:
            fn = getattr(self.sink, method)
            if payload is None:
                fn()
            else:
                fn(payload)
            return True
        except Exception as exc:  # a sink must never take the pipeline down
            self.counters.errors += 1
            key = f"{method}:{type(exc).__name__}"
            if key not in self._logged:
                self._logged.add(key)
                log.error("metrics.sink_failed", sink=self.name, method=method,
                          error=repr(exc), note="logged once per sink, method and error type")
            return False


class MetricsPipeline(RunListener):
    """Non-blocking fan-out of step records, transitions, events and evals to sinks: one
    listener of the run, whose sinks are listeners too (each on its own thread)."""

    def __init__(self, sinks: list[RunListener], *, queue_size: int = 10_000) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        self._workers = [_SinkWorker(s, getattr(s, "queue_size", None) or queue_size)
                         for s in sinks]
        self._closed = False

    def on_step(self, rec: StepRecord) -> None:
        self._offer(("on_step", rec))

    def on_transition(self, t: Transition) -> None:
        self._offer(("on_transition", t))  # frozen: safe to share between sink threads

    def on_event(self, e: dict[str, Any]) -> None:
        self._offer(("on_event", dict(e)))

    def on_eval(self, rec: EvalRecord) -> None:
        self._offer(("on_eval", rec))

    def _offer(self, item: tuple[str, Any]) -> None:
        if self._closed:
            return
        for w in self._workers:
            w.offer(item)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every sink handled what was queued and flushed; False on timeout."""
        if self._closed:
            return True
        deadline = time.monotonic() + timeout
        markers = []
        for w in self._workers:
            marker = _Flush()
            try:
                w.queue.put(marker, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                return False
            markers.append(marker)
        return all(m.done.wait(max(0.0, deadline - time.monotonic())) for m in markers)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per sink: records delivered, dropped (queue full) and errors (the sink raised)."""
        out: dict[str, dict[str, int]] = {}
        for w in self._workers:
            name = w.name
            n = 2
            while name in out:
                name = f"{w.name}#{n}"
                n += 1
            out[name] = {"delivered": w.counters.delivered, "dropped": w.counters.dropped,
                         "errors": w.counters.errors, "queued": w.queue.qsize()}
        return out

    def close(self, timeout: float = 30.0) -> None:
        """Drain the queues, close every sink; sinks still busy at the timeout are abandoned."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        for w in self._workers:
            try:
                w.queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                log.warning("metrics.sink_close_timeout", sink=w.name, stage="enqueue")
        for w in self._workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
            if w.thread.is_alive():
                log.warning("metrics.sink_close_timeout", sink=w.name, stage="drain",
                            queued=w.queue.qsize())


def build_sinks(cfg: MetricsConfig, *, run_dir: Path, identity: ResourceIdentity,
                clock: Callable[[], float] = time.time,
                client_factory: Callable[[str | None], Any] | None = None,
                live_total: int | None = None,
                recorder_factory: Callable[[str, str], Any] | None = None,
                unit: str = "tokens") -> list[RunListener]:
    """The sinks the config turns on. ``client_factory`` is the Cloud Monitoring seam and
    ``recorder_factory`` the goodput recorder's; ``live_total`` (the run's steps) turns the
    console's progress lines into a live bar; ``unit`` is what the console calls a step's
    tokens (``console.throughput_unit``: tokens, or examples)."""
    from orchestrator.metrics.console import ConsoleSink
    from orchestrator.metrics.jsonl import JsonlSink
    from orchestrator.metrics.raymetrics import RayMetricsSink

    sinks: list[RunListener] = []
    if cfg.console_every_steps > 0:
        live = None
        if live_total is not None:
            from orchestrator.metrics.live import LiveProgress

            live = LiveProgress(live_total)
        sinks.append(ConsoleSink(every=cfg.console_every_steps, clock=clock, live=live,
                                 unit=unit))
    if cfg.jsonl:
        sinks.append(JsonlSink(Path(run_dir) / "metrics.jsonl"))
    if cfg.ray_metrics:
        sinks.append(RayMetricsSink(job=identity.job))
    if cfg.tensorboard:
        from orchestrator.metrics.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(Path(run_dir) / "tensorboard", clock=clock,
                                     rolling_window_s=cfg.rolling_window_s))
    cm = cfg.cloud_monitoring
    if cm.enabled:
        from orchestrator.metrics.cloud.client import make_client
        from orchestrator.metrics.cloud.sink import CloudMonitoringSink

        factory = client_factory or make_client
        sinks.append(CloudMonitoringSink(cm, identity=identity, client=factory(cm.endpoint),
                                         clock=clock, rolling_window_s=cfg.rolling_window_s))
    if cfg.goodput_recorder is not None:
        from orchestrator.metrics import goodput_recorder

        sinks.append(goodput_recorder.build(cfg.goodput_recorder, job_name=identity.job,
                                            clock=clock, factory=recorder_factory))
    return sinks


def identity_for(cfg: MetricsConfig, *, run_name: str) -> ResourceIdentity:
    """The generic_task identity from the config (job defaults to the run name)."""
    cm = cfg.cloud_monitoring
    return ResourceIdentity(project_id=cm.project or "local", location=cm.location,
                            namespace=cm.namespace, job=cm.job or run_name,
                            task_id=cm.task_id or "driver")
