"""Orchestrated runs: ``python -m orchestrator.main`` in a child process, read from its run dir.

The driver owns its emulated Ray cluster (as ``make run`` does); the benchmark only starts it,
optionally interrupts it (the full-restart baseline), and reads ``summary.json``,
``metrics.jsonl`` and ``timeline.jsonl``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import procs


@dataclass
class RunDir:
    """What one run directory says, parsed once."""

    path: Path
    summary: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> RunDir:
        summary_path = path / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return cls(path=path, summary=summary, metrics=read_jsonl(path / "metrics.jsonl"),
                   timeline=read_jsonl(path / "timeline.jsonl"))


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines of a JSONL file (a torn last line of a live run is skipped)."""
    out: list[dict] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def log_path(run_dir: Path) -> Path:
    """The driver's stdout/stderr, beside its run dir (appended across resubmissions)."""
    return run_dir.parent / f"{run_dir.name}.log"


def main_cmd(run_dir: Path, overrides: list[str]) -> list[str]:
    return procs.python_cmd("orchestrator.main", "--log-format", "json",
                            f"run.run_dir={run_dir}", *overrides)


def run_main(run_dir: Path, overrides: list[str], *, timeout_s: float) -> tuple[int, RunDir]:
    """Run the driver to the end; returns its exit code and its run dir."""
    proc = procs.start(main_cmd(run_dir, overrides), log_path=log_path(run_dir))
    try:
        code = proc.wait(timeout=timeout_s)
    except Exception:
        procs.interrupt_then_kill(proc, grace_s=30)
        raise TimeoutError(f"orchestrator run in {run_dir} took over {timeout_s:.0f}s; stopped it. "
                           f"Log: {log_path(run_dir)}") from None
    return code, RunDir.read(run_dir)


def run_until_step(run_dir: Path, overrides: list[str], *, stop_at_step: int, timeout_s: float,
                   grace_s: float = 60.0) -> dict:
    """Start the driver, and when its metrics show ``stop_at_step``, kill the job (SIGINT, then
    SIGKILL after ``grace_s``): the 'job killed' half of the full-restart baseline."""
    proc = procs.start(main_cmd(run_dir, overrides), log_path=log_path(run_dir))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the driver exited (code {proc.returncode}) before step "
                                   f"{stop_at_step}; see {log_path(run_dir)}")
            recs = read_jsonl(run_dir / "metrics.jsonl")
            if recs and max(r["step"] for r in recs) >= stop_at_step:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {stop_at_step} not reached in {timeout_s:.0f}s")
            time.sleep(0.2)
        killed_at = time.time()
        stop_s = procs.interrupt_then_kill(proc, grace_s=grace_s)
    finally:
        if proc.poll() is None:
            procs.kill_tree(proc)
    return {"killed_at": killed_at, "stop_s": stop_s, "exit_code": proc.returncode}
