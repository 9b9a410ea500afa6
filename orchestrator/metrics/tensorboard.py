"""TensorBoard event files in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR``).

Written with tensorboardX's ``EventsWriter`` (TFRecord of ``Event`` protos, no TensorFlow) from
this sink's own pipeline thread: writes are synchronous here, so a failing disk raises into this
sink alone (logged once, then the sink stops writing) and never reaches training. Each driver
start writes a new file (``events.out.tfevents.<time>.<host>.<random>``; the random part so that
no link planted at a name that can be foretold is written through: tensorboardX opens it plainly);
TensorBoard reads them as one run.

What goes where (x-axis, wall time):

- per step (the training step, the step's ``wall_time``): ``train/loss``, ``train/grad_norm``,
  ``train/learning_rate``, ``perf/step_time_s``, ``perf/tokens_per_s``, ``perf/mfu``,
  ``perf/checkpoint_blocking_s``, ``perf/ram_copy_s``, ``run/incarnation``, ``run/slices``,
  ``run/devices``; ``goodput/goodput`` and ``goodput/rolling`` once a transition is known, at
  most every ``goodput_every_s``. Steps re-done after a rollback to an earlier checkpoint are
  written again under the same numbers: TensorBoard drops a tag's points at and after a step
  it sees again, so the curves show what the model went through last, as the run does.
- per transition (the timeline's ``seq``, which only grows, also across drivers; the
  transition's ``at``): scalars ``lifecycle/state`` (position in ``RunState``, legend in the
  tag's description), ``lifecycle/incarnation``, ``lifecycle/step``, ``lifecycle/slices``,
  ``lifecycle/hosts``, and a text ``lifecycle/transitions`` (``PREV → STATE: reason``, with the
  restart cause for a re-form). Lifecycle tags are not on the training-step axis because many
  transitions share a step and a restore goes back to an earlier one: TensorBoard would keep
  only the last of them.
- per event the driver forwards (the furthest training step reached when it came, so the axis
  never goes back and TensorBoard hides none after a rollback): text ``lifecycle/events``, each
  event headed by the step training was at. Events at one step share one entry, written again
  with each (TensorBoard shows a step's last write), holding the step's last
  ``EVENTS_PER_STEP``.
- per eval (the training step): ``<split>/loss``, ``<split>/perplexity`` and the task's extra
  metrics as ``<split>/<name>``; ``perf/eval_time_s``, the seconds the eval took.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import EvalRecord, StepRecord
from orchestrator.metrics.goodput import compute_goodput
from orchestrator.metrics.ledger import StepLedger

if TYPE_CHECKING:
    from orchestrator.lifecycle import Transition

log = structlog.get_logger(__name__)

STATES = ("PLANNING", "FORMING", "RESTORING", "COMPILING", "RUNNING", "HANDING_OVER",
          "DRAINING", "CHECKPOINTING", "RELEASING", "WAITING_FOR_CAPACITY", "BACKOFF",
          "SUCCEEDED", "FAILED", "STOPPED")
"""``lifecycle/state`` values: the position here (``orchestrator.lifecycle.RunState`` order);
-1 for a state not listed."""
_STATE_LEGEND = "state number: " + ", ".join(f"{i} {s}" for i, s in enumerate(STATES))
EVENTS_PER_STEP = 20
"""Events one ``lifecycle/events`` entry holds; earlier ones at that step are counted."""


class TensorBoardSink(RunListener):
    """Step metrics, goodput, lifecycle transitions, events and evals as TensorBoard events."""

    name = "tensorboard"

    def __init__(self, logdir: Path, *, clock: Callable[[], float] = time.time,
                 rolling_window_s: float = 300.0, goodput_every_s: float = 10.0,
                 flush_every_s: float = 5.0) -> None:
        """Opens nothing yet: the file is made on this sink's thread at the first record, so a
        directory that cannot be written is logged there and never stops the driver."""
        self._logdir = Path(logdir)
        self._clock = clock
        self._rolling = rolling_window_s
        self._goodput_every_s = goodput_every_s
        self._flush_every_s = flush_every_s
        self._writer: Any = None
        self._failed = False
        self._last_flush = 0.0
        self._timeline: list[Mapping[str, Any]] = []
        self._steps = StepLedger()
        self._goodput_at: float | None = None
        self._step = 0  # the training step now (a restore goes back)
        self._furthest = 0  # the furthest step reached: the events' axis
        self._step_events: list[str] = []  # the texts of the events at ``_furthest``
        self._events_step = -1
        self._events_dropped = 0

    # -- RunListener ----------------------------------------------------------------------
    def on_step(self, rec: StepRecord) -> None:
        self._steps.add(rec)
        self._at_step(rec.step)
        values = {
            "train/loss": rec.loss, "train/grad_norm": rec.grad_norm,
            "train/learning_rate": rec.lr, "perf/step_time_s": rec.step_time_s,
            "perf/tokens_per_s": rec.tokens_per_second, "perf/mfu": rec.mfu,
            "perf/checkpoint_blocking_s": rec.checkpoint_blocking_s,
            "perf/ram_copy_s": rec.ram_copy_s, "run/incarnation": rec.incarnation,
            "run/slices": rec.slices, "run/devices": rec.devices,
        }
        values.update(self._goodput())
        self._write(rec.step, rec.wall_time, scalars=values)

    def on_transition(self, transition: Transition) -> None:
        t = transition.to_json()
        self._timeline.append(t)
        self._goodput_at = None  # recompute at the next step
        if isinstance(t.get("step"), int):
            self._at_step(t["step"])
        state = str(t.get("state"))
        scalars = {"lifecycle/incarnation": t.get("incarnation"), "lifecycle/step": t.get("step"),
                   "lifecycle/slices": len(t.get("slices") or ()),
                   "lifecycle/hosts": t.get("hosts")}
        self._write(int(t.get("seq") or 0), _wall(t.get("at"), self._clock),
                    scalars={k: v for k, v in scalars.items() if isinstance(v, int | float)},
                    described={"lifecycle/state": (STATES.index(state) if state in STATES
                                                   else -1, _STATE_LEGEND)},
                    texts={"lifecycle/transitions": transition_text(transition)})

    def on_event(self, e: dict[str, Any]) -> None:
        wall = _wall(e.get("at") or e.get("received_at"), self._clock)
        if self._events_step != self._furthest:
            self._events_step, self._step_events, self._events_dropped = self._furthest, [], 0
        self._step_events.append(event_text(e, self._step))
        if len(self._step_events) > EVENTS_PER_STEP:
            self._step_events.pop(0)
            self._events_dropped += 1
        text = "\n\n".join(self._step_events)
        if self._events_dropped:
            text = (f"({self._events_dropped} earlier event(s) at this step: see "
                    f"events.jsonl)\n\n{text}")
        self._write(self._furthest, wall, texts={"lifecycle/events": text})

    def on_eval(self, rec: EvalRecord) -> None:
        values = {f"{rec.split}/loss": rec.loss, f"{rec.split}/perplexity": rec.perplexity}
        values.update({f"{rec.split}/{k}": v for k, v in rec.metrics.items()})
        if rec.seconds > 0:
            values["perf/eval_time_s"] = rec.seconds
        self._write(rec.step, rec.wall_time, scalars=values)

    def flush(self) -> None:
        if self._writer is not None:
            self._guard(self._writer.flush)
            self._last_flush = self._clock()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if not self._failed:
            self._guard(writer.close)
            return
        with contextlib.suppress(Exception):  # already logged: only release the file
            writer.close()

    # -- internals ------------------------------------------------------------------------
    def _at_step(self, step: int) -> None:
        self._step = step
        self._furthest = max(self._furthest, step)

    def _goodput(self) -> dict[str, float]:
        if not self._timeline:
            return {}
        now = self._clock()
        if self._goodput_at is not None and now - self._goodput_at < self._goodput_every_s:
            return {}
        self._goodput_at = now
        g = compute_goodput(self._timeline, self._steps.items(), now=now,
                            rolling_window_s=self._rolling, samples=2)
        return {"goodput/goodput": g.goodput, "goodput/rolling": g.rolling_goodput}

    def _write(self, step: int, wall: float, *, scalars: Mapping[str, Any] | None = None,
               described: Mapping[str, tuple[float, str]] | None = None,
               texts: Mapping[str, str] | None = None) -> None:
        writer = self._open()
        if writer is None:
            return
        from tensorboardX import summary as tbs
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        values = [tbs.scalar(tag, float(v)).value[0] for tag, v in (scalars or {}).items()]
        values += [described_scalar(tag, float(v), about)
                   for tag, (v, about) in (described or {}).items()]
        for tag, text in (texts or {}).items():
            value = tbs.text(tag, text).value[0]
            value.tag = tag  # tensorboardX appends "/text_summary"
            values.append(value)
        event = Event(wall_time=wall, step=int(step), summary=Summary(value=values))
        if self._guard(writer.write_event, event) and self._clock() - self._last_flush >= \
                self._flush_every_s:
            self.flush()

    def _open(self) -> Any:
        if self._writer is None and not self._failed:
            def make() -> Any:
                from tensorboardX.event_file_writer import EventsWriter

                self._logdir.mkdir(parents=True, exist_ok=True)
                return EventsWriter(str(self._logdir / "events"),
                                    filename_suffix=f".{secrets.token_hex(8)}")

            self._writer = self._guard(make)
            self._last_flush = self._clock()
        return self._writer

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn``; on any error log it once with the fix and stop writing (never raise)."""
        if self._failed:
            return None
        try:
            return fn(*args) or True
        except Exception as exc:
            self._failed = True
            log.error("metrics.tensorboard_disabled", logdir=str(self._logdir), error=repr(exc),
                      fix="make RUN_DIR/tensorboard writable with free space and restart the "
                          "run, or set metrics.tensorboard=false; training goes on without it")
            return None


