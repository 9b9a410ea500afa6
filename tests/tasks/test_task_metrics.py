"""A task's own step metrics (its loss's second output) travel in the step record to every sink:
``StepRecord.metrics`` survives a metrics.jsonl round trip; lines written before it still read;
a non-numeric metric is refused naming the field."""

from __future__ import annotations

import json

import pytest

from orchestrator.metrics.records import BadStepRecord, StepRecord


def _record(**extra) -> StepRecord:
    return StepRecord.build(step=3, loss=0.5, step_time_s=0.1, tokens=32, flops=1e6,
                            grad_norm=1.0, wall_time=1.0, devices=4, peak=(1e9, "configured"),
                            incarnation=1, slices=1, **extra)


def test_task_metrics_round_trip_through_a_jsonl_line():
    rec = _record(metrics={"mae": 0.25})
    back = StepRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back == rec and back.metrics == {"mae": 0.25}


def test_a_line_from_before_task_metrics_reads_with_none():
    line = _record().to_dict()
    del line["metrics"]
    assert StepRecord.from_dict(line).metrics == {}


def test_a_metric_that_is_not_a_number_is_refused():
    line = {**_record().to_dict(), "metrics": {"mae": "high"}}
    with pytest.raises(BadStepRecord, match="metrics"):
        StepRecord.from_dict(line)
