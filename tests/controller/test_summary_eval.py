"""The printed summary's eval line fits the task (issue 53 item 9): a classifier's newest eval
(its count is its rows) shows its loss in examples, no perplexity; an LM's keeps perplexity."""

from __future__ import annotations

from orchestrator.controller.ledger import RecoveryLedger
from orchestrator.controller.summary import RunSummary


def _summary(**ev) -> RunSummary:
    led = RecoveryLedger()
    led.absorb(6, None, ({"step": 6, "loss": 1.0, "step_time_s": 0.1,
                          "eval": {"loss": 0.5, "batches": 2, "seconds": 0.1, **ev}},))
    return RunSummary(state="SUCCEEDED", reason="done", step=6, total_steps=6, lost_steps=0,
                      restarts={}, phases_s={}, wall_s=1.0, first_loss=1.0, last_loss=1.0,
                      median_step_s=0.1, compile_s=[], recoveries=[], compiles=[],
                      restores=[], last_eval=led.last_eval)


def test_a_classifiers_last_eval_is_printed_in_examples_without_perplexity():
    s = _summary(rows=64, tokens=64)
    assert s.last_eval["unit"] == "examples"
    text = s.as_text("r")
    assert "  eval at step 6: loss 0.5 (64 examples, 0.1 s)" in text and "perplexity" not in text
    lm = _summary(rows=16, tokens=240)
    assert "  eval at step 6: loss 0.5, perplexity 1.649 (240 tokens, 0.1 s)" in lm.as_text("r")
