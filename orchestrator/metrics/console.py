"""Readable progress on the driver's console (stdout by default): progress lines every few steps,
or at a terminal a live progress bar (``metrics/live.py``); a line per state change either way."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import EvalRecord, StepRecord
from orchestrator.metrics.goodput import compute_goodput
from orchestrator.metrics.ledger import StepLedger

if TYPE_CHECKING:
    from orchestrator.lifecycle import Transition
    from orchestrator.metrics.live import LiveProgress

TOKENS, EXAMPLES = "tokens", "examples"
RATE_LABEL = {TOKENS: "tok/s", EXAMPLES: "examples/s"}


def throughput_unit(tokens_per_step: int, global_batch: int) -> str:
    """What a step's ``tokens`` count: a task that sets no ``tokens_per_example`` (1 a row: a
    classifier, a regression) counts examples, and is shown as examples/s, not tok/s."""
    return EXAMPLES if tokens_per_step == global_batch else TOKENS


def format_progress(rec: StepRecord, *, goodput: float | None, unit: str = TOKENS) -> str:
    """One line a human can scan: step, loss, step time, throughput (tok/s, or examples/s for a
    task without tokens), MFU (with its peak source)."""
    good = "n/a" if goodput is None else f"{goodput * 100:5.1f}%"
    return (f"step {rec.step:>7d} | loss {rec.loss:8.4f} | step {rec.step_time_s * 1e3:8.1f} ms | "
            f"{rec.tokens_per_second:10.0f} {RATE_LABEL[unit]} | MFU {rec.mfu * 100:6.2f}% "
            f"(peak {rec.peak_flops_per_device:.3g} FLOP/s/dev, {rec.peak_source}) | "
            f"goodput {good} | inc {rec.incarnation} slices {rec.slices}")


class ConsoleSink(RunListener):
    """Prints every ``every`` steps; goodput comes from the transitions seen so far.

    Goodput over a long history is not free, so it is recomputed at most every
    ``goodput_every_s`` seconds (fast steps would otherwise spend a core on the console).
    """

    name = "console"

    def __init__(self, *, every: int = 10, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.time, goodput_every_s: float = 2.0,
                 live: LiveProgress | None = None, unit: str = TOKENS) -> None:
        self._every = max(1, every)
        self._unit = unit  # what a step's tokens count: tokens, or examples (throughput_unit)
        self._stream = stream or sys.stdout
        self._clock = clock
        self._timeline: list[Mapping[str, Any]] = []
        self._steps = StepLedger()
        self._goodput_every_s = goodput_every_s
        self._cached: tuple[float, float] | None = None  # (computed at, value)
        self._live = live  # at a terminal: a bar instead of progress lines

    def on_transition(self, t: Transition) -> None:
        self._timeline.append(t.to_json())
        self._cached = None
        prev = t.prev.value if t.prev is not None else None
        cause = f" re-form cause {t.restart_cause}" if t.restart_cause else ""
        self._print(f"state {prev} -> {t.state.value} ({t.reason}) "
                    f"inc {t.incarnation} slices {len(t.slices)} "
                    f"hosts {t.hosts} step {t.step}{cause}")
        if self._live is not None:
            self._live.update(state=t.state.value)
            if t.state.terminal:
                self._live.close()  # the summary follows on plain lines

    def on_step(self, rec: StepRecord) -> None:
        self._steps.add(rec)
        if self._live is not None:
            self._live.update(step=rec.step, loss=rec.loss, mfu=rec.mfu, goodput=self._goodput())
        elif rec.step % self._every == 0:
            print(format_progress(rec, goodput=self._goodput(), unit=self._unit),
                  file=self._stream, flush=True)

    def on_eval(self, rec: EvalRecord) -> None:
        """One line per eval; perplexity only for a task of tokens (exp of a classifier's or a
        regression's loss means nothing)."""
        extra = "".join(f" | {k} {v:.4g}" for k, v in sorted(rec.metrics.items()))
        ppl = f" | perplexity {rec.perplexity:10.4g}" if self._unit == TOKENS else ""
        self._print(f"{rec.split} at step {rec.step:>5d} | loss {rec.loss:8.4f}{ppl}{extra} | "
                    f"{rec.tokens} {self._unit} in {rec.seconds:.2f} s")

    def close(self) -> None:
        if self._live is not None:
            self._live.close()

    def _print(self, text: str) -> None:
        if self._live is not None:
            self._live.line(text)
        else:
            print(text, file=self._stream, flush=True)

    def _goodput(self) -> float | None:
        if not self._timeline:
            return None
        now = self._clock()
        if self._cached is None or now - self._cached[0] >= self._goodput_every_s:
            value = compute_goodput(self._timeline, self._steps.items(), now=now,
                                    samples=2).goodput
            self._cached = (now, value)
        return self._cached[1]
