"""The console's eval line fits the task (issue 53 item 9): perplexity (exp of the loss) only for
a task of tokens; a classifier's or a regression's eval shows its loss and metrics."""

from __future__ import annotations

import io

from orchestrator.metrics.console import ConsoleSink
from orchestrator.metrics.records import EvalRecord
from tests.metrics.synthetic import T0


def _eval_line(unit: str) -> str:
    out = io.StringIO()
    ConsoleSink(every=1, stream=out, unit=unit).on_eval(
        EvalRecord(step=5, loss=0.5, wall_time=T0, tokens=64, seconds=0.1,
                   metrics={"accuracy": 0.75}))
    return out.getvalue()


def test_a_classifiers_eval_shows_no_perplexity_an_lms_does():
    line = _eval_line("examples")
    assert "perplexity" not in line, line
    assert "loss   0.5000" in line and "accuracy 0.75" in line and "64 examples" in line
    assert "perplexity      1.649" in _eval_line("tokens")  # an LM keeps it