def described_scalar(tag: str, value: float, about: str) -> Any:
    """A scalar with a description, as TensorBoard's scalar plugin writes one (a float32 tensor,
    metadata naming the ``scalars`` plugin): a described ``simple_value`` names no plugin, and
    TensorBoard warns the tag "is oddly not associated with a plugin"."""
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboardX.proto.types_pb2 import DT_FLOAT

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"),
                           display_name=tag, summary_description=about)
    tensor = TensorProto(dtype=DT_FLOAT, tensor_shape=TensorShapeProto(), float_val=[value])
    return Summary.Value(tag=tag, metadata=meta, tensor=tensor)


def event_text(e: Mapping[str, Any], step: int) -> str:
    """The step training was at, then the event's JSON as a markdown code block."""
    body = json.dumps(e, sort_keys=True, default=str)[:4000]
    return f"**at training step {step}**\n\n    {body}"


def transition_text(t: Transition) -> str:
    """``RUNNING → DRAINING: reason`` and the incarnation, step, slices and hosts (markdown),
    with the re-form's cause from the typed payload."""
    prev = t.prev.value if t.prev is not None else "start"
    text = (f"**{prev} → {t.state.value}**: {t.reason}  \n"
            f"incarnation {t.incarnation}, step {t.step}, "
            f"{len(t.slices)} slice(s) {', '.join(t.slices)}, {t.hosts} host(s)")
    cause = t.restart_cause
    if cause is not None:
        text += f"  \nre-form, cause: {cause}"
    return text


def _wall(value: Any, clock: Callable[[], float]) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return clock()
    return out if math.isfinite(out) else clock()
