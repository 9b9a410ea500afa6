"""Before any host starts: is the task sound, and do the run directory's checkpoints belong to
it? Bad input either way: a ``ConfigError`` / ``CheckpointError`` naming the fix (exit 2), with
nothing started and nothing written.

The check also works out the train state's memory per device and per host over the mesh the
run will have (``workers/training/memory.py``, from the same abstract shapes) and fits it into the
bounds of ``memory_bound.bounds_for``: the driver prints one line with the figures, and a
state that does not fit is ``DoesNotFit`` (exit 2) naming the numbers and the fix.

The task is checked in a subprocess (``python -m workers.task.check``, JAX on the CPU only,
abstract shapes only): the driver process never imports JAX or the user's module (CONTRACTS:
``orchestrator/`` never imports JAX). The subprocess starts where the driver started (its working
directory and ``PYTHONPATH``), as the hosts' processes do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from orchestrator.driver.memory_bound import MemoryBounds, bounds_for, memory_line
from orchestrator.driver.worker_output import must_show, report
from orchestrator.shared import configtools
from orchestrator.shared.errors import CheckpointError, ConfigError, DoesNotFit, TaskCodeError
from orchestrator.shared.task import task_ref
from orchestrator.shared.worker_log import parse

log = structlog.get_logger(__name__)

MARKER = "TASK_CHECK "
"""The check's answer line (``workers/task/check.py``)."""
NOTE_MARKER = "TASK_NOTE "
NOTES_ENV = "TPU_ORCH_TASK_NOTES"
"""The check's notes, one a line (``workers/task/state.py``: ``NOTE_MARKER``, ``NOTES_ENV``):
what the orchestrator chose for the task, printed once by the driver."""
MIN_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class TaskSummary:
    """What the check found: the task as hosts will build it."""

    fingerprint: str
    task: dict
    """``{"kind", "settings"}``, the settings with their defaults filled in."""
    n_params: int
    state_bytes: int
    flops_per_step: float | None
    tokens_per_step: int
    metrics: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """What the check chose for the task (e.g. parameters without axis names replicated)."""
    memory: dict | None = None
    """The memory estimate (``workers/task/check.py: _memory``); None from an older check."""
    bounds: MemoryBounds | None = None
    warnings: tuple[dict, ...] = ()
    """The task's own warnings while it was checked (marked log records, ``must_show``)."""


def check_task(cfg: Any, run_dir: Path, *, timeout_s: float | None = None,
               show: Callable[[dict, str], None] | None = None) -> TaskSummary:
    """The task check, the memory estimate (printed; ``DoesNotFit`` when the state cannot
    fit), then the checkpoint check (``check_checkpoint``). ``show``: where the task's
    warnings go (the driver's ``WorkerOutput.show``, which then shows each once, however many
    hosts say it again); by default straight to the log."""
    summary = run_check(cfg, timeout_s=timeout_s, resuming=has_committed_step(
        Path(run_dir) / "checkpoints"))
    for record in summary.warnings:
        (show or report)(record, "task check")
    log.info("task_checked", kind=summary.task["kind"], fingerprint=summary.fingerprint,
             n_params=summary.n_params, state_bytes=summary.state_bytes)
    for note in summary.notes:
        print(note, flush=True)
        log.info("task_note", note=note)
    report_memory(summary)
    check_checkpoint(Path(run_dir) / "checkpoints", summary)
    return summary


def report_memory(summary: TaskSummary) -> None:
    """Print the estimate's line and log it as one record; raise ``DoesNotFit`` when refused."""
    mem = summary.memory
    if mem is None:
        return
    print(memory_line(mem, summary.bounds), flush=True)
    b = summary.bounds
    refused = mem.get("refused")
    fields = {k: mem.get(k) for k in ("mesh", "devices_per_host", "hosts", "device",
                                      "device_total", "ram_tier", "host_total", "state_bytes")}
    log.info("memory_estimate", **fields,
             device_bound_bytes=b.device_bytes if b else None,
             host_bound_bytes=b.host_bytes if b else None,
             bound_source=b.source if b else None,
             fits=None if mem.get("device") is None else not refused,
             refused=refused["component"] if refused else None)
    if refused:
        raise DoesNotFit(component=refused["component"], need=refused["need"],
                         have=refused["have"],
                         message=f"{refused['message']} Bound: {b.source if b else 'given'}.",
                         fix=refused["fix"])


def request_for(cfg: Any, bounds: MemoryBounds | None = None) -> dict:
    """The check's input: the task, train config, run length, the mesh axes known now and
    what the memory estimate fits into."""
    mesh = mesh_sizes(cfg)
    return {"task": dataclasses.asdict(task_ref(cfg)), "train": configtools.to_dict(cfg.train),
            "total_steps": cfg.run.total_steps, "seed": cfg.run.seed,
            "eval": eval_request(cfg), "mesh": mesh,
            "memory": bounds.request(cfg, mesh) if bounds is not None else None}


def eval_request(cfg: Any) -> dict:
    """``eval.*`` for the check: with ``every`` on, the task's held-out split and its eval are
    checked too (``workers/task/check.py: _check_eval``)."""
    return configtools.to_dict(cfg.eval)


