"""The Cloud Monitoring sink against the local MetricService, through the real client."""

from __future__ import annotations

import statistics
import time

import grpc
import pytest
from structlog.testing import capture_logs

from orchestrator.metrics.cloud.client import make_client
from orchestrator.metrics.cloud.descriptors import BY_NAME, METRICS
from orchestrator.metrics.cloud.sink import CloudMonitoringSink
from orchestrator.metrics.cloud.writer import Point, TimeSeriesWriter
from orchestrator.metrics.config import CloudMonitoringConfig
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.pipeline import MetricsPipeline
from tests.metrics.synthetic import step_record, tr

PREFIX = "custom.googleapis.com/tpu_orchestrator"
IDENTITY = ResourceIdentity(project_id="proj", location="us-central2-b", namespace="tpu-orch",
                            job="run-1", task_id="driver")


def make_sink(svc, clock, **cfg_kw) -> CloudMonitoringSink:
    cfg = CloudMonitoringConfig(enabled=True, project="proj", endpoint=svc.address,
                                **{"window_s": 10.0, **cfg_kw})
    return CloudMonitoringSink(cfg, identity=IDENTITY, client=make_client(svc.address),
                               clock=clock, sleep=clock.sleep, ticker=False)


def start_run(sink, clock) -> None:
    t = clock()
    for i, (state, prev) in enumerate([("PLANNING", None), ("FORMING", "PLANNING"),
                                       ("COMPILING", "FORMING"), ("RUNNING", "COMPILING")]):
        sink.on_transition(tr(i, state, prev, t + i * 0.001, slices=["s0", "s1"]))


def run_steps(sink, clock, first: int, n: int, *, dt: float = 0.01, inc: int = 0) -> list:
    recs = []
    for k in range(first, first + n):
        clock.advance(dt)
        rec = step_record(k, clock(), inc=inc, slices=2, step_time=dt)
        recs.append(rec)
        sink.on_step(rec)
    return recs


def test_long_fast_run_lands_every_metric_with_no_rejected_point(metric_service, clock):
    """10,000 steps of 10 ms: one point per series per 10 s window, nothing rejected."""
    sink = make_sink(metric_service, clock)
    start_run(sink, clock)
    t0 = clock()
    recs = run_steps(sink, clock, 1, 10_000)
    sink.on_transition(tr(4, "RELEASING", "RUNNING", clock(), slices=["s0", "s1"],
                          reason="host_lost: host 3 died"))
    sink.on_transition(tr(5, "PLANNING", "RELEASING", clock(), slices=["s0", "s1"],
                          reason="re-forming after spot_preemption: the reason is for people",
                          payload={"type": "Planning", "cause": "host_lost", "grow": False}))
    sink.on_transition(tr(6, "COMPILING", "RESTORING", clock(), inc=1, slices=["s0"],
                                  payload={"type": "Compiling", "tier": "ram",
                                           "restored_step": 9_999, "restore_s": 0.03,
                                           "nbytes": 1000}))
    clock.advance(1.0)
    sink.close()

    state = metric_service.state
    restores = state.points(f"{PREFIX}/restores")
    assert [(p.value, p.metric_labels.get("tier")) for p in restores][-1:] == [(1, "ram")]
    assert state.record.rejected == []
    assert sink.stats()["points_rejected"] == 0 and sink.stats()["points_dropped"] == 0
    assert sorted(state.record.descriptor_creates) == sorted(f"{PREFIX}/{m.name}" for m in METRICS)
    for m in METRICS:
        assert state.points(f"{PREFIX}/{m.name}"), f"no point for {m.name}"
    heartbeat = state.points(f"{PREFIX}/heartbeat")
    assert len(heartbeat) >= (clock() - t0) // 10 - 1
    assert heartbeat[-1].value == 10_000
    # first window: steps whose wall time is within 10 s of the start, averaged
    first_window = [r for r in recs if r.wall_time - t0 < 10.0 - 1e-9]
    loss0 = state.points(f"{PREFIX}/loss")[0]
    assert loss0.value == pytest.approx(statistics.fmean(r.loss for r in first_window), rel=1e-3)
    step_time0 = state.points(f"{PREFIX}/step_time")[0]
    assert step_time0.value == pytest.approx(0.01)
    assert state.points(f"{PREFIX}/tokens_per_second")[0].value == pytest.approx(512 / 0.01)
    restarts = state.points(f"{PREFIX}/restarts")
    assert [(p.metric_labels["cause"], p.value) for p in restarts] == [("host_lost", 1)]
    causes = {p.metric_labels["cause"] for p in state.points(f"{PREFIX}/badput")}
    assert {"startup", "compile", "lost_steps", "idle"} <= causes
    buckets = {p.metric_labels["bucket"]: p.value for p in state.points(f"{PREFIX}/ml_badput")}
    assert {"tpu_initialization", "program_startup", "wasted_progress_from_disruption",
            "other"} <= set(buckets), "the same badput in ml-goodput-measurement's buckets"
    slices = {(p.metric_labels["slice"], p.metric_labels["window"])
              for p in state.points(f"{PREFIX}/goodput")}
    assert {("all", "cumulative"), ("all", "rolling"), ("s0", "cumulative")} <= slices
    for p in state.record.accepted:
        assert p.resource_labels == IDENTITY.labels()


