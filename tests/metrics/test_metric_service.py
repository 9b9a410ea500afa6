"""The local MetricService rejects what Cloud Monitoring documents it rejects (and stores the rest).

Driven through the real MetricServiceClient, so the rules are checked on the wire format.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.api import metric_pb2
from google.api_core import exceptions as gexc
from google.cloud import monitoring_v3

from orchestrator.metrics.cloud.client import make_client
from orchestrator.metrics.cloud.writer import _summary_failed_points

GAUGE = metric_pb2.MetricDescriptor.MetricKind.GAUGE
CUMULATIVE = metric_pb2.MetricDescriptor.MetricKind.CUMULATIVE
DOUBLE = metric_pb2.MetricDescriptor.ValueType.DOUBLE
INT64 = metric_pb2.MetricDescriptor.ValueType.INT64
RESOURCE = {"type": "generic_task", "labels": {"project_id": "p", "location": "global",
                                               "namespace": "n", "job": "j", "task_id": "t"}}


def series(end: float, *, mtype: str = "custom.googleapis.com/t/m", labels: dict | None = None,
           kind: int = GAUGE, vtype: int = DOUBLE, start: float | None = None,
           points: int = 1, value: Any = 1.0, resource: dict | None = None) -> Any:
    iv: dict[str, Any] = {"end_time": {"seconds": int(end), "nanos": int((end % 1) * 1e9)}}
    if start is not None:
        iv["start_time"] = {"seconds": int(start), "nanos": int((start % 1) * 1e9)}
    val = {"int64_value": value} if isinstance(value, int) else {"double_value": value}
    return monitoring_v3.TimeSeries(
        metric={"type": mtype, "labels": labels or {}}, resource=resource or RESOURCE,
        metric_kind=kind, value_type=vtype,
        points=[monitoring_v3.Point(interval=iv, value=val) for _ in range(points)])


def write(client: Any, batch: list[Any]) -> None:
    client.create_time_series(name="projects/p", time_series=batch, retry=None, timeout=5)


@pytest.fixture
def client(metric_service):
    return make_client(metric_service.address)


def rejected_with(client: Any, svc: Any, batch: list[Any], needle: str) -> None:
    before = len(svc.state.record.accepted)
    with pytest.raises(gexc.InvalidArgument) as err:
        write(client, batch)
    assert needle in err.value.message
    assert len(svc.state.record.accepted) == before


def test_a_valid_series_is_stored(client, metric_service, clock):
    """One GAUGE point under custom.googleapis.com with a generic_task resource is accepted."""
    write(client, [series(clock())])
    [p] = metric_service.state.points("custom.googleapis.com/t/m")
    assert p.value == 1.0 and p.resource_labels["job"] == "j"


@pytest.mark.parametrize(("make", "needle"), [
    (lambda t: [series(t, points=2)], "exactly one point"),
    (lambda t: [series(t, mtype="compute.googleapis.com/x")], "Unrecognized metric type"),
    (lambda t: [series(t, resource={"type": "gce_instance", "labels": {}})],
     "Unrecognized monitored resource"),
    (lambda t: [series(t, resource={"type": "generic_task", "labels": {"project_id": "p"}})],
     "needs exactly the labels"),
    (lambda t: [series(t, labels={f"k{i}": "v" for i in range(31)})], "Too many labels"),
    (lambda t: [series(t, labels={"k" * 101: "v"})], "Invalid label key"),
    (lambda t: [series(t, labels={"k": "v" * 1025})], "longer than 1024"),
    (lambda t: [series(t, start=t - 1)], "GAUGE points must have the start time"),
    (lambda t: [series(t, kind=CUMULATIVE, vtype=INT64, value=1)], "start time earlier"),
    (lambda t: [series(t + 301)], "5 minutes in the future"),
    (lambda t: [series(t - 25 * 3600 - 1)], "25 hours in the past"),
    (lambda t: [series(t, vtype=INT64, value=1.5)], "does not match the value type"),
])
def test_each_documented_rule_rejects(client, metric_service, clock, make, needle):
    """Every rule in the module docstring turns the bad series away with a clear reason."""
    rejected_with(client, metric_service, make(clock()), needle)


def test_a_series_twice_in_one_request_keeps_only_the_first(client, metric_service, clock):
    """Same series twice: the first point is stored, the duplicate rejected."""
    t = clock()
    with pytest.raises(gexc.InvalidArgument, match="Duplicate TimeSeries"):
        write(client, [series(t), series(t + 5)])
    [p] = metric_service.state.points("custom.googleapis.com/t/m")
    assert p.end == pytest.approx(t)


def test_more_than_200_series_fail_the_whole_request(client, metric_service, clock):
    """201 series in one request: nothing stored."""
    batch = [series(clock(), labels={"i": str(i)}) for i in range(201)]
    rejected_with(client, metric_service, batch, "Too many TimeSeries")


def test_points_of_a_series_need_5s_spacing_and_order(client, metric_service, clock):
    """Same series: +4.9 s rejected, an older point rejected, +5 s accepted."""
    t = clock()
    write(client, [series(t)])
    rejected_with(client, metric_service, [series(t + 4.9)], "more frequently")
    rejected_with(client, metric_service, [series(t - 1)], "Points must be written in order")
    write(client, [series(t + 5.0)])
    assert len(metric_service.state.points("custom.googleapis.com/t/m")) == 2


def test_cumulative_points_share_their_start_time(client, metric_service, clock):
    """A CUMULATIVE start moving back inside the previous interval is rejected; a reset is not."""
    t = clock()
    c = {"kind": CUMULATIVE, "vtype": INT64}
    write(client, [series(t, start=t - 100, value=1, **c)])
    rejected_with(client, metric_service, [series(t + 10, start=t - 50, value=2, **c)],
                  "Points must be written in order")
    write(client, [series(t + 20, start=t - 100, value=3, **c)])
    write(client, [series(t + 40, start=t + 30, value=0, **c)])  # a reset after the last end


def test_descriptor_labels_and_kind_are_enforced(client, metric_service, clock):
    """With a descriptor: unknown label keys and another kind are rejected."""
    d = metric_pb2.MetricDescriptor(type="custom.googleapis.com/t/d", metric_kind=GAUGE,
                                    value_type=DOUBLE, labels=[{"key": "cause"}])
    client.create_metric_descriptor(name="projects/p", metric_descriptor=d)
    name = "projects/p/metricDescriptors/custom.googleapis.com/t/d"
    got = client.get_metric_descriptor(name=name)
    assert [lbl.key for lbl in got.labels] == ["cause"]
    t = clock()
    rejected_with(client, metric_service,
                  [series(t, mtype="custom.googleapis.com/t/d", labels={"other": "x"})],
                  "not defined in the metric descriptor")
    rejected_with(client, metric_service,
                  [series(t, mtype="custom.googleapis.com/t/d", kind=CUMULATIVE, start=t - 1)],
                  "does not match the descriptor")
    write(client, [series(t, mtype="custom.googleapis.com/t/d", labels={"cause": "x"})])


def test_partial_failure_stores_valid_series_and_sends_a_summary(client, metric_service, clock):
    """Two good, one bad: the good ones land; INVALID_ARGUMENT names timeSeries[1] + a summary."""
    t = clock()
    batch = [series(t, labels={"i": "0"}), series(t, labels={"i": "1"}, points=2),
             series(t, labels={"i": "2"})]
    with pytest.raises(gexc.InvalidArgument) as err:
        write(client, batch)
    assert "timeSeries[1]" in err.value.message
    assert _summary_failed_points(err.value) == 1
    stored = metric_service.state.points("custom.googleapis.com/t/m")
    assert sorted(p.metric_labels["i"] for p in stored) == ["0", "2"]


def test_injected_errors_fail_the_next_calls_only(client, metric_service, clock):
    """inject(UNAVAILABLE, 2): two failures, then the service works again."""
    import grpc

    metric_service.state.inject(grpc.StatusCode.UNAVAILABLE, 2)
    for _ in range(2):
        with pytest.raises(gexc.ServiceUnavailable):
            write(client, [series(clock())])
    write(client, [series(clock())])
    assert [c for _, c in metric_service.state.record.calls] == ["UNAVAILABLE", "UNAVAILABLE", "OK"]
