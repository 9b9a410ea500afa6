"""The console's throughput fits the task (issue 53 item 9): a task that sets no
``tokens_per_example`` (a classifier, a regression: a step's "tokens" are its rows) is shown in
examples/s, an LM in tok/s."""

from __future__ import annotations

import io

from orchestrator.metrics.config import MetricsConfig
from orchestrator.metrics.console import ConsoleSink, throughput_unit
from orchestrator.metrics.pipeline import build_sinks, identity_for
from orchestrator.metrics.records import EvalRecord
from tests.metrics.synthetic import T0, step_record


def test_the_unit_follows_the_tasks_tokens_per_step():
    assert throughput_unit(32, 32) == "examples"  # tokens_per_example left at 1
    assert throughput_unit(16 * 127, 16) == "tokens"  # an LM: seq_len - 1 tokens a row


def test_a_task_without_tokens_is_shown_in_examples_per_second(tmp_path, capsys):
    cfg = MetricsConfig(console_every_steps=1, jsonl=False, ray_metrics=False, tensorboard=False)
    sinks = build_sinks(cfg, run_dir=tmp_path, identity=identity_for(cfg, run_name="r"),
                        unit="examples")
    console = next(s for s in sinks if isinstance(s, ConsoleSink))  # printing to stdout
    console.on_step(step_record(1, T0, inc=1, slices=1))
    console.on_eval(EvalRecord(step=1, loss=0.5, wall_time=T0, tokens=64, seconds=0.1))
    text = capsys.readouterr().out
    assert "examples/s" in text and "tok/s" not in text, text
    assert "64 examples in 0.10 s" in text and "tokens" not in text, text


def test_an_lm_keeps_tokens_per_second():
    out = io.StringIO()
    sink = ConsoleSink(every=1, stream=out)
    sink.on_step(step_record(1, T0, inc=1, slices=1))
    sink.on_eval(EvalRecord(step=1, loss=0.5, wall_time=T0, tokens=64, seconds=0.1))
    assert "tok/s" in out.getvalue() and "64 tokens in" in out.getvalue()
