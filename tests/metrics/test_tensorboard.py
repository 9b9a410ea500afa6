"""The TensorBoard sink: step metrics, goodput, lifecycle transitions, events and evals land in
valid event files under RUN_DIR/tensorboard/ (read back with the TFRecord framing and CRCs
checked), and a sink that cannot write never raises into the pipeline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from structlog.testing import capture_logs

from orchestrator.metrics.config import MetricsConfig
from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks, identity_for
from orchestrator.metrics.records import BadStepRecord, EvalRecord
from orchestrator.metrics.tensorboard import EVENTS_PER_STEP, STATES, TensorBoardSink
from orchestrator.shared import configtools
from tests.metrics.synthetic import T0, preempt_shrink_grow_run, step_record, tr, typed
from tests.metrics.tfevents import event_jsons, read_dir, series, visible


def f32(x: float) -> float:
    """What a TensorBoard scalar keeps of ``x`` (simple_value is a float32)."""
    return float(np.float32(x))


def feed_run(logdir, now, events=()):
    """The synthetic preempt/shrink/grow run through a pipeline, in wall-time order, with
    ``events`` (dicts with ``at``) between."""
    timeline, steps, _ = preempt_shrink_grow_run()
    sink = TensorBoardSink(logdir, clock=lambda: now, goodput_every_s=0.0)
    pipe = MetricsPipeline([sink])
    items = [(t["at"], 0, "t", t) for t in timeline] + [(r.wall_time, 1, "s", r) for r in steps]
    items += [(e["at"], 2, "e", e) for e in events]
    for _, _, kind, item in sorted(items, key=lambda x: (x[0], x[1])):
        if kind == "t":
            pipe.on_transition(typed(item))
        elif kind == "e":
            pipe.on_event(item)
        else:
            pipe.on_step(item)
    pipe.close(timeout=30)
    assert pipe.stats()["tensorboard"]["errors"] == 0
    return timeline, steps


def test_step_metrics_are_written_per_step_and_rollbacks_show_the_redone_steps(tmp_path):
    """Every step's loss, MFU, tokens/s, lr, grad norm and incarnation is a scalar at its step and
    wall time; after the rollback TensorBoard shows steps 1..100 once, 51..80 from incarnation 1."""
    _, steps = feed_run(tmp_path / "tb", T0 + 160)
    versions, points = read_dir(tmp_path / "tb")
    assert versions == ["brain.Event:2"]
    raw = series(points, "train/loss")
    assert [p.step for p in raw] == [r.step for r in steps]  # 100 + 30 re-done + 20
    assert [p.value for p in raw] == [f32(r.loss) for r in steps]
    assert [p.wall_time for p in raw] == [r.wall_time for r in steps]
    for tag, field in [("perf/mfu", "mfu"), ("perf/tokens_per_s", "tokens_per_second"),
                       ("train/learning_rate", "lr"), ("train/grad_norm", "grad_norm"),
                       ("perf/step_time_s", "step_time_s"), ("run/slices", "slices")]:
        assert [p.value for p in series(points, tag)] == [f32(getattr(r, field))
                                                          for r in steps], tag
    shown = visible(points, "run/incarnation")
    assert [p.step for p in shown] == list(range(1, 101))
    assert [int(p.value) for p in shown] == [0] * 50 + [1] * 30 + [2] * 20


def test_goodput_is_written_once_transitions_are_known(tmp_path):
    """goodput/goodput and goodput/rolling are fractions written on the step axis."""
    feed_run(tmp_path / "tb", T0 + 160)
    _, points = read_dir(tmp_path / "tb")
    good = series(points, "goodput/goodput")
    assert len(good) == 150
    assert all(0.0 < p.value <= 1.0 for p in good)
    assert len(series(points, "goodput/rolling")) == 150


def test_every_transition_is_a_text_entry_with_its_reason_and_lifecycle_scalars(tmp_path):
    """One text per transition (PREV → STATE: reason, re-form cause), on the seq axis, none
    hidden by TensorBoard; incarnation, state, hosts and slices as scalars at each seq."""
    timeline, _ = feed_run(tmp_path / "tb", T0 + 160)
    _, points = read_dir(tmp_path / "tb")
    texts = visible(points, "lifecycle/transitions")
    assert [p.step for p in texts] == [t["seq"] for t in timeline]
    assert [p.wall_time for p in texts] == [t["at"] for t in timeline]
    assert texts[4].value.startswith("**RUNNING → DRAINING**: preemption")
    assert "step 100" in texts[4].value and "2 slice(s) s0, s1" in texts[4].value
    # live transitions carry their cause typed; these synthetic lines (an older file's shapes,
    # no Planning payload) carry none, and no cause is read from their reasons
    assert not any("re-form" in p.value for p in texts)
    assert texts[0].value.startswith("**start → PLANNING**")
    inc = visible(points, "lifecycle/incarnation")
    assert [int(p.value) for p in inc] == [t["incarnation"] for t in timeline]
    state = visible(points, "lifecycle/state")
    assert [STATES[int(p.value)] for p in state] == [t["state"] for t in timeline]
    assert "4 RUNNING" in state[0].description
    assert [int(p.value) for p in visible(points, "lifecycle/hosts")] == [
        t["hosts"] for t in timeline]


def test_every_tag_with_metadata_names_its_plugin(tmp_path):
    """TensorBoard warns that a tag "is oddly not associated with a plugin" when its first value
    carries metadata naming none: lifecycle/state, described, is a scalar-plugin summary."""
    feed_run(tmp_path / "tb", T0 + 160)
    _, points = read_dir(tmp_path / "tb")
    described = {p.tag: p.plugin for p in points if p.has_metadata}
    assert described["lifecycle/state"] == "scalars"
    assert all(described.values()), described


def test_events_are_on_the_training_step_axis_and_none_is_hidden(tmp_path):
    """An event is written at the furthest training step reached (not at unix milliseconds),
    headed by the step training was at; events at one step share an entry, so TensorBoard,
    which shows a step's last write, hides none, and a rollback moves the axis back for none."""
    at = {"before the first step": T0 + 5, "notice": T0 + 72, "drain": T0 + 72.1,
          "re-done step 60": T0 + 120.2, "grown, step 90": T0 + 150.1}
    feed_run(tmp_path / "tb", T0 + 160,
             events=[{"at": t, "kind": name} for name, t in at.items()])
    _, points = read_dir(tmp_path / "tb")
    written = series(points, "lifecycle/events")
    assert [p.step for p in written] == [0, 100, 100, 100, 100]
    shown = visible(points, "lifecycle/events")
    assert [p.step for p in shown] == [0, 100]
    assert '"kind": "before the first step"' in shown[0].value
    assert "**at training step 0**" in shown[0].value
    last = shown[1].value
    for name, step in [("notice", 100), ("drain", 100), ("re-done step 60", 60),
                       ("grown, step 90", 90)]:
        assert f"**at training step {step}**\n\n    " in last
        assert f'"kind": "{name}"' in last
    assert [e["kind"] for e in event_jsons(last)] == list(at)[1:]