def mesh_sizes(cfg: Any) -> dict[str, int]:
    """Mesh axis sizes the driver knows before seeing the cluster: all of them for the emulated
    cluster; on TPU the axes the config fixes (a -1 axis is sized by the slices found)."""
    if cfg.cluster.mode != "tpu":
        em = cfg.cluster.emulate
        shape = cfg.validate_for(slices=em.slices, hosts_per_slice=em.hosts_per_slice,
                                 devices_per_host=em.devices_per_host).shape
        return dict(zip(("data", "fsdp", "tensor"), shape, strict=True))
    ici, dcn = cfg.mesh.ici, cfg.mesh.dcn
    out = {"tensor": ici.tensor} if ici.tensor > 0 else {}
    for axis in ("data", "fsdp"):
        a, b = getattr(ici, axis), getattr(dcn, axis)
        if a > 0 and b > 0:
            out[axis] = a * b
    return out


def has_committed_step(ckpt: Path) -> bool:
    """The run resumes a committed step: the task's ``init_from`` is not read, nor checked."""
    from orchestrator.shared import layout as ckpt_layout  # standard library only

    return ckpt.is_dir() and bool(ckpt_layout.committed_steps(ckpt))


def run_check(cfg: Any, *, timeout_s: float | None = None,
              resuming: bool = False) -> TaskSummary:
    bound = timeout_s or max(MIN_TIMEOUT_S, cfg.timeouts.compile_s)
    memory = bounds_for(cfg)
    out = ask({**request_for(cfg, memory), "resuming": resuming}, bound=bound,
              kind=cfg.task.kind)
    if not out["ok"]:  # the warnings may say why
        for record in out.get("warnings", ()):
            report(record, "task check")
    if not out["ok"] and out.get("part"):
        raise TaskCodeError(out["part"], out["problem"], out["fix"])
    if not out["ok"]:
        raise ConfigError(out["setting"], out["problem"], out["fix"])
    return TaskSummary(fingerprint=out["fingerprint"], task=out["task"],
                       n_params=out["n_params"], state_bytes=out["state_bytes"],
                       flops_per_step=out["flops_per_step"],
                       tokens_per_step=out["tokens_per_step"], metrics=tuple(out["metrics"]),
                       notes=tuple(out.get("notes", ())), memory=out.get("memory"),
                       bounds=memory, warnings=tuple(out.get("warnings", ())))


def ask(request: dict, *, bound: float, kind: str) -> dict:
    """The check's answer (``workers/task/check.py: answer``) from its subprocess: the seam
    tests replace to run the check in their own process."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", NOTES_ENV: "1"}
    env.pop("XLA_FLAGS", None)  # the driver's flags are not the hosts'; none are needed here
    try:
        done = subprocess.run([sys.executable, "-m", "workers.task.check"],
                              input=json.dumps(request), capture_output=True,
                              text=True, env=env, timeout=bound, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError("task.kind", f"checking the task {kind!r} took longer than "
                          f"{bound:.0f} s (importing it, building it, tracing its init and "
                          "step)", "look for slow work at import or in the factory, or raise "
                          "timeouts.compile_s") from None
    answer = next((line[len(MARKER):] for line in reversed(done.stdout.splitlines())
                   if line.startswith(MARKER)), None)
    if answer is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        raise ConfigError("task.kind", f"the task check of {kind!r} ended (exit "
                          f"{done.returncode}) without an answer: {' | '.join(tail)}",
                          "fix what the output names (a crash while importing the task "
                          "module or building the task)")
    out = json.loads(answer)
    notes = [line[len(NOTE_MARKER):] for line in done.stdout.splitlines()
             if line.startswith(NOTE_MARKER)]
    return {**out, "notes": list(dict.fromkeys(notes)),
            "warnings": check_warnings(done.stderr or "")}


def check_warnings(stderr: str) -> list[dict]:
    """The task's own warnings while it was checked (its module's import, its factory, its
    data): the marked lines of the check's stderr a user must see, each once."""
    out: dict[tuple[str, str], dict] = {}
    for record in filter(None, map(parse, stderr.splitlines())):
        if must_show(record):
            out.setdefault((str(record.get("logger")), record["message"]), record)
    return list(out.values())


def check_checkpoint(ckpt: Path, summary: TaskSummary) -> None:
    """Refuse, before touching anything, a checkpoint directory another task wrote.

    The newest committed step with readable run metadata decides. A newer step whose metadata
    is damaged is left to the restore, which falls back past it (and says so); only when no
    committed step is readable is the directory refused as not ours.
    """
    from orchestrator.shared import layout as ckpt_layout  # standard library only

    steps = sorted(ckpt_layout.committed_steps(ckpt), reverse=True) if ckpt.is_dir() else []
    unreadable: list[tuple[int, ValueError]] = []
    for step in steps:
        try:
            meta = ckpt_layout.read_run_meta(ckpt / str(step))
        except ValueError as exc:
            unreadable.append((step, exc))
            continue
        if ckpt_layout.task_fingerprint_of(meta) != summary.fingerprint:
            raise CheckpointError(
                f"Checkpoint step {step} in {ckpt} was written by another task "
                f"({json.dumps(ckpt_layout.task_of(meta))}); this run's task is "
                f"{json.dumps(summary.task)}.", fix=ckpt_layout.OTHER_TASK_FIX)
        if unreadable:
            log.warning("checkpoint_metadata_unreadable",
                        steps=[u[0] for u in unreadable], restore_falls_back_to=step)
        return
    if unreadable:
        step, exc = unreadable[0]
        raise CheckpointError(
            f"Checkpoint step {step} in {ckpt} has no readable run metadata ({exc}).",
            fix="point run.run_dir at a directory written by tpu-orchestrator, or a new one")
