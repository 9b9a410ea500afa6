"""Google's goodput recorder as a metric sink: ``ml-goodput-measurement`` writes its own job and
step markers from our run, so Google's goodput tooling (its calculator, dashboards, Cloud
Monitoring exporter) reads our runs as it reads MaxText's.

On with ``metrics.goodput_recorder: <Cloud Logging log name>`` (the ``goodput`` extra). The
markers, from the lifecycle the controller already keeps:

- job start when the sink starts (the driver's run start), job end at SUCCEEDED/FAILED/STOPPED;
- TPU initialisation: each FORMING (processes, ``jax.distributed``);
- training preparation: each RESTORING (fresh init or checkpoint restore);
- a step start per step (its end time minus its step time).

The sink runs on its own pipeline thread: the library's Cloud Logging writes never touch the
training loop, and a failing write is counted by the pipeline, never raised into the run.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.controller.listener import RunListener
from orchestrator.metrics.goodput import TERMINAL_STATES
from orchestrator.shared.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.controller.records import StepRecord
    from orchestrator.lifecycle import Transition


class Recorder(Protocol):
    """The part of ``ml_goodput_measurement.goodput.GoodputRecorder`` this sink calls."""

    def record_job_start_time(self, start_time: datetime.datetime) -> None: ...
    def record_job_end_time(self, end_time: datetime.datetime) -> None: ...
    def record_tpu_init_start_time(self, start_time: datetime.datetime) -> None: ...
    def record_tpu_init_end_time(self, end_time: datetime.datetime) -> None: ...
    def record_training_preparation_start_time(self, start_time: datetime.datetime) -> None: ...
    def record_training_preparation_end_time(self, end_time: datetime.datetime) -> None: ...
    def record_step_start_time(self, step: int, start_time: datetime.datetime) -> None: ...
    def flush(self) -> None: ...


RecorderFactory = Callable[[str, str], Recorder]
"""(job name, Cloud Logging log name) -> recorder: the seam tests replace."""


def library_recorder(job_name: str, logger_name: str) -> Recorder:
    """The library's own recorder writing to Cloud Logging with application-default
    credentials (production; tests pass a factory of their own)."""
    try:
        from ml_goodput_measurement import goodput
    except ImportError as exc:
        raise ConfigError("metrics.goodput_recorder", "is set but ml-goodput-measurement is "
                          "not installed", "pip install 'tpu-orchestrator[goodput]', or unset "
                          "metrics.goodput_recorder") from exc
    import google.auth.exceptions

    try:
        return goodput.GoodputRecorder(job_name=job_name, logger_name=logger_name,
                                       logging_enabled=True)
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise ConfigError("metrics.goodput_recorder", "is set but no Google credentials were "
                          f"found for Cloud Logging ({exc})", "run `gcloud auth "
                          "application-default login` or use a service account with "
                          "roles/logging.logWriter, or unset metrics.goodput_recorder") from exc


def _utc(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC)


class GoodputRecorderSink(RunListener):
    """Lifecycle transitions and steps -> the library's job, TPU-init, preparation and step
    markers."""

    name = "goodput_recorder"

    def __init__(self, recorder: Recorder, *, clock: Callable[[], float]) -> None:
        self._rec = recorder
        self._ended = False
        recorder.record_job_start_time(_utc(clock()))

    def on_transition(self, t: Transition) -> None:
        at = _utc(t.at)
        prev = t.prev.value if t.prev is not None else None
        state = t.state.value
        if prev == "FORMING":
            self._rec.record_tpu_init_end_time(at)
        elif prev == "RESTORING":
            self._rec.record_training_preparation_end_time(at)
        if state == "FORMING":
            self._rec.record_tpu_init_start_time(at)
        elif state == "RESTORING":
            self._rec.record_training_preparation_start_time(at)
        elif state in TERMINAL_STATES and not self._ended:
            self._ended = True
            self._rec.record_job_end_time(at)
            self._rec.flush()

    def on_step(self, rec: StepRecord) -> None:
        self._rec.record_step_start_time(rec.step, _utc(rec.wall_time - rec.step_time_s))

    def flush(self) -> None:
        self._rec.flush()

    def close(self) -> None:
        self._rec.flush()


def build(logger_name: str, *, job_name: str, clock: Callable[[], float],
          factory: RecorderFactory | None = None) -> Any:
    """The sink for ``metrics.goodput_recorder`` (``factory``: the library's recorder)."""
    return GoodputRecorderSink((factory or library_recorder)(job_name, logger_name), clock=clock)