def test_an_event_storm_at_one_step_keeps_the_entry_bounded(tmp_path):
    """More than EVENTS_PER_STEP events at one step: the entry holds the last ones and counts
    the rest (events.jsonl has them all)."""
    sink = TensorBoardSink(tmp_path / "tb", clock=lambda: T0)
    for i in range(EVENTS_PER_STEP + 5):
        sink.on_event({"at": T0 + i, "kind": f"k{i}"})
    sink.close()
    _, points = read_dir(tmp_path / "tb")
    last = visible(points, "lifecycle/events")[-1].value
    assert last.startswith("(5 earlier event(s) at this step: see events.jsonl)")
    assert '"k4"' not in last and '"k5"' in last and f'"k{EVENTS_PER_STEP + 4}"' in last


def test_events_and_evals_are_written(tmp_path):
    """An event is a text entry; an eval record gives loss, perplexity and the task's metrics."""
    sink = TensorBoardSink(tmp_path / "tb", clock=lambda: T0)
    pipe = MetricsPipeline([sink])
    pipe.on_event({"at": T0 + 1, "kind": "preemption_notice", "host": 1})
    pipe.on_event({"at": T0 + 1, "kind": "maintenance", "host": 0})
    pipe.on_eval(EvalRecord(step=100, loss=2.0, wall_time=T0 + 2, tokens=4096,
                            metrics={"accuracy": 0.25}))
    pipe.on_eval(EvalRecord(step=100, loss=3.0, wall_time=T0 + 2, split="val"))
    pipe.close(timeout=30)
    _, points = read_dir(tmp_path / "tb")
    events = visible(points, "lifecycle/events")
    assert len(events) == 1 and events[0].step == 0  # both before a step: one entry
    assert '"kind": "preemption_notice"' in events[0].value
    assert '"kind": "maintenance"' in events[0].value
    assert [(p.step, p.value) for p in series(points, "eval/loss")] == [(100, 2.0)]
    assert series(points, "eval/perplexity")[0].value == f32(math.exp(2.0))
    assert series(points, "eval/accuracy")[0].value == 0.25
    assert series(points, "val/loss")[0].value == 3.0


