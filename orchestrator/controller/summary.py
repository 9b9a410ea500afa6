"""The run summary: derived from the lifecycle and the ledger, written by one function on every
exit path (success, terminal failure, operator stop, SIGTERM, uncaught exception).

``lost_steps`` counts every step executed and then discarded: rolled back by a restore, and, for
a run that ends without its final save, the steps past the last save (``unsaved_steps``).
``metrics_gaps`` names the steps trained and checkpointed whose step records never reached
metrics.jsonl (a driver that died before writing them): a gap, not silence."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from orchestrator.controller.context import Run, log
from orchestrator.controller.ledger import Recovery
from orchestrator.lifecycle import RunState
from orchestrator.lifecycle.payloads import data_resumed_text
from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.files import atomic_write_json

EXIT_OK, EXIT_FAILED = 0, 1
EXIT_SIGTERM = 143  # 128 + SIGTERM: orchestrator.driver.signals.EXIT_SIGTERM (no import: Ray-free)


@dataclass
class RunSummary:
    """What the run did; printed at the end and written to RUN_DIR/summary.json."""

    state: str
    reason: str
    step: int
    total_steps: int
    lost_steps: int
    restarts: dict[str, int]
    phases_s: dict[str, float]
    wall_s: float
    first_loss: float | None
    last_loss: float | None
    median_step_s: float | None
    compile_s: list[float]
    recoveries: list[dict]
    compiles: list[dict]
    restores: list[dict]
    forms: list[dict] = dataclasses.field(default_factory=list)
    last_committed_step: int | None = None
    goodput: float | None = None
    badput_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of wall time lost, by cause (docs/metrics.md); empty when goodput is unknown."""
    ml_goodput_badput_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """The same seconds in ``ml-goodput-measurement``'s buckets (``metrics/ml_goodput.py``)."""
    exit_code: int = 0
    stopped_by: str | None = None
    """"SIGTERM" when a stop signal ended the run (exit code 143), "operator" when an operator
    stop event did (``state`` STOPPED, exit code 1 as before), else None."""
    unsaved_steps: int = 0
    """Steps past the last save when the run ended without its final save (in ``lost_steps``)."""
    metrics_gaps: list[list[int]] = dataclasses.field(default_factory=list)
    """[first, last] step ranges restored past with no record in metrics.jsonl."""
    last_eval: dict | None = None
    """The newest eval (``eval.every``): ``{step, loss, perplexity, tokens, batches, seconds,
    metrics, unit}``; None when no eval ran. ``unit``: what ``tokens`` counts, ``examples`` for
    a task without tokens (a classifier: its perplexity means nothing and is not printed)."""
    protection: dict = dataclasses.field(default_factory=dict)
    """The protection the defaults gave this run: the ``auto`` settings' choices and reasons
    (RAM tier on or off, standby slices) and each RAM copy interval chosen (``ram_every``)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def as_text(self, run_dir: object) -> str:
        """The lines ``python -m orchestrator.main`` prints at the end."""
        lines = [
            f"Run {self.state}: {self.reason}",
            f"  steps {self.step}/{self.total_steps}, lost steps {self.lost_steps}, "
            f"restarts {self.restarts or 'none'}",
            f"  loss {_fmt(self.first_loss)} -> {_fmt(self.last_loss)}, median step "
            f"{_fmt(self.median_step_s, 's')}, compile {self.compile_s} s",
            f"  goodput {_fmt(self.goodput, '', pct=True)}, wall {self.wall_s:.1f} s",
            "  time per phase: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.phases_s.items()),
        ]
        if self.stopped_by:
            lines.append(f"  stopped by {self.stopped_by} (exit {self.exit_code}); last "
                         f"committed checkpoint: step {self.last_committed_step}")
        if self.last_eval:
            lines.append(eval_line(self.last_eval))
        if self.unsaved_steps:
            lines.append(f"  {self.unsaved_steps} step(s) past the last save were discarded at "
                         "the end (counted in lost steps)")
        for first, last in self.metrics_gaps:
            lines.append(f"  metrics gap: steps {first}-{last} were trained and checkpointed, "
                         "but their records never reached metrics.jsonl (a driver died first; "
                         "their loss and step times cannot be recovered)")
        for i, r in enumerate(self.restores):
            if i == 0 and r.get("restored_step") is None:
                continue  # the first start, from the seed
            data = data_resumed_text(r.get("data"))
            lines.append(f"  restore: step {r.get('restored_step')} from the "
                         f"{r.get('tier', 'durable')} tier in {r.get('restore_s')} s, lost "
                         f"{r.get('lost_steps', 0)} step(s)" + (f"; {data}" if data else ""))
        lines.extend(recovery_line(r) for r in self.recoveries)
        lines.append(f"  run dir: {run_dir}")
        return "\n".join(lines)


def eval_line(e: dict) -> str:
    """The newest eval as printed: perplexity only for a task of tokens."""
    unit = e.get("unit", "tokens")
    ppl = f", perplexity {_fmt(e['perplexity'])}" if unit == "tokens" else ""
    return (f"  eval at step {e['step']}: loss {_fmt(e['loss'])}{ppl} ({e['tokens']} {unit}, "
            f"{e['seconds']} s)")


def recovery_line(r: dict) -> str:
    """One recovery as printed: kind and cause, what it restored, its time and loss; a grow's
    reason, a restarted driver's predecessor."""
    restored = r.get("restored_step")
    prev = r.get("previous_driver")
    return (f"  recovery ({r.get('kind')}, {r.get('cause')}): "
            + (f"{r['reason']}; " if r.get("reason") else "")
            + (f"the earlier driver {'ended' if prev.get('ended') else 'died'} in "
               f"{prev.get('state')} at step {prev.get('step')}; " if prev else "")
            + (f"restored step {restored}, " if restored is not None else "")
            + (f"open when the run ended ({r.get('ended_in')}), " if r.get("open") else
               f"to first step {_fmt(r.get('to_first_step_s'), 's')}, ")
            + "lost "
              f"{r.get('lost_steps', 0)}, phases {r.get('phases_s')}"
            + (f", processes {r['processes']}" if r.get("processes") else ""))


