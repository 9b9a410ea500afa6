"""One listener interface: the controller calls every listener, in order, for every callback;
a listener that raises is logged and never stops the run or the others; answers (MFU peak,
goodput) come from the first listener that gives one."""

from __future__ import annotations

import dataclasses

from structlog.testing import capture_logs

from orchestrator.controller.listener import Listeners, RunListener
from orchestrator.metrics.records import StepRecord
from tests.controller.harness import make


class Recorder(RunListener):
    def __init__(self) -> None:
        self.transitions: list = []
        self.steps: list[StepRecord] = []
        self.events: list[dict] = []
        self.final: list = []
        self.chunks: list[tuple[int, int]] = []

    def on_transition(self, t):
        self.transitions.append(t)

    def on_step(self, rec):
        self.steps.append(rec)

    def on_event(self, event):
        self.events.append(event)

    def on_final_group(self, group):
        self.final.append(group)

    def before_chunk(self, run, step, until):
        self.chunks.append((step, until))


class Broken(RunListener):
    """Raises from every callback it overrides."""

    def _boom(self, *args):
        raise RuntimeError("sink down")

    on_transition = on_step = on_event = on_final_group = before_chunk = _boom
    chunk_end = init_faults = resolve_peak = goodput = _boom


class Answers(RunListener):
    def resolve_peak(self, measure):
        return (measure() * 2, "answered")

    def goodput(self):
        """Half the wall time starting up, half running."""
        from orchestrator.metrics.goodput import compute_goodput

        timeline = [{"state": "FORMING", "at": 0.0}, {"state": "RUNNING", "at": 5.0},
                    {"state": "SUCCEEDED", "at": 10.0}]
        return compute_goodput(timeline, [], now=10.0)


def test_the_defaults_are_no_ops():
    x = RunListener()
    assert x.init_faults(None) == [] and x.chunk_end(None, 3, 9) == 9
    assert x.resolve_peak(lambda: 1.0) is None and x.goodput() is None
    for name in ("on_transition", "on_step", "on_eval", "on_event", "on_final_group"):
        assert getattr(x, name)(None) is None


def test_every_listener_sees_the_run_and_a_broken_one_stops_nothing(tmp_path):
    rec = Recorder()
    sim = make(tmp_path, listeners=[Broken(), rec, Answers()], spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0"))
    with capture_logs() as logs:
        summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.step == 20
    timeline = sim.controller.lifecycle.timeline
    assert rec.transitions == timeline[1:], "every transition the controller applied"
    assert [r.step for r in rec.steps][-1] == 20 and len(rec.steps) >= 20
    first = rec.steps[0]
    assert (first.peak_flops_per_device, first.peak_source) == (2e9, "answered")
    assert first.mfu > 0 and first.devices == 4 and first.incarnation == 1
    assert [e["kind"] for e in rec.events] == ["preemption_notice"] and "at" in rec.events[0]
    assert rec.final == [sim.fleet.groups[-1]] and rec.chunks
    assert summary.goodput == 0.5
    assert summary.badput_s["startup"] == 5.0
    assert summary.ml_goodput_badput_s["tpu_initialization"] == 5.0
    failed = {e["callback"] for e in logs if e["event"] == "listener_failed"}
    assert failed >= {"on_transition", "on_step", "on_event", "on_final_group", "before_chunk",
                      "chunk_end", "init_faults", "resolve_peak", "goodput"}


def test_a_peak_no_listener_gives_is_unknown_and_not_asked_again(tmp_path):
    asked: list[int] = []

    class Fails(RunListener):
        def resolve_peak(self, measure):
            asked.append(1)
            raise RuntimeError("no accelerator table")

    rec = Recorder()
    sim = make(tmp_path, listeners=[Fails(), rec], spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0"))
    assert sim.run().state == "SUCCEEDED"
    assert asked == [1] and {r.peak_source for r in rec.steps} == {"unknown"}


def test_without_step_listeners_no_record_is_built(tmp_path, monkeypatch):
    def fail(**kw):
        raise AssertionError("built")

    monkeypatch.setattr(StepRecord, "build", fail)
    assert make(tmp_path, listeners=[RunListener()]).run().state == "SUCCEEDED"


def test_chunk_ends_fold_and_init_faults_add_up():
    class Until(RunListener):
        def __init__(self, at: int) -> None:
            self.at = at

        def chunk_end(self, run, step, until):
            return min(until, self.at)

        def init_faults(self, run):
            return [(0, {"at": self.at})]

    ls = Listeners([Until(9), Broken(), Until(7)])
    with capture_logs():
        assert ls.chunk_end(None, 3, 20) == 7
        assert ls.init_faults(None) == [(0, {"at": 9}), (0, {"at": 7})]
    assert ls.wants("chunk_end") and not ls.wants("on_eval")


def test_step_records_carry_the_hosts_numbers(tmp_path):
    rec = Recorder()
    sim = make(tmp_path, listeners=[rec])
    sim.run()
    host = sim.fleet.groups[0]
    by_step = {r.step: r for r in rec.steps}
    raw = host.records[-1]
    got = dataclasses.asdict(by_step[raw["step"]])
    assert (got["loss"], got["step_time_s"], got["wall_time"]) == (
        raw["loss"], raw["step_time_s"], raw["wall_time"])
    assert got["peak_source"] == "unknown"  # no listener answers the peak
