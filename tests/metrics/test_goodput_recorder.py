"""``metrics.goodput_recorder`` (issue 32 item 5): Google's own recorder writes our run's job,
TPU-init, preparation and step markers, and Google's own calculator, reading them back, finds
the goodput we compute. Cloud Logging cannot run here: the fake below stands in for the
library's logger at its one seam (``cloud_logger``) and keeps entries in memory; the recorder
and the calculator are the library's, unchanged."""

from __future__ import annotations

import datetime
import sys
import time

import pytest
from ml_goodput_measurement.src import goodput as mlg

from orchestrator.config import load_config
from orchestrator.metrics.config import MetricsConfig
from orchestrator.metrics.goodput import compute_goodput
from orchestrator.metrics.goodput_recorder import GoodputRecorderSink, library_recorder
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.pipeline import MetricsPipeline, build_sinks
from orchestrator.shared.errors import ConfigError
from tests.metrics.synthetic import step_record, tr, transition

JOB, LOG = "demo-job", "goodput_demo"


class MemoryCloudLogger(mlg._CloudLogger):
    """Cloud Logging for one log, in memory: what the library's logger writes and reads."""

    def __init__(self, job_name: str, log_name: str) -> None:  # no client, no credentials
        self.job_name, self.log_name = job_name, log_name
        self.job_start_time = None
        self.entries: list[dict] = []
        self.flushes = 0

    def write_cloud_logging_entry(self, entry) -> None:
        if entry is not None and entry[mlg._JOB_NAME] == self.job_name:
            self.entries.append(dict(entry))

    def flush(self) -> None:
        self.flushes += 1

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        after = int(last_entry_info[1]) if last_entry_info and last_entry_info[1] else -1
        new = [(i, e) for i, e in enumerate(self.entries) if i > after]
        payload = [e for _, e in new]
        self._update_job_start_time(payload)
        last = (datetime.datetime.now(datetime.UTC), str(new[-1][0])) if new else (None, None)
        return payload, last


def a_run_with_a_restart(t0: float):
    """FORMING 4 s, fresh RESTORING 2 s, COMPILING 3 s, steps 1-20 (0.5 s each), a drain and
    re-form, restore of step 15 (16-20 re-done), steps 16-40, final save, SUCCEEDED."""
    tl = [
        transition(1, "FORMING", "PLANNING", t0, inc=1),
        transition(2, "RESTORING", "FORMING", t0 + 4, inc=1),
        transition(3, "COMPILING", "RESTORING", t0 + 6, inc=1),
        transition(4, "RUNNING", "COMPILING", t0 + 9, inc=1, step=0),
        transition(5, "DRAINING", "RUNNING", t0 + 19, inc=1, step=20),
        transition(6, "PLANNING", "DRAINING", t0 + 20, inc=1, step=20),
        transition(7, "FORMING", "PLANNING", t0 + 21, inc=2),
        transition(8, "RESTORING", "FORMING", t0 + 25, inc=2),
        transition(9, "COMPILING", "RESTORING", t0 + 27, inc=2, step=15),
        transition(10, "RUNNING", "COMPILING", t0 + 28, inc=2, step=15),
        transition(11, "CHECKPOINTING", "RUNNING", t0 + 40.5, inc=2, step=40),
        transition(12, "SUCCEEDED", "CHECKPOINTING", t0 + 41, inc=2, step=40),
    ]
    steps = [step_record(k, t0 + 9 + 0.5 * k, inc=1, slices=1) for k in range(1, 21)]
    steps += [step_record(k, t0 + 28 + 0.5 * (k - 15), inc=2, slices=1) for k in range(16, 41)]
    return tl, steps


def recorder_with(logger: MemoryCloudLogger):
    def factory(job_name: str, logger_name: str):
        assert (job_name, logger_name) == (JOB, LOG)
        return mlg.GoodputRecorder(job_name, logger_name, logging_enabled=True,
                                   cloud_logger=logger)
    return factory


def test_googles_calculator_reads_our_markers_and_finds_our_goodput():
    t0 = time.time() - 120
    tl, steps = a_run_with_a_restart(t0)
    logger = MemoryCloudLogger(JOB, LOG)
    sink = GoodputRecorderSink(recorder_with(logger)(JOB, LOG), clock=lambda: t0)
    happened = [(row["at"], 0, row) for row in tl] + [(r.wall_time, 1, r) for r in steps]
    for _, kind, item in sorted(happened, key=lambda x: x[:2]):  # in time order, as it ran
        if kind == 0:
            sink.on_transition(tr(item["seq"], item["state"], item["prev"], item["at"],
                                  inc=item["incarnation"], step=item["step"]))
        else:
            sink.on_step(item)
    kinds = [next(k for k in e if k not in (mlg._JOB_NAME,)) for e in logger.entries]
    assert kinds[0] == mlg._JOB_START_TIME and kinds[-1] == mlg._JOB_END_TIME
    assert kinds.count(mlg._TPU_INIT_START_TIME) == kinds.count(mlg._TPU_INIT_END_TIME) == 2
    assert kinds.count(mlg._TRAINING_PREPARATION_START_TIME) == 2
    assert kinds.count(mlg._STEP_COUNT) == len(steps) == 45
    assert logger.flushes >= 1, "the job's end is pushed out at once"

    ours = compute_goodput(tl, steps, now=t0 + 41)
    calc = mlg.GoodputCalculator(JOB, LOG, cloud_logger=logger)
    theirs, badput, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    assert last_step == 40
    assert theirs == pytest.approx(ours.goodput * 100, abs=3.0), (theirs, ours.goodput, badput)
    assert badput[mlg.BadputType.TPU_INITIALIZATION] > 0
    assert badput[mlg.BadputType.WASTED_PROGRESS_FROM_DISRUPTION] > 0


def test_the_config_turns_the_sink_on_and_the_pipeline_feeds_it():
    logger = MemoryCloudLogger(JOB, LOG)
    cfg = MetricsConfig(console_every_steps=0, jsonl=False, ray_metrics=False, tensorboard=False,
                        goodput_recorder=LOG)
    sinks = build_sinks(cfg, run_dir=".", identity=ResourceIdentity(
        project_id="local", location="global", namespace="ns", job=JOB, task_id="driver"),
        clock=time.time, recorder_factory=recorder_with(logger))
    assert [type(s) for s in sinks] == [GoodputRecorderSink]
    pipe = MetricsPipeline(sinks)
    pipe.on_step(step_record(1, time.time(), inc=1, slices=1))
    pipe.close()
    assert [e.get(mlg._STEP_COUNT) for e in logger.entries][-1] == 1


def test_a_bad_log_name_is_refused_with_the_rule():
    with pytest.raises(ConfigError, match=r"metrics\.goodput_recorder") as err:
        load_config(None, ["metrics.goodput_recorder='my log!'"])
    assert "letters, digits" in str(err.value)


def test_without_the_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_goodput_measurement", None)
    with pytest.raises(ConfigError, match=r"tpu-orchestrator\[goodput\]"):
        library_recorder(JOB, LOG)