def test_eval_record_names_are_checked():
    """A split or metric that is not a metric name is refused with the fix."""
    with pytest.raises(BadStepRecord, match="split"):
        EvalRecord(step=1, loss=1.0, wall_time=T0, split="Eval Set")
    with pytest.raises(BadStepRecord, match="reserved"):
        EvalRecord(step=1, loss=1.0, wall_time=T0, metrics={"loss": 1.0})
    assert EvalRecord(step=1, loss=1e6, wall_time=T0).perplexity == math.inf


def test_a_sink_that_cannot_write_logs_once_and_never_raises(tmp_path):
    """RUN_DIR/tensorboard is a file: one error with the fix, every record still accepted."""
    blocker = tmp_path / "tb"
    blocker.write_text("not a directory")
    sink = TensorBoardSink(blocker)
    with capture_logs() as logs:
        for k in range(1, 4):
            sink.on_step(step_record(k, T0 + k, inc=0, slices=1))
        sink.on_transition(tr(0, "PLANNING", None, T0))
        sink.flush()
        sink.close()
    failed = [e for e in logs if e["event"] == "metrics.tensorboard_disabled"]
    assert len(failed) == 1 and "metrics.tensorboard=false" in failed[0]["fix"]


def test_a_write_failing_mid_run_stops_the_sink_quietly(tmp_path, monkeypatch):
    """A full disk after some steps: one error logged, later records dropped, no exception."""
    sink = TensorBoardSink(tmp_path / "tb")
    sink.on_step(step_record(1, T0 + 1, inc=0, slices=1))

    def full(event):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink._writer, "write_event", full)
    with capture_logs() as logs:
        for k in range(2, 5):
            sink.on_step(step_record(k, T0 + k, inc=0, slices=1))
        sink.close()
    assert [e["event"] for e in logs] == ["metrics.tensorboard_disabled"]
    _, points = read_dir(tmp_path / "tb")
    assert [p.step for p in series(points, "train/loss")] == [1]


def test_build_sinks_adds_tensorboard_by_default_and_the_setting_turns_it_off(tmp_path):
    """metrics.tensorboard defaults to true; false leaves the sink out."""
    on = build_sinks(MetricsConfig(), run_dir=tmp_path, identity=identity_for(
        MetricsConfig(), run_name="r"))
    tb = [s for s in on if s.name == "tensorboard"]
    assert len(tb) == 1 and tb[0]._logdir == tmp_path / "tensorboard"
    off_cfg = configtools.build(MetricsConfig, {"tensorboard": False}, prefix="metrics")
    off = build_sinks(off_cfg, run_dir=tmp_path, identity=identity_for(off_cfg, run_name="r"))
    assert "tensorboard" not in [s.name for s in off]
    assert not (tmp_path / "tensorboard").exists()  # nothing is opened before a record


def test_a_re_form_text_names_the_typed_cause(tmp_path):
    """The cause comes from the Planning payload, not from the reason's words."""
    sink = TensorBoardSink(tmp_path / "tb", clock=lambda: T0)
    pipe = MetricsPipeline([sink])
    pipe.on_transition(tr(3, "PLANNING", "RELEASING", T0, slices=["s0"],
                          reason="re-forming after operator: said the reason",
                          payload={"type": "Planning", "cause": "maintenance"}))
    pipe.on_transition(tr(4, "PLANNING", "WAITING_FOR_CAPACITY", T0 + 1, slices=["s0"],
                          reason="capacity returned", payload={"type": "Planning"}))
    pipe.close(timeout=30)
    _, points = read_dir(tmp_path / "tb")
    texts = [p.value for p in visible(points, "lifecycle/transitions")]
    assert "re-form, cause: maintenance" in texts[0] and "re-form" not in texts[1]
