"""The Cloud Monitoring metric sink: aggregate per window, then write through the rules.

Runs on its pipeline worker thread; an optional ticker thread exports on time even when no step
comes (a run waiting for capacity still reports goodput and badput; the heartbeat stops, which is
what the absence alert watches). A lock keeps the two from writing at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import StepRecord
from orchestrator.metrics.cloud.aggregate import WindowAggregator
from orchestrator.metrics.cloud.descriptors import BY_NAME, METRICS, descriptor, metric_type
from orchestrator.metrics.cloud.writer import MIN_POINT_SPACING_S, Point, TimeSeriesWriter
from orchestrator.metrics.config import CloudMonitoringConfig
from orchestrator.metrics.goodput import CAUSES, compute_goodput
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.ledger import StepLedger
from orchestrator.metrics.ml_goodput import BUCKETS as ML_BUCKETS

if TYPE_CHECKING:
    from orchestrator.lifecycle import Transition

log = structlog.get_logger(__name__)


class CloudMonitoringSink(RunListener):
    """One point per series per ``window_s``: step aggregates, goodput, badput, restarts."""

    name = "cloud_monitoring"

    def __init__(self, cfg: CloudMonitoringConfig, *, identity: ResourceIdentity, client: Any,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 rolling_window_s: float = 300.0, ticker: bool = True,
                 tick_s: float | None = None) -> None:
        if not cfg.project:
            raise ValueError("CloudMonitoringConfig.project is required")
        self.queue_size = cfg.queue_size
        self._cfg = cfg
        self._client = client
        self._clock = clock
        self._prefix = cfg.metric_prefix.rstrip("/")
        self._extra = tuple(sorted((k, str(v)) for k, v in cfg.extra_labels.items()))
        self._writer = TimeSeriesWriter(client, project=cfg.project, identity=identity,
                                        timeout_s=cfg.timeout_s, max_attempts=cfg.max_attempts,
                                        sleep=sleep)
        self._window = WindowAggregator()
        self._ledger = StepLedger()
        self._timeline: list[Mapping[str, Any]] = []
        self._restarts: dict[str, int] = {}
        self._restores: dict[str, int] = {}
        self._restore_s: dict[str, float] = {}
        self._rolling = rolling_window_s
        self._started = clock()
        self._last_export = self._started
        self._descriptors_done = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick_s = tick_s if tick_s is not None else cfg.window_s / 2
        self._ticker: threading.Thread | None = None
        if ticker:
            self._ticker = threading.Thread(target=self._tick, name="metrics-cloud-ticker",
                                            daemon=True)
            self._ticker.start()

    # -- RunListener ----------------------------------------------------------------------
    def on_step(self, rec: StepRecord) -> None:
        with self._lock:
            self._window.add(rec)
            self._ledger.add(rec)
            self._maybe_export()

    def on_transition(self, transition: Transition) -> None:
        t = transition.to_json()
        with self._lock:
            self._timeline.append(t)
            cause = transition.restart_cause  # the typed payload's, never the reason text
            if cause is not None:
                self._restarts[cause] = self._restarts.get(cause, 0) + 1
            tier = transition.restore_tier
            if tier is not None:
                self._restores[tier] = self._restores.get(tier, 0) + 1
                self._restore_s[tier] = float(getattr(transition.payload, "restore_s", 0.0))
            self._maybe_export()

    def flush(self) -> None:
        with self._lock:
            self._maybe_export()

    def close(self) -> None:
        """Export the last partial window (end nudged to 5 s after the previous point)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5.0)
        with self._lock:
            now = self._clock()
            self._export(max(now, self._last_export + MIN_POINT_SPACING_S), now=now)
        log.info("metrics.cloud_closed", **self.stats())

    def stats(self) -> dict[str, Any]:
        s = self._writer.stats
        return {"requests": s.requests, "retries": s.retries, "points_written": s.points_written,
                "points_rejected": s.points_rejected, "points_dropped": s.points_dropped,
                "points_held": s.points_held, "errors_by_code": dict(s.errors_by_code)}

    # -- internals ------------------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                with self._lock:
                    self._maybe_export()
            except Exception as exc:  # the ticker must outlive any surprise
                log.error("metrics.cloud_tick_failed", error=repr(exc))

    def _maybe_export(self) -> None:
        now = self._clock()
        if now - self._last_export >= self._cfg.window_s:
            self._export(now)

    def _ensure_descriptors(self) -> None:
        if self._descriptors_done:
            return
        from google.api_core import exceptions as gexc

        extra_keys = tuple(k for k, _ in self._extra)
        ok = True
        for m in METRICS:
            try:
                self._client.create_metric_descriptor(
                    name=f"projects/{self._cfg.project}",
                    metric_descriptor=descriptor(self._prefix, m, extra_keys),
                    timeout=self._cfg.timeout_s)
            except gexc.AlreadyExists:
                continue
            except gexc.GoogleAPICallError as exc:
                ok = False
                log.warning("metrics.cloud_descriptor_failed", metric=m.name,
                            code=getattr(exc.grpc_status_code, "name", None), error=exc.message)
                if not isinstance(exc, (gexc.ServiceUnavailable, gexc.DeadlineExceeded,
                                        gexc.ResourceExhausted)):
                    continue
                break  # transient: try the rest at the next window
        self._descriptors_done = ok

    def _export(self, end: float, *, now: float | None = None) -> None:
        """Write points stamped ``end``; values as of ``now`` (defaults to ``end``)."""
        self._last_export = end
        try:
            self._ensure_descriptors()
            self._writer.write(self._points(end, end if now is None else now))
        except Exception as exc:  # never into the pipeline thread's loop
            log.error("metrics.cloud_export_failed", error=repr(exc))

    def _point(self, name: str, value: float | int, end: float,
               labels: tuple[tuple[str, str], ...] = ()) -> Point:
        m = BY_NAME[name]
        return Point(metric=m, metric_type=metric_type(self._prefix, name),
                     labels=tuple(sorted((*labels, *self._extra))), value=value, end=end,
                     start=self._started)

    def _points(self, end: float, now: float) -> list[Point]:
        out: list[Point] = []
        w = self._window.take()
        if w is not None:
            values: dict[str, float] = {"loss": w.loss, "step_time": w.step_time,
                                        "tokens_per_second": w.tokens_per_second,
                                        "grad_norm": w.grad_norm}
            out.append(self._point("mfu", w.mfu, end, (("peak_source", w.peak_source),)))
            out.extend(self._point(k, v, end) for k, v in values.items() if math.isfinite(v))
            out.append(self._point("heartbeat", w.last_step, end))
        if self._timeline:
            g = compute_goodput(self._timeline, self._ledger.items(), now=now,
                                rolling_window_s=self._rolling, samples=2)
            out.append(self._point("goodput", g.goodput, end,
                                   (("slice", "all"), ("window", "cumulative"))))
            out.append(self._point("goodput", g.rolling_goodput, end,
                                   (("slice", "all"), ("window", "rolling"))))
            for name, sg in g.per_slice.items():
                out.append(self._point("goodput", sg.goodput, end,
                                       (("slice", name), ("window", "cumulative"))))
            out.extend(self._point("badput", g.badput_s[c], end, (("cause", c),)) for c in CAUSES)
            ml = g.ml_badput_s
            out.extend(self._point("ml_badput", ml[b], end, (("bucket", b),)) for b in ML_BUCKETS)
        out.extend(self._point("restarts", n, end, (("cause", c),))
                   for c, n in sorted(self._restarts.items()))
        out.extend(self._point("restores", n, end, (("tier", t),))
                   for t, n in sorted(self._restores.items()))
        out.extend(self._point("restore_time", v, end, (("tier", t),))
                   for t, v in sorted(self._restore_s.items()))
        return out
