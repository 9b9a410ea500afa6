"""The pipeline fans out off the caller's thread, counts drops per sink and survives bad sinks."""

from __future__ import annotations

import io
import json
import threading

import pytest
from structlog.testing import capture_logs

from orchestrator.controller.listener import RunListener
from orchestrator.metrics.config import MetricsConfig
from orchestrator.metrics.console import ConsoleSink, format_progress
from orchestrator.metrics.jsonl import JsonlSink
from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks, identity_for
from orchestrator.metrics.raymetrics import RayMetricsSink
from orchestrator.metrics.records import BadStepRecord, StepRecord
from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from tests.metrics.synthetic import T0, step_record, tr


class Recorder(RunListener):
    name = "recorder"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.transitions: list[str] = []
        self.events: list[dict] = []
        self.closed = False

    def on_step(self, rec):
        self.steps.append(rec.step)

    def on_transition(self, t):
        self.transitions.append(t.state.value)

    def on_event(self, e):
        self.events.append(e)

    def close(self):
        self.closed = True


class Stuck(RunListener):
    """Blocks on its first record until released: a sink whose backend hangs."""

    name = "stuck"
    queue_size = 10

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen = 0

    def on_step(self, rec):
        self.seen += 1
        self.release.wait(30)


class Broken(RunListener):
    name = "broken"

    def on_step(self, rec):
        raise RuntimeError("backend exploded")


def recs(n: int) -> list[StepRecord]:
    return [step_record(k, T0 + k, inc=0, slices=1) for k in range(1, n + 1)]


def test_every_sink_gets_every_record_in_order():
    """Steps, transitions and events reach each sink in the order they were sent."""
    a, b = Recorder(), Recorder()
    pipe = MetricsPipeline([a, b], queue_size=1000)
    pipe.on_transition(tr(0, "RUNNING", None, T0))
    for r in recs(50):
        pipe.on_step(r)
    pipe.on_event({"kind": "preemption_notice"})
    assert pipe.flush(timeout=10)
    pipe.close(timeout=10)
    for s in (a, b):
        assert s.steps == list(range(1, 51))
        assert s.transitions == ["RUNNING"] and s.events == [{"kind": "preemption_notice"}]
        assert s.closed
    assert pipe.stats()["recorder"] == {"delivered": 52, "dropped": 0, "errors": 0, "queued": 0}
    assert pipe.stats()["recorder#2"]["delivered"] == 52


def test_a_stuck_sink_drops_only_its_own_records_and_never_blocks_the_caller():
    """A hung sink fills its queue; the caller returns at once; other sinks get everything."""
    stuck, ok = Stuck(), Recorder()
    pipe = MetricsPipeline([stuck, ok], queue_size=1000)
    with capture_logs() as logs:
        for r in recs(200):
            pipe.on_step(r)
    assert pipe.flush(timeout=0.2) is False  # the stuck sink cannot flush
    stats = pipe.stats()
    assert stats["stuck"]["dropped"] in (189, 190)  # 10 queued (+1 taken if it was quick)
    assert stats["recorder"]["dropped"] == 0
    assert any(e["event"] == "metrics.sink_queue_full" and e["sink"] == "stuck" for e in logs)
    stuck.release.set()
    pipe.close(timeout=10)
    assert ok.steps == list(range(1, 201))
    final = pipe.stats()["stuck"]
    assert final["delivered"] + final["dropped"] == 200


def test_a_raising_sink_is_counted_and_logged_once():
    """Exceptions in a sink never reach the caller; one log line per error type."""
    ok = Recorder()
    pipe = MetricsPipeline([Broken(), ok], queue_size=100)
    with capture_logs() as logs:
        for r in recs(20):
            pipe.on_step(r)
        pipe.close(timeout=10)
    assert pipe.stats()["broken"]["errors"] == 20
    assert len([e for e in logs if e["event"] == "metrics.sink_failed"]) == 1
    assert ok.steps == list(range(1, 21))


def test_after_close_records_are_ignored():
    """Late records after close are a no-op, not an error."""
    r = Recorder()
    pipe = MetricsPipeline([r])
    pipe.close(timeout=5)
    pipe.on_step(recs(1)[0])
    assert r.steps == []