def _fmt(v: float | None, unit: str = "", *, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.1f}%" if pct else f"{v:.4g}{unit}"


def _rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in seconds.items()}


def _open(r: Recovery | None, state: RunState) -> list[dict]:
    """A recovery the run ended inside (a stop while it waited for capacity, a failure it gave
    up on): in the summary too, marked ``open``, never a first step it did not reach."""
    if r is None:
        return []
    return [{**r.to_json(), "open": True, "ended_in": state.value}]


def newest_on_disk(run: Run) -> int | None:
    """The newest committed Orbax step in RUN_DIR/checkpoints: a run that ends on a failure
    (a disk that filled, a lost host) may have committed a save its hosts never reported, and
    the steps it holds are not lost. None when there is none, or it cannot be read."""
    try:
        steps = ckpt_layout.committed_steps(run.run_dir / "checkpoints")
    except OSError as exc:
        log.warning("committed_steps_unreadable", error=str(exc))
        return None
    return max(steps, default=None)


def write_summary(run: Run, reason: str) -> RunSummary:
    """Build the summary and write summary.json (a write failure is logged, not raised)."""
    report = run.listeners.first("goodput")  # a failing listener is logged: no goodput
    now = run.now()
    led = run.ledger
    state = run.lifecycle.state
    phases = {k.value: round(v, 3) for k, v in run.lifecycle.durations(now).items()}
    if state is not RunState.SUCCEEDED:
        led.committed(newest_on_disk(run))  # a save the hosts committed after their last report
    unsaved = led.unsaved_steps() if state is not RunState.SUCCEEDED else 0
    stopped_by = _stopped_by(run, state)
    summary = RunSummary(
        state=state.value, reason=reason, step=led.step, total_steps=run.cfg.run.total_steps,
        lost_steps=led.lost_steps + unsaved, restarts=led.restart_counts(), phases_s=phases,
        wall_s=round(now - run.started_at, 3), first_loss=led.first_loss,
        last_loss=led.last_loss,
        median_step_s=statistics.median(led.step_times) if led.step_times else None,
        compile_s=[round(c, 3) for c in led.compile_times], compiles=list(led.compiles),
        recoveries=[*(r.to_json() for r in led.recoveries), *_open(led.open_recovery, state)],
        restores=list(led.restores),
        forms=list(led.forms),
        last_committed_step=led.last_committed,
        goodput=report.goodput if report is not None else None,
        badput_s=_rounded(report.badput_s) if report is not None else {},
        ml_goodput_badput_s=_rounded(report.ml_badput_s) if report is not None else {},
        exit_code=(EXIT_OK if state is RunState.SUCCEEDED else
                   EXIT_SIGTERM if stopped_by == "SIGTERM" else EXIT_FAILED),
        stopped_by=stopped_by, unsaved_steps=unsaved,
        metrics_gaps=[list(g) for g in led.metrics_gaps], last_eval=led.last_eval,
        protection={**run.protection,
                    **({"ram_every": list(led.copy_intervals)} if led.copy_intervals else {})})
    try:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run.run_dir / "summary.json", summary.to_json(), indent=2,
                          default=str)
    except OSError as exc:
        log.error("summary_write_failed", error=str(exc))
    return summary


def _stopped_by(run: Run, state: RunState) -> str | None:
    """Who asked the run to stop: the signal, ``"operator"`` (an operator stop event), None."""
    if state is RunState.STOPPED:
        return _stop_signal(run) or "operator"
    return _stop_signal(run) if state is RunState.FAILED else None


def _stop_signal(run: Run) -> str | None:
    """The signal that ended the run: the one the controller drained for, or one that came
    (and a second one cut short) before it could."""
    req = run.stopping_by
    if req is None and run.stop_request is not None:
        try:
            req = run.stop_request()
        except Exception:  # the summary is written whatever the embedding does
            req = None
    return getattr(req, "signal", None)