def test_transient_unavailable_is_retried_with_backoff(metric_service, clock):
    """Three UNAVAILABLE answers: retried after 1, 2, 4 s, then everything lands."""
    sink = make_sink(metric_service, clock)
    start_run(sink, clock)
    run_steps(sink, clock, 1, 500)  # 5 s: no export yet
    metric_service.state.inject(grpc.StatusCode.UNAVAILABLE, 3, method="CreateTimeSeries")
    run_steps(sink, clock, 501, 600)  # crosses the 10 s window
    assert clock.sleeps == [1.0, 2.0, 4.0]
    assert sink.stats()["retries"] == 3
    assert metric_service.state.points(f"{PREFIX}/heartbeat")[0].value >= 1000
    assert metric_service.state.record.rejected == []


def test_quota_errors_back_off_longer(metric_service, clock):
    """RESOURCE_EXHAUSTED waits 10 s, then 20 s: longer than transient errors."""
    sink = make_sink(metric_service, clock)
    start_run(sink, clock)
    metric_service.state.inject(grpc.StatusCode.RESOURCE_EXHAUSTED, 2, method="CreateTimeSeries")
    run_steps(sink, clock, 1, 1100)
    assert clock.sleeps == [10.0, 20.0]
    assert metric_service.state.points(f"{PREFIX}/heartbeat")
    assert metric_service.state.record.rejected == []


def test_persistent_unavailable_drops_the_batch_and_moves_on(metric_service, clock):
    """After max_attempts the window's points are dropped and counted; the next window lands."""
    sink = make_sink(metric_service, clock, max_attempts=3)
    start_run(sink, clock)
    metric_service.state.inject(grpc.StatusCode.UNAVAILABLE, 3, method="CreateTimeSeries")
    run_steps(sink, clock, 1, 1100)
    stats = sink.stats()
    assert stats["points_dropped"] > 0 and stats["retries"] == 2
    run_steps(sink, clock, 1101, 1100)
    assert metric_service.state.points(f"{PREFIX}/heartbeat")[-1].value > 1100


def test_invalid_argument_is_logged_once_and_dropped(metric_service, clock):
    """Two permanent failures with one reason: one log line, no retry, later windows land."""
    sink = make_sink(metric_service, clock)
    start_run(sink, clock)
    metric_service.state.inject(grpc.StatusCode.INVALID_ARGUMENT, 2, method="CreateTimeSeries")
    with capture_logs() as logs:
        run_steps(sink, clock, 1, 3100)
    rejected_logs = [e for e in logs if e["event"] == "metrics.cloud_points_rejected"]
    assert len(rejected_logs) == 1
    assert "injected INVALID_ARGUMENT" in rejected_logs[0]["reason"]
    assert clock.sleeps == []
    assert sink.stats()["points_rejected"] > 0
    assert len(metric_service.state.points(f"{PREFIX}/heartbeat")) == 1


