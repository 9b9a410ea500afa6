"""The checkpoint directory on disk: which steps are committed; moving bad step directories aside.

Standard library only (no JAX, no Orbax), so the driver may use it too. Orbax's own view of a
step is too weak for restores: on a local or FUSE filesystem it counts every directory whose name
is a bare number as finalized, and its in-memory step list includes a save that has only
started. Here a step is *committed* when its directory ``<root>/<step>`` carries Orbax's commit
marker (``commit_success.txt``, written just before the final rename on POSIX and as the commit
itself on GCS) and a readable ``_CHECKPOINT_METADATA``.

Bad step directories are never deleted: ``move_aside`` renames them to ``<step>.corrupt-<n>``
(a name neither Orbax nor this module reads as a step), so the evidence stays for inspection and a
later save at the same step number finds the name free.
"""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.shared.files import atomic_write_text

COMMIT_MARKER = "commit_success.txt"
STEP_METADATA = "_CHECKPOINT_METADATA"
RUN_META = Path("meta") / "metadata"
CORRUPT_INFIX = ".corrupt-"
REASON_FILE = "MOVED_ASIDE_REASON.txt"


class StepState(enum.Enum):
    COMMITTED = "committed"
    """Commit marker and step metadata present: Orbax finished this save."""
    UNCOMMITTED = "uncommitted"
    """Written by Orbax (step metadata or items present) but never committed: a save that died."""
    DAMAGED = "damaged"
    """Commit marker present but Orbax's step metadata unreadable: written, then damaged."""
    FOREIGN = "foreign"
    """Neither Orbax's step metadata nor its commit marker: not a checkpoint this project wrote."""


@dataclass(frozen=True)
class StepDir:
    step: int
    path: Path
    state: StepState
    reason: str
    """Why the state is not COMMITTED ('' when it is)."""


def step_dirs(root: str | Path) -> list[Path]:
    """Directories under ``root`` named by a bare step number, ascending by step."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.name.isdigit() and p.is_dir()),
                  key=lambda p: int(p.name))


def inspect(path: Path) -> StepDir:
    """Classify one step directory by what is on disk (cheap: a few stats and one small read)."""
    step = int(path.name)
    has_marker = (path / COMMIT_MARKER).is_file()
    meta_file = path / STEP_METADATA
    meta_ok, meta_problem = False, f"{STEP_METADATA} is missing"
    if meta_file.is_file():
        try:
            json.loads(meta_file.read_text())
            meta_ok, meta_problem = True, ""
        except (OSError, ValueError) as exc:
            meta_problem = f"{STEP_METADATA} is unreadable ({type(exc).__name__}: {exc})"
    if has_marker and meta_ok:
        return StepDir(step, path, StepState.COMMITTED, "")
    if has_marker:
        return StepDir(step, path, StepState.DAMAGED, meta_problem)
    if meta_file.exists() or ((path / "state").exists() and (path / "meta").exists()):
        return StepDir(step, path, StepState.UNCOMMITTED,
                       f"no {COMMIT_MARKER}: the save never committed")
    return StepDir(step, path, StepState.FOREIGN,
                   f"neither {STEP_METADATA} nor {COMMIT_MARKER}: not written by Orbax")


def scan(root: str | Path) -> list[StepDir]:
    """Every numbered step directory under ``root`` with its state, ascending by step."""
    return [inspect(p) for p in step_dirs(root)]


def committed_steps(root: str | Path) -> list[int]:
    """Committed steps on disk, ascending (never a save in progress or one that died)."""
    return [d.step for d in scan(root) if d.state is StepState.COMMITTED]


def is_committed(root: str | Path, step: int) -> bool:
    path = Path(root) / str(step)
    return path.is_dir() and inspect(path).state is StepState.COMMITTED


def read_run_meta(step_path: Path) -> dict:
    """The project's run metadata of one step (JSON); raises ValueError when unreadable."""
    try:
        meta = json.loads((step_path / RUN_META).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{RUN_META} is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{RUN_META} is not a JSON object")
    return meta


OTHER_TASK_FIX = ("use a new run.run_dir, or set task.kind and task.settings (model.* for the "
                  "lm task) to the checkpoint's")


def task_fingerprint_of(meta: dict) -> str | None:
    """The task fingerprint a step's run metadata records (``model_fingerprint`` in
    checkpoints written before tasks: the ``lm`` task's, which it equals)."""
    return meta.get("task_fingerprint") or meta.get("model_fingerprint")


def task_of(meta: dict) -> dict | None:
    """The task a step's run metadata describes (``{"kind", "settings"}``), or None."""
    if isinstance(meta.get("task"), dict):
        return meta["task"]
    model = meta.get("model")
    return {"kind": "lm", "settings": model} if isinstance(model, dict) else None


def move_aside(path: Path, reason: str) -> Path:
    """Rename a bad step directory to ``<step>.corrupt-<n>`` (first free n); never deletes.

    Writes ``reason`` into the moved directory so an operator sees why. Returns the new path.
    """
    n = 1
    while (target := path.with_name(f"{path.name}{CORRUPT_INFIX}{n}")).exists():
        n += 1
    path.rename(target)
    with contextlib.suppress(OSError):  # the rename is what matters; the note is a courtesy
        atomic_write_text(target / REASON_FILE, reason + "\n")  # never through a link
    return target


def moved_aside(root: str | Path) -> list[Path]:
    """Step directories moved aside so far, by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if CORRUPT_INFIX in p.name)
