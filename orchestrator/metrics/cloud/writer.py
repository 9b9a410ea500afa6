"""Write points to Cloud Monitoring within the API's rules, off the training path.

Rules kept here (docs/metrics.md): at most 200 series per request; one point per series per
request; a series' points at least 5 s apart with strictly increasing end times; label keys
<= 100 chars, values <= 1024 chars; GAUGE points carry only an end time (start == end);
CUMULATIVE points of a series share one start time. Transient errors are retried with backoff,
quota errors back off longer, permanent errors (INVALID_ARGUMENT) are logged once per reason and
the rejected series dropped; partial failures keep what the service stored.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from google.api_core import exceptions as gexc
from google.cloud import monitoring_v3

from orchestrator.metrics.cloud.descriptors import CUMULATIVE, INT64, MetricDef
from orchestrator.metrics.cloud.retry import retry_delay
from orchestrator.metrics.identity import RESOURCE_TYPE, ResourceIdentity

log = structlog.get_logger(__name__)

MAX_SERIES_PER_REQUEST = 200
MIN_POINT_SPACING_S = 5.0
MAX_LABEL_VALUE = 1024
_INDEX_RANGE = re.compile(r"timeSeries\[([0-9,\- ]+)\]")


@dataclass(frozen=True, kw_only=True)
class Point:
    """One value for one series at ``end``; ``start`` only for CUMULATIVE metrics."""

    metric: MetricDef
    metric_type: str
    labels: tuple[tuple[str, str], ...]
    value: float | int
    end: float
    start: float | None = None

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.metric_type, self.labels)


@dataclass
class WriterStats:
    requests: int = 0
    retries: int = 0
    points_written: int = 0
    points_rejected: int = 0
    points_dropped: int = 0
    points_held: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)


def _ts(t: float) -> dict[str, int]:
    seconds, nanos = divmod(round(t * 1e9), 1_000_000_000)
    return {"seconds": seconds, "nanos": nanos}


def _indices(text: str) -> set[int]:
    """'timeSeries[0-2,5]' in an error message -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for group in _INDEX_RANGE.findall(text):
        for part in group.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            elif part:
                out.add(int(part))
    return out


class TimeSeriesWriter:
    """Sends batches of points with ``client.create_time_series``; never raises."""

    def __init__(self, client: Any, *, project: str, identity: ResourceIdentity,
                 timeout_s: float = 10.0, max_attempts: int = 5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._name = f"projects/{project}"
        self._resource = {"type": RESOURCE_TYPE, "labels": identity.labels()}
        self._timeout = timeout_s
        self._max_attempts = max_attempts
        self._sleep = sleep
        self._last_end: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._logged: set[str] = set()
        self.stats = WriterStats()
        self.rejections: list[str] = []

    def _series(self, p: Point) -> monitoring_v3.TimeSeries:
        interval: dict[str, Any] = {"end_time": _ts(p.end)}
        if p.metric.kind == CUMULATIVE and p.start is not None:
            interval["start_time"] = _ts(p.start)
        value = ({"int64_value": int(p.value)} if p.metric.value_type == INT64
                 else {"double_value": float(p.value)})
        return monitoring_v3.TimeSeries(
            metric={"type": p.metric_type,
                    "labels": {k[:100]: v[:MAX_LABEL_VALUE] for k, v in p.labels}},
            resource=self._resource,
            metric_kind=p.metric.kind,
            value_type=p.metric.value_type,
            points=[monitoring_v3.Point(interval=monitoring_v3.TimeInterval(interval),
                                        value=monitoring_v3.TypedValue(value))],
        )

    def write(self, points: Sequence[Point]) -> None:
        """Send ``points``; series too close to their previous point are held back (dropped)."""
        ready: list[Point] = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for p in points:
            last = self._last_end.get(p.key)
            if p.key in seen or (last is not None and p.end < last + MIN_POINT_SPACING_S):
                self.stats.points_held += 1
                continue
            seen.add(p.key)
            ready.append(p)
        for i in range(0, len(ready), MAX_SERIES_PER_REQUEST):
            self._send(ready[i:i + MAX_SERIES_PER_REQUEST])

    def _send(self, batch: list[Point]) -> None:
        request = monitoring_v3.CreateTimeSeriesRequest(
            name=self._name, time_series=[self._series(p) for p in batch])
        attempt = 0
        while True:
            self.stats.requests += 1
            try:
                self._client.create_time_series(request=request, retry=None, timeout=self._timeout)
            except gexc.GoogleAPICallError as exc:
                code = exc.grpc_status_code.name if exc.grpc_status_code else type(exc).__name__
                self.stats.errors_by_code[code] = self.stats.errors_by_code.get(code, 0) + 1
                if code == "INVALID_ARGUMENT":
                    self._partial_failure(batch, exc)
                    return
                delay = retry_delay(code, attempt)
                attempt += 1
                if delay is None or attempt >= self._max_attempts:
                    self.stats.points_dropped += len(batch)
                    self._log_once(f"drop:{code}", "metrics.cloud_points_dropped", code=code,
                                   points=len(batch), attempts=attempt, error=exc.message)
                    return
                self.stats.retries += 1
                log.info("metrics.cloud_retry", code=code, attempt=attempt, delay_s=delay)
                self._sleep(delay)
                continue
            except Exception as exc:  # network stack surprises: never into the caller
                self.stats.points_dropped += len(batch)
                self._log_once(f"drop:{type(exc).__name__}", "metrics.cloud_points_dropped",
                               code=type(exc).__name__, points=len(batch), error=repr(exc))
                return
            self._stored(batch)
            return

    def _stored(self, batch: Sequence[Point]) -> None:
        for p in batch:
            self._last_end[p.key] = p.end
        self.stats.points_written += len(batch)

    def _partial_failure(self, batch: list[Point], exc: gexc.GoogleAPICallError) -> None:
        """Valid series were stored; the indices in the message are the rejected ones."""
        bad = {i for i in _indices(exc.message or "") if 0 <= i < len(batch)}
        failed = len(bad)
        if not bad:  # no indices in the message: the summary's count, else all of them
            summary = _summary_failed_points(exc)
            failed = len(batch) if summary is None else min(len(batch), summary)
            if failed == len(batch):
                bad = set(range(len(batch)))
        self._stored([p for i, p in enumerate(batch) if i not in bad])
        self.stats.points_written -= failed - len(bad)
        self.stats.points_rejected += failed
        rejected = failed
        reason = re.sub(r"timeSeries\[[0-9,\- ]+\]", "timeSeries[...]", exc.message or "")
        self.rejections.append(reason)
        self._log_once(f"invalid:{reason}", "metrics.cloud_points_rejected", reason=reason,
                       rejected=rejected,
                       metrics=sorted({batch[i].metric.name for i in bad}),
                       note="permanent error: these points are dropped; logged once per reason")

    def _log_once(self, key: str, event: str, **kw: Any) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning(event, **kw)


def _summary_failed_points(exc: gexc.GoogleAPICallError) -> int | None:
    """Failed point count from a CreateTimeSeriesSummary error detail, if the service sent one."""
    summary_pb = monitoring_v3.CreateTimeSeriesSummary.pb()
    for detail in exc.details or ():
        if hasattr(detail, "Is") and detail.Is(summary_pb.DESCRIPTOR):
            summary = summary_pb()
            detail.Unpack(summary)
            return summary.total_point_count - summary.success_point_count
    return None