def test_partial_failure_keeps_the_valid_series(metric_service, clock):
    """A batch where one series breaks the spacing rule: the others are stored and counted."""
    client = make_client(metric_service.address)
    writer = TimeSeriesWriter(client, project="proj", identity=IDENTITY, sleep=clock.sleep)
    m = BY_NAME["loss"]
    t = clock()

    def pt(labels, end):
        return Point(metric=m, metric_type=f"{PREFIX}/loss", labels=labels, value=1.0, end=end)

    writer.write([pt((("k", "a"),), t)])
    writer._last_end.clear()  # forget, so the writer's own spacing guard lets it through
    with capture_logs() as logs:
        writer.write([pt((("k", "b"),), t + 1), pt((("k", "a"),), t + 1), pt((("k", "c"),), t + 1)])
    assert writer.stats.points_rejected == 1
    assert writer.stats.points_written == 3
    stored = {p.metric_labels["k"] for p in metric_service.state.points(f"{PREFIX}/loss")}
    assert stored == {"a", "b", "c"}
    rejected = [e["metrics"] for e in logs if e["event"] == "metrics.cloud_points_rejected"]
    assert rejected == [["loss"]]


def test_writer_splits_into_requests_of_at_most_200_series(metric_service, clock):
    """450 series go out as 200 + 200 + 50, all accepted."""
    client = make_client(metric_service.address)
    writer = TimeSeriesWriter(client, project="proj", identity=IDENTITY, sleep=clock.sleep)
    m = BY_NAME["loss"]
    points = [Point(metric=m, metric_type=f"{PREFIX}/loss", labels=(("i", str(i)),), value=1.0,
                    end=clock()) for i in range(450)]
    writer.write(points)
    assert writer.stats.requests == 3
    assert len(metric_service.state.points(f"{PREFIX}/loss")) == 450


def test_writer_holds_back_points_closer_than_5s(metric_service, clock):
    """The writer itself never sends a series twice within 5 s."""
    client = make_client(metric_service.address)
    writer = TimeSeriesWriter(client, project="proj", identity=IDENTITY)
    m = BY_NAME["loss"]
    t = clock()
    for dt in (0.0, 2.0, 4.99, 5.0):
        writer.write([Point(metric=m, metric_type=f"{PREFIX}/loss", labels=(), value=1.0,
                            end=t + dt)])
    assert writer.stats.points_held == 2
    assert metric_service.state.record.rejected == []
    assert len(metric_service.state.points(f"{PREFIX}/loss")) == 2


def test_ticker_exports_while_no_steps_arrive(metric_service, clock):
    """Waiting for capacity, no steps: goodput/badput still land, the heartbeat does not."""
    cfg = CloudMonitoringConfig(enabled=True, project="proj", endpoint=metric_service.address)
    sink = CloudMonitoringSink(cfg, identity=IDENTITY, client=make_client(metric_service.address),
                               clock=clock, sleep=clock.sleep, tick_s=0.02)
    try:
        sink.on_transition(tr(0, "WAITING_FOR_CAPACITY", None, clock(), slices=[]))
        clock.advance(11.0)
        for _ in range(500):
            if metric_service.state.points(f"{PREFIX}/badput"):
                break
            time.sleep(0.01)
    finally:
        sink.close()
    waiting = [p for p in metric_service.state.points(f"{PREFIX}/badput")
               if p.metric_labels["cause"] == "waiting_for_capacity"]
    assert [p.value for p in waiting] == pytest.approx([11.0, 11.0])  # the tick, then close
    assert waiting[1].end - waiting[0].end == pytest.approx(5.0)
    assert metric_service.state.points(f"{PREFIX}/heartbeat") == []


def test_pipeline_with_cloud_sink_never_blocks_on_a_failing_service(metric_service, clock):
    """Service down for good: on_step returns at once, the pipeline drains and closes."""
    sink = make_sink(metric_service, clock, max_attempts=2)
    metric_service.state.inject(grpc.StatusCode.UNAVAILABLE, 10_000)
    pipe = MetricsPipeline([sink], queue_size=100)
    for k in range(1, 2001):
        clock.advance(0.01)
        pipe.on_step(step_record(k, clock(), inc=0, slices=1, step_time=0.01))
    pipe.close(timeout=30)
    stats = pipe.stats()["cloud_monitoring"]
    assert stats["delivered"] + stats["dropped"] == 2000
    assert sink.stats()["points_dropped"] > 0