def test_jsonl_sink_writes_one_line_per_step(tmp_path):
    """metrics.jsonl holds each StepRecord and reads back equal."""
    sink = JsonlSink(tmp_path / "run" / "metrics.jsonl")
    for r in recs(3):
        sink.on_step(r)
    sink.close()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [StepRecord.from_dict(json.loads(x)) for x in lines] == recs(3)


def test_jsonl_sink_flushes_on_time_not_per_line(tmp_path):
    """Lines reach the file after flush_every_s (or flush()), not one system call per step."""
    now = [0.0]
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path, flush_every_s=1.0, clock=lambda: now[0])
    sink.on_step(recs(1)[0])
    assert path.read_text() == ""
    now[0] = 1.5
    sink.on_step(recs(2)[1])
    assert len(path.read_text().splitlines()) == 2
    sink.on_step(recs(3)[2])
    sink.flush()
    assert len(path.read_text().splitlines()) == 3
    sink.close()


def test_step_record_from_dict_names_the_bad_field():
    """A bad value or a missing field is a BadStepRecord naming the field."""
    good = recs(1)[0].to_dict()
    with pytest.raises(BadStepRecord, match="`step`"):
        StepRecord.from_dict({**good, "step": "ten"})
    del good["mfu"]
    with pytest.raises(BadStepRecord, match="`mfu`"):
        StepRecord.from_dict(good)
    old = recs(1)[0].to_dict()
    del old["lr"], old["checkpoint_blocking_s"]
    assert StepRecord.from_dict({**old, "future_field": 1}).lr == 0.0


def test_console_shows_mfu_with_its_source_and_goodput():
    """The progress line carries step, loss, step time, tokens/s, MFU + peak source, goodput."""
    out = io.StringIO()
    sink = ConsoleSink(every=5, stream=out, clock=lambda: T0 + 10)
    sink.on_transition(tr(0, "COMPILING", None, T0, slices=["s0"]))
    sink.on_transition(tr(1, "RUNNING", "COMPILING", T0 + 5, slices=["s0"]))
    for r in recs(10):
        sink.on_step(r)
    lines = out.getvalue().splitlines()
    progress = [x for x in lines if x.startswith("step ")]
    assert len(progress) == 2
    assert "MFU" in progress[0] and "configured" in progress[0] and "goodput  50.0%" in progress[0]
    assert "tok/s" in format_progress(recs(1)[0], goodput=None)
    assert "goodput n/a" in format_progress(recs(1)[0], goodput=None)


def test_ray_sink_is_harmless_without_ray():
    """No Ray cluster: the sink does nothing and raises nothing."""
    import ray

    assert not ray.is_initialized()
    sink = RayMetricsSink(job="j")
    sink.on_step(recs(1)[0])
    sink.on_transition(tr(1, "PLANNING", "RELEASING", T0, reason="re-forming after timeout",
                          payload={"type": "Planning", "cause": "timeout"}))
    assert not ray.is_initialized()


def test_build_sinks_follows_the_config(tmp_path):
    """Defaults: console, JSONL, Ray and TensorBoard; Cloud Monitoring only when enabled."""
    cfg = MetricsConfig()
    ident = identity_for(cfg, run_name="r1")
    names = [s.name for s in build_sinks(cfg, run_dir=tmp_path, identity=ident)]
    assert names == ["console", "jsonl", "ray_metrics", "tensorboard"]
    cfg2 = configtools.build(MetricsConfig, {
        "console_every_steps": 0, "jsonl": False, "ray_metrics": False, "tensorboard": False,
        "cloud_monitoring": {"enabled": True, "project": "p", "endpoint": "127.0.0.1:1"}},
        prefix="metrics")
    made: list[str | None] = []

    def factory(endpoint):
        made.append(endpoint)
        return object()

    sinks = build_sinks(cfg2, run_dir=tmp_path, identity=identity_for(cfg2, run_name="r1"),
                        client_factory=factory)
    assert [s.name for s in sinks] == ["cloud_monitoring"] and made == ["127.0.0.1:1"]
    sinks[0]._stop.set()
    assert identity_for(cfg2, run_name="r1").labels() == {
        "project_id": "p", "location": "global", "namespace": "tpu-orchestrator", "job": "r1",
        "task_id": "driver"}


