"""Which step an export reads: the complete steps of both durable tiers of a run directory.

No JAX or Orbax (``workers.ram.copy_store`` imports Orbax only to read). A step is complete in the
Orbax tier when ``orchestrator.shared.layout`` calls it committed (``RUN_DIR/checkpoints/<step>``:
commit marker and readable step metadata), and in the tier the RAM holders write
(``RUN_DIR/checkpoints-from-ram/<step>``) when every source is there (``COMPLETE``,
``workers.ram.copy_store``). With no ``--step`` the newest complete step of either tier is taken; a
step complete in both is read from Orbax (it needs no run secret). A step reached through a
symbolic link (the step, its tier's directory, or anything inside it) is refused: an export reads
what the run wrote, never what a writer of the runs directory points it at (issue 49).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.layout import StepState
from workers.ram import copy_store

ORBAX = "orbax"
COPY = "copy"
"""Tier names, as in ``export.json`` and ``Restored.tier`` ("copy": saved from the RAM copies)."""


class ExportError(OrchestratorError):
    """The export cannot be made from this input; nothing was written to ``--to``."""


@dataclass(frozen=True)
class Source:
    step: int
    tier: str
    path: Path
    """The step's directory."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def copies_dir(run_dir: Path) -> Path:
    return copy_store.copies_dir(checkpoint_dir(run_dir))


def complete(run_dir: Path) -> dict[str, list[int]]:
    """Complete steps per tier, ascending."""
    return {ORBAX: ckpt_layout.committed_steps(checkpoint_dir(run_dir)),
            COPY: copy_store.complete_steps(copies_dir(run_dir))}


def choose(run_dir: Path, step: int | None = None) -> Source:
    """The step to export: ``step``, or the newest complete one; ``ExportError`` naming the fix
    when there is none or ``step`` is not complete."""
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a directory.",
                          fix="pass the run's directory (its run.run_dir, the folder holding "
                              "config.yaml and checkpoints/)")
    steps = complete(run_dir)
    listed = listing(run_dir)
    if step is None:
        newest = max((s for tier in steps.values() for s in tier), default=None)
        if newest is None:
            raise ExportError(
                f"{run_dir} has no complete checkpoint step: no committed Orbax step in "
                f"checkpoints/ and no complete RAM-tier step in {copies_dir(run_dir).name}/"
                f"{_why_not(run_dir)}.",
                fix="export after the run's first save has committed (a run saves every "
                    "controller.checkpoint_interval and when it drains), or point at the right "
                    "run directory")
        step = newest
    tier = ORBAX if step in steps[ORBAX] else COPY if step in steps[COPY] else None
    if tier is None:
        raise ExportError(f"Step {step} is not complete in {run_dir}{_step_state(run_dir, step)}; "
                          f"complete steps: {listed}.",
                          fix="pass --step with one of the complete steps, or leave --step "
                              "out to export the newest")
    root = checkpoint_dir(run_dir) if tier == ORBAX else copies_dir(run_dir)
    source = Source(step=step, tier=tier, path=root / str(step))
    if (link := first_link(run_dir, source.path)) is not None:
        raise ExportError(f"Step {step} of {run_dir} is reached through the symbolic link {link} "
                          f"(to {os.readlink(link)}): an export reads only what the run wrote.",
                          fix=f"remove the link (`rm {link}`), or export the run that wrote that "
                              "step from its own directory")
    return source


def first_link(run_dir: Path, path: Path) -> Path | None:
    """The first symbolic link on the way from ``run_dir`` down to ``path`` or anywhere below
    it (never followed), or None."""
    run_dir, path = run_dir.absolute(), path.absolute()
    at = run_dir
    for part in path.relative_to(run_dir).parts:
        at = at / part
        if at.is_symlink():
            return at
    for top, dirs, files in os.walk(path):  # links to folders are listed, not entered
        for name in sorted(dirs + files):
            if (p := Path(top) / name).is_symlink():
                return p
    return None


def listing(run_dir: Path) -> str:
    """``orbax 1, 2, 3; copy 4``: the complete steps per tier, for messages."""
    parts = [f"{tier} {', '.join(map(str, found))}"
             for tier, found in complete(run_dir).items() if found]
    return "; ".join(parts) or "none"


def _why_not(run_dir: Path) -> str:
    bad = [d for d in ckpt_layout.scan(checkpoint_dir(run_dir))
           if d.state is not StepState.COMMITTED]
    if not bad:
        return ""
    return " (" + "; ".join(f"step {d.step}: {d.reason}" for d in bad[-3:]) + ")"


def _step_state(run_dir: Path, step: int) -> str:
    orbax = checkpoint_dir(run_dir) / str(step)
    copy = copies_dir(run_dir) / str(step)
    if orbax.is_dir():
        return f" (Orbax step directory: {ckpt_layout.inspect(orbax).reason})"
    if copy.is_dir():
        return (f" (RAM-tier step directory without {copy_store.COMPLETE}: a source never "
                "arrived)")
    return " (no such step directory in either tier)"
