"""A local google.monitoring.v3.MetricService that enforces Cloud Monitoring's write rules.

The real ``MetricServiceClient`` talks to it over an insecure loopback channel; nothing here
reaches Google. Rules enforced on CreateTimeSeries (Cloud Monitoring quotas page and the API
reference; docs/metrics.md, "Rules kept"):

1. ``name`` is ``projects/<id>``; at most 200 TimeSeries per request (else the whole request
   fails with INVALID_ARGUMENT, nothing stored).
2. Exactly one point per TimeSeries per request; one TimeSeries (metric type + labels + resource)
   at most once per request.
3. Metric types of user-defined metrics live under ``custom.googleapis.com/``,
   ``workload.googleapis.com/`` or ``external.googleapis.com/``.
4. The monitored resource type is known (``generic_task``: project_id, location, namespace, job,
   task_id; ``global``: project_id; ``generic_node``: project_id, location, namespace, node_id)
   with exactly its labels, and project_id matches the request's project.
5. At most 30 metric labels; keys <= 100 characters matching [A-Za-z_][A-Za-z0-9_]*; values
   <= 1024 characters; if a descriptor exists, label keys must be among its labels, and kind and
   value type must match it (no descriptor: one is created from the first point, as Cloud
   Monitoring does for custom metrics).
6. GAUGE: the start time, if set, equals the end time. CUMULATIVE/DELTA: a start time earlier
   than the end time; CUMULATIVE points of a series share the start time unless the new start
   is at or after the previous end (a reset).
7. The point's value type matches the series' value type.
8. End time no more than 25 h in the past and 5 min in the future (server clock, injectable).
9. Per series, end times strictly increase and are at least 5 s apart.

A request with some bad series stores the valid ones and fails with INVALID_ARGUMENT, a message
like Cloud Monitoring's (``One or more TimeSeries could not be written: <reason>:
timeSeries[0-2,5]``) and a ``CreateTimeSeriesSummary`` in the status details.

``inject(code, times)`` makes the next ``times`` calls fail with ``code`` before any check.
Everything accepted and rejected is recorded for assertions.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.api import metric_pb2
from google.cloud import monitoring_v3
from google.rpc import code_pb2

SERVICE = "google.monitoring.v3.MetricService"
USER_DOMAINS = ("custom.googleapis.com/", "workload.googleapis.com/", "external.googleapis.com/")
RESOURCE_LABELS = {
    "generic_task": {"project_id", "location", "namespace", "job", "task_id"},
    "global": {"project_id"},
    "generic_node": {"project_id", "location", "namespace", "node_id"},
}
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KIND = metric_pb2.MetricDescriptor.MetricKind
_VTYPE = metric_pb2.MetricDescriptor.ValueType
_VALUE_FIELD = {_VTYPE.DOUBLE: "double_value", _VTYPE.INT64: "int64_value",
                _VTYPE.BOOL: "bool_value", _VTYPE.STRING: "string_value",
                _VTYPE.DISTRIBUTION: "distribution_value"}


def _secs(ts: Any) -> float:
    return ts.seconds + ts.nanos / 1e9


@dataclass
class StoredPoint:
    metric_type: str
    metric_labels: dict[str, str]
    resource_labels: dict[str, str]
    start: float | None
    end: float
    value: float | int | str | bool


@dataclass
class _SeriesState:
    last_end: float
    start: float | None


@dataclass
class Rejection:
    index: int
    reason: str
    metric_type: str


@dataclass
class Record:
    """What the server saw, for assertions."""

    accepted: list[StoredPoint] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, status code name)
    descriptor_creates: list[str] = field(default_factory=list)


class MetricServiceState:
    """The service's state and rules; the gRPC handlers are thin wrappers around it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.descriptors: dict[str, metric_pb2.MetricDescriptor] = {}
        self.series: dict[tuple, _SeriesState] = {}
        self.record = Record()
        self._inject: list[tuple[str | None, grpc.StatusCode]] = []

    # -- fault injection ------------------------------------------------------------------
    def inject(self, code: grpc.StatusCode, times: int = 1, *, method: str | None = None) -> None:
        """The next ``times`` calls (of ``method``, or any method) fail with ``code``."""
        with self.lock:
            self._inject.extend([(method, code)] * times)

    def _injected(self, method: str) -> grpc.StatusCode | None:
        for i, (m, code) in enumerate(self._inject):
            if m is None or m == method:
                del self._inject[i]
                return code
        return None

    # -- rules ----------------------------------------------------------------------------
    def _check(self, project: str, ts: Any, now: float) -> str | None:
        """Why this TimeSeries is rejected, or None when it is valid."""
        mtype = ts.metric.type
        if not mtype.startswith(USER_DOMAINS) or len(mtype) <= len("custom.googleapis.com/"):
            return f"Unrecognized metric type {mtype!r}: user metrics must be under {USER_DOMAINS}"
        rtype = ts.resource.type
        if rtype not in RESOURCE_LABELS:
            return f"Unrecognized monitored resource type {rtype!r}"
        if set(ts.resource.labels) != RESOURCE_LABELS[rtype]:
            return (f"Monitored resource {rtype} needs exactly the labels "
                    f"{sorted(RESOURCE_LABELS[rtype])}, got {sorted(ts.resource.labels)}")
        if ts.resource.labels["project_id"] != project:
            return "The resource's project_id does not match the request's project"
        if len(ts.points) != 1:
            return (f"Expected exactly one point per TimeSeries, got {len(ts.points)}: "
                    "Only one point can be written per TimeSeries per request.")
        labels = dict(ts.metric.labels)
        if len(labels) > 30:
            return f"Too many labels: {len(labels)} > 30"
        for k, v in labels.items():
            if len(k) > 100 or not _LABEL_KEY.match(k):
                return f"Invalid label key {k[:120]!r}"
            if len(v) > 1024:
                return f"Label value of {k!r} is longer than 1024 characters"
        desc = self.descriptors.get(mtype)
        kind = ts.metric_kind or (desc.metric_kind if desc else _KIND.GAUGE)
        vtype = ts.value_type or (desc.value_type if desc else 0)
        if desc is not None:
            if kind != desc.metric_kind:
                return (f"Metric kind {_KIND.Name(kind)} does not match the descriptor's "
                        f"{_KIND.Name(desc.metric_kind)} for {mtype}")
            if vtype != desc.value_type:
                return (f"Value type {_VTYPE.Name(vtype)} does not match the descriptor's "
                        f"{_VTYPE.Name(desc.value_type)} for {mtype}")
            allowed = {ld.key for ld in desc.labels}
            extra = sorted(set(labels) - allowed)
            if extra:
                return f"Labels {extra} are not defined in the metric descriptor of {mtype}"
        point = ts.points[0]
        field_name = point.value.WhichOneof("value")
        if vtype and _VALUE_FIELD.get(vtype) != field_name:
            return f"The point's value ({field_name}) does not match the value type"
        iv = point.interval
        if not iv.HasField("end_time"):
            return "The point's interval has no end time"
        end = _secs(iv.end_time)
        start = _secs(iv.start_time) if iv.HasField("start_time") else None
        if kind == _KIND.GAUGE and start is not None and start != end:
            return "GAUGE points must have the start time equal to the end time"
        if kind in (_KIND.CUMULATIVE, _KIND.DELTA) and (start is None or start >= end):
            return "CUMULATIVE and DELTA points need a start time earlier than the end time"
        if end < now - 25 * 3600:
            return "The point's end time is more than 25 hours in the past"
        if end > now + 300:
            return "The point's end time is more than 5 minutes in the future"
        key = self._key(ts)
        prev = self.series.get(key)
        if prev is not None:
            if end <= prev.last_end:
                return ("Points must be written in order. One or more of the points specified "
                        "had an older start time than the most recent point.")
            if end < prev.last_end + 5.0:
                return ("One or more points were written more frequently than the maximum "
                        "sampling period configured for the metric.")
            if (kind == _KIND.CUMULATIVE and start != prev.start and start is not None
                    and start < prev.last_end):
                return ("Points must be written in order. One or more of the points specified "
                        "had an older start time than the most recent point.")
        return None

    @staticmethod
    def _key(ts: Any) -> tuple:
        return (ts.metric.type, tuple(sorted(ts.metric.labels.items())), ts.resource.type,
                tuple(sorted(ts.resource.labels.items())))

    def create_time_series(self, req: Any) -> tuple[grpc.StatusCode, str, Any | None]:
        """Store the valid series; (OK, "", None) or (code, message, summary)."""
        raw = monitoring_v3.CreateTimeSeriesRequest.pb(req)
        with self.lock:
            code = self._injected("CreateTimeSeries")
            if code is not None:
                self.record.calls.append(("CreateTimeSeries", code.name))
                return code, f"injected {code.name}", None
            m = re.fullmatch(r"projects/([^/]+)", raw.name)
            if not m:
                return self._fail_all("CreateTimeSeries", f"Invalid name {raw.name!r}")
            if len(raw.time_series) > 200:
                return self._fail_all("CreateTimeSeries", f"Too many TimeSeries in the request: "
                                      f"{len(raw.time_series)} > 200")
            if not raw.time_series:
                return self._fail_all("CreateTimeSeries", "No TimeSeries in the request")
            now = self.clock()
            seen: set[tuple] = set()
            errors: dict[str, list[int]] = {}
            for i, ts in enumerate(raw.time_series):
                key = self._key(ts)
                reason = ("Duplicate TimeSeries encountered. Only one point can be written per "
                          "TimeSeries per request." if key in seen else self._check(m[1], ts, now))
                seen.add(key)
                if reason is not None:
                    errors.setdefault(reason, []).append(i)
                    self.record.rejected.append(Rejection(index=i, reason=reason,
                                                          metric_type=ts.metric.type))
                    continue
                self._store(ts, key)
            if not errors:
                self.record.calls.append(("CreateTimeSeries", "OK"))
                return grpc.StatusCode.OK, "", None
            self.record.calls.append(("CreateTimeSeries", "INVALID_ARGUMENT"))
            parts = [f"{reason}: timeSeries[{_ranges(idx)}]" for reason, idx in errors.items()]
            message = "One or more TimeSeries could not be written: " + "; ".join(parts)
            failed = sum(len(v) for v in errors.values())
            summary = monitoring_v3.CreateTimeSeriesSummary(
                total_point_count=len(raw.time_series),
                success_point_count=len(raw.time_series) - failed,
                errors=[monitoring_v3.CreateTimeSeriesSummary.Error(
                    status={"code": code_pb2.INVALID_ARGUMENT, "message": reason},
                    point_count=len(idx)) for reason, idx in errors.items()],
            )
            return grpc.StatusCode.INVALID_ARGUMENT, message, summary

    def _fail_all(self, method: str, message: str) -> tuple[grpc.StatusCode, str, None]:
        self.record.calls.append((method, "INVALID_ARGUMENT"))
        self.record.rejected.append(Rejection(index=-1, reason=message, metric_type=""))
        return grpc.StatusCode.INVALID_ARGUMENT, message, None

    def _store(self, ts: Any, key: tuple) -> None:
        point = ts.points[0]
        iv = point.interval
        end = _secs(iv.end_time)
        start = _secs(iv.start_time) if iv.HasField("start_time") else None
        self.series[key] = _SeriesState(last_end=end, start=start)
        if ts.metric.type not in self.descriptors:
            self.descriptors[ts.metric.type] = metric_pb2.MetricDescriptor(
                type=ts.metric.type, metric_kind=ts.metric_kind or _KIND.GAUGE,
                value_type=ts.value_type,
                labels=[{"key": k} for k in sorted(ts.metric.labels)])
        field_name = point.value.WhichOneof("value")
        self.record.accepted.append(StoredPoint(
            metric_type=ts.metric.type, metric_labels=dict(ts.metric.labels),
            resource_labels=dict(ts.resource.labels), start=start, end=end,
            value=getattr(point.value, field_name)))

    def create_metric_descriptor(self, req: Any) -> tuple[grpc.StatusCode, str, Any]:
        raw = monitoring_v3.CreateMetricDescriptorRequest.pb(req)
        with self.lock:
            code = self._injected("CreateMetricDescriptor")
            if code is not None:
                self.record.calls.append(("CreateMetricDescriptor", code.name))
                return code, f"injected {code.name}", None
            d = raw.metric_descriptor
            if not d.type.startswith(USER_DOMAINS):
                return self._fail_all("CreateMetricDescriptor", f"Bad metric type {d.type!r}")
            if len(d.labels) > 30:
                return self._fail_all("CreateMetricDescriptor", "More than 30 labels")
            if d.metric_kind == _KIND.METRIC_KIND_UNSPECIFIED or not d.value_type:
                return self._fail_all("CreateMetricDescriptor", "Kind and value type are required")
            stored = metric_pb2.MetricDescriptor()
            stored.CopyFrom(d)
            stored.name = f"{raw.name}/metricDescriptors/{d.type}"
            self.descriptors[d.type] = stored
            self.record.descriptor_creates.append(d.type)
            self.record.calls.append(("CreateMetricDescriptor", "OK"))
            return grpc.StatusCode.OK, "", stored

    def points(self, metric_type: str) -> list[StoredPoint]:
        with self.lock:
            return [p for p in self.record.accepted if p.metric_type == metric_type]


def _ranges(idx: list[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (how Cloud Monitoring lists series indices)."""
    out: list[str] = []
    start = prev = idx[0]
    for i in idx[1:]:
        if i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = i
    out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)