@pytest.mark.parametrize(("data", "setting"), [
    ({"cloud_monitoring": {"enabled": True}}, "metrics.cloud_monitoring.project"),
    ({"cloud_monitoring": {"window_s": 4}}, "metrics.cloud_monitoring.window_s"),
    ({"cloud_monitoring": {"endpoint": "localhost"}}, "metrics.cloud_monitoring.endpoint"),
    ({"cloud_monitoring": {"metric_prefix": "compute.googleapis.com/x"}},
     "metrics.cloud_monitoring.metric_prefix"),
    ({"cloud_monitoring": {"extra_labels": {"Bad-Key": "v"}}},
     "metrics.cloud_monitoring.extra_labels.Bad-Key"),
    ({"cloud_monitoring": {"extra_labels": {"cause": "v"}}},
     "metrics.cloud_monitoring.extra_labels.cause"),
    ({"cpu_peak_flops_per_device": 0}, "metrics.cpu_peak_flops_per_device"),
    ({"console_every_steps": -1}, "metrics.console_every_steps"),
    ({"cloud_monitoring": {"nope": 1}}, "metrics.cloud_monitoring.nope"),
])
def test_bad_metrics_config_names_the_setting(data, setting):
    """Every invalid setting raises ConfigError with its full dotted path and a fix."""
    with pytest.raises(ConfigError) as err:
        configtools.build(MetricsConfig, data, prefix="metrics")
    assert err.value.setting == setting
    assert err.value.fix


def test_on_step_never_waits_for_a_stuck_sink():
    """10,000 calls into a hung sink all return; what does not fit is counted as dropped."""
    stuck = Stuck()
    pipe = MetricsPipeline([stuck])
    for r in recs(10_000):
        pipe.on_step(r)
    stuck.release.set()
    pipe.close(timeout=10)
    stats = pipe.stats()["stuck"]
    assert stats["dropped"] >= 10_000 - 10 - 1
    assert stats["delivered"] + stats["dropped"] == 10_000


@pytest.mark.cluster
def test_ray_sink_publishes_with_a_local_ray():
    """With Ray up, gauges and the restart counter are created and set without error."""
    from tests.support.ray_cluster import emulated_cluster

    with emulated_cluster(layout=[]):  # a head node only; its start retried, its processes reaped
        sink = RayMetricsSink(job="j")
        pipe = MetricsPipeline([sink])
        pipe.on_transition(tr(0, "RUNNING", None, T0, slices=["s0"]))
        for r in recs(3):
            pipe.on_step(r)
        pipe.on_transition(tr(1, "PLANNING", "RELEASING", T0 + 5, inc=1, reason="re-forming",
                              payload={"type": "Planning", "cause": "spot_preemption"}))
        pipe.close(timeout=30)
        assert pipe.stats()["ray_metrics"] == {"delivered": 5, "dropped": 0, "errors": 0,
                                               "queued": 0}
        assert sink._gauges is not None and set(sink._gauges) >= {"loss", "mfu", "step"}


def test_console_goodput_is_cached_briefly_then_refreshed():
    """Goodput is recomputed at most every goodput_every_s seconds and after each transition."""
    now = [T0 + 10.0]
    out = io.StringIO()
    sink = ConsoleSink(every=1, stream=out, clock=lambda: now[0], goodput_every_s=2.0)
    sink.on_transition(tr(0, "COMPILING", None, T0, slices=["s0"]))
    sink.on_transition(tr(1, "RUNNING", "COMPILING", T0 + 5, slices=["s0"]))
    sink.on_step(recs(1)[0])  # 5 of 10 s productive
    now[0] = T0 + 11.0
    sink.on_step(recs(2)[1])  # cached: still 50%
    now[0] = T0 + 15.0
    sink.on_step(recs(3)[2])  # refreshed: 10 of 15 s
    goodputs = [x.split("goodput ")[1].split(" |")[0].strip()
                for x in out.getvalue().splitlines() if x.startswith("step ")]
    assert goodputs == ["50.0%", "50.0%", "66.7%"]


def test_console_names_a_re_form_by_its_typed_cause():
    out = io.StringIO()
    sink = ConsoleSink(stream=out, clock=lambda: T0)
    sink.on_transition(tr(2, "PLANNING", "BACKOFF", T0, reason="backoff over",
                          payload={"type": "Planning", "cause": "host_lost"}))
    sink.on_transition(tr(3, "PLANNING", "WAITING_FOR_CAPACITY", T0, reason="capacity returned",
                          payload={"type": "Planning"}))
    first, second = out.getvalue().splitlines()
    assert first.endswith("re-form cause host_lost") and "re-form" not in second
