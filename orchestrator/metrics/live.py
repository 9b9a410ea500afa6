"""The live progress display at a terminal (issue 32 item 7): one bar, redrawn in place, instead
of a progress line every few steps; state changes and evals print above it."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column


def stats_text(*, loss: float | None, mfu: float | None, goodput: float | None,
               state: str) -> str:
    """The bar's right-hand side; n/a until the first step says otherwise."""
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 100:.1f}%"

    loss_s = "n/a" if loss is None else f"{loss:.4f}"
    return f"loss {loss_s} | MFU {pct(mfu)} | goodput {pct(goodput)} | {state}"


class LiveProgress:
    """step / total, elapsed, ETA, loss, MFU, goodput and the run's state, on one line.

    Started lazily at the first line or step so nothing is drawn before the run has begun, and
    stopped at ``close`` (the metrics pipeline closes its sinks when the driver ends).
    """

    def __init__(self, total: int, *, stream: TextIO | None = None) -> None:
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        # A narrow terminal wraps the stats onto more lines; the step, the times and the bar
        # are never elided (rich shrinks every wrappable column otherwise: "step 191/…").
        whole = {"table_column": Column(no_wrap=True)}
        self._progress = Progress(
            TextColumn("step", **whole), MofNCompleteColumn(**whole),
            BarColumn(bar_width=20 if self.console.width >= 110 else 10, **whole),
            TimeElapsedColumn(**whole), TextColumn("ETA", **whole),
            TimeRemainingColumn(compact=True, **whole),
            TextColumn("{task.fields[stats]}", table_column=Column(overflow="fold")),
            console=self.console, redirect_stdout=True, redirect_stderr=True)
        self._task: Any = None
        self._total = total
        self._stats: dict[str, Any] = {"loss": None, "mfu": None, "goodput": None,
                                       "state": "starting"}

    def _ensure(self) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("run", total=self._total,
                                                 stats=stats_text(**self._stats))

    def line(self, text: str) -> None:
        """A line above the bar (a state change, an eval)."""
        self._ensure()
        self._progress.console.print(text, markup=False, highlight=False)

    def update(self, *, step: int | None = None, **stats: Any) -> None:
        self._ensure()
        self._stats.update({k: v for k, v in stats.items() if k in self._stats})
        fields: dict[str, Any] = {"stats": stats_text(**self._stats)}
        if step is not None:
            fields["completed"] = step
        self._progress.update(self._task, **fields)

    def close(self) -> None:
        if self._task is not None:
            self._progress.refresh()
            self._progress.stop()
            self._task = None
