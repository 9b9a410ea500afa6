"""Orchestrated runs: ``python -m orchestrator.main`` in a child process, read from its run dir.

The driver owns its emulated Ray cluster (as ``make run`` does); the benchmark only starts it,
optionally interrupts it (the full-restart baseline), and reads ``summary.json``,
``metrics.jsonl`` and ``timeline.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bench import procs
from orchestrator.shared import files


@dataclass
class RunDir:
    """What one run directory says, parsed once."""

    path: Path
    summary: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    retries: int = 0
    ray_start_failed: bool = False
    """The last start failed inside Ray's own node start-up (an overloaded machine)."""

    @classmethod
    def read(cls, path: Path) -> RunDir:
        summary_path = path / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return cls(path=path, summary=summary, metrics=read_jsonl(path / "metrics.jsonl"),
                   timeline=read_jsonl(path / "timeline.jsonl"))


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines of a JSONL file (a torn last line of a live run is skipped)."""
    return list(files.read_jsonl(path))


def log_path(run_dir: Path) -> Path:
    """The driver's stdout/stderr, beside its run dir (appended across resubmissions)."""
    return run_dir.parent / f"{run_dir.name}.log"


def main_cmd(run_dir: Path, overrides: list[str], *, module: str = "orchestrator.main"
             ) -> list[str]:
    """The driver's command line; ``module``: a bench wrapper of it (``bench.ab_blocks``)."""
    return procs.python_cmd(module, "--log-format", "json", f"run.run_dir={run_dir}", *overrides)


STARTUP_FAILURE = "timed out during startup"
"""Ray's fixed 30 s raylet start bound, missed on an overloaded machine: not the run's fault."""


def _start_failed(log: Path, offset: int) -> bool:
    try:
        with log.open("rb") as f:
            f.seek(offset)
            return STARTUP_FAILURE.encode() in f.read()
    except OSError:
        return False


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def run_main(run_dir: Path, overrides: list[str], *, timeout_s: float,
             startup_retries: int = 2, module: str = "orchestrator.main") -> tuple[int, RunDir]:
    """Run the driver to the end; returns its exit code and its run dir (``RunDir.retries``
    counts starts retried because Ray itself failed to start)."""
    retries = 0
    while True:
        offset = _log_size(log_path(run_dir))
        proc = procs.start(main_cmd(run_dir, overrides, module=module),
                           log_path=log_path(run_dir))
        try:
            code = proc.wait(timeout=timeout_s)
        except Exception:
            procs.interrupt_then_kill(proc, grace_s=30)
            raise TimeoutError(f"orchestrator run in {run_dir} took over {timeout_s:.0f}s; "
                               f"stopped it. Log: {log_path(run_dir)}") from None
        finally:
            procs.reap_group(proc)
        if code != 0 and retries < startup_retries and _start_failed(log_path(run_dir), offset):
            retries += 1
            continue
        rd = RunDir.read(run_dir)
        rd.retries = retries
        rd.ray_start_failed = code != 0 and _start_failed(log_path(run_dir), offset)
        return code, rd
