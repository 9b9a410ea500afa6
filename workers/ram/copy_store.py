"""The durable tier written from the RAM copies: each source's copy saved with Orbax by the holder
on its node, off the training processes.

Layout: ``<dir>/<step>/source-<i>/`` (one Orbax checkpoint per source: the copy's bytes and its
layout, step, incarnation and MAC, ``workers.ram.auth``: the restoring host checks it, so a copy
changed on disk is refused like one changed in RAM) and ``<dir>/<step>/COMPLETE`` once every
source of the step is there. Orbax renames each source directory into place only when it is
fully written, so a listed source is whole; ``COMPLETE`` is written (tmp + rename) by whichever
holder finishes the last source. A step without it is never restored. The copies are
mesh-independent (``workers.ram.replica``): a step saved on one mesh restores into any other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.shared.files import atomic_write_json

COMPLETE = "COMPLETE"


def copies_dir(checkpoint_dir: str | Path) -> Path:
    """Beside the Orbax directory (never inside it: Orbax would see a foreign step there)."""
    return Path(f"{Path(checkpoint_dir).absolute()}-from-ram")


def _checkpointer() -> Any:
    from workers.training.orbax_import import ocp

    return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def write(directory: str | Path, *, step: int, source: int, sources: int, incarnation: int,
          layout: dict, data: bytes | bytearray, mac: str) -> bool:
    """Save one source's copy of ``step``; returns True if this completed the step."""
    from workers.training.orbax_import import ocp

    step_dir = Path(directory) / str(step)
    path = step_dir / f"source-{source}"
    if not path.exists():
        step_dir.mkdir(parents=True, exist_ok=True)
        meta = {"step": step, "source": source, "sources": sources, "incarnation": incarnation,
                "mac": mac, "nbytes": len(data), "layout": layout}
        # Orbax refuses zero-size arrays: a source that holds no distinct shard saves one byte
        body = np.frombuffer(data, np.uint8) if data else np.zeros(1, np.uint8)
        _checkpointer().save(path, args=ocp.args.Composite(
            data=ocp.args.StandardSave({"bytes": body}),
            meta=ocp.args.JsonSave(meta)))
    return _complete_if_whole(step_dir, sources)


def _complete_if_whole(step_dir: Path, sources: int) -> bool:
    if (step_dir / COMPLETE).exists():
        return False
    if not all((step_dir / f"source-{i}").is_dir() for i in range(sources)):
        return False
    atomic_write_json(step_dir / COMPLETE, {"sources": sources})
    return True


def complete_steps(directory: str | Path) -> list[int]:
    """Steps with every source saved, ascending."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir()
                  if p.name.isdigit() and (p / COMPLETE).is_file())


def sources_of(directory: str | Path, step: int) -> int:
    return int(json.loads((Path(directory) / str(step) / COMPLETE).read_text())["sources"])


def read(directory: str | Path, *, step: int, source: int) -> dict:
    """One source's copy as ``RamHolder.get`` returns it (description, layout, data, mac), not
    yet authenticated: ``ram_auth.verify_copy`` before use."""
    from workers.training.orbax_import import ocp

    path = Path(directory) / str(step) / f"source-{source}"
    out = _checkpointer().restore(path, args=ocp.args.Composite(
        data=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    meta = out["meta"]
    if int(meta["step"]) != step or int(meta["source"]) != source:
        raise ValueError(f"{path} holds step {meta['step']} source {meta['source']}")
    data = np.asarray(out["data"]["bytes"]).tobytes()[: int(meta["nbytes"])]
    return {"incarnation": meta["incarnation"], "step": meta["step"], "source": meta["source"],
            "sources": meta["sources"], "layout": meta["layout"], "data": data,
            "mac": meta.get("mac")}


def prune(directory: str | Path, keep: int) -> list[int]:
    """Delete complete steps beyond the newest ``keep`` and incomplete ones older than the
    newest complete step; returns the steps deleted. Only folders this module wrote are
    deleted (``_ours``): a numeric folder of anything else (an Orbax step, say) stays."""
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest complete step stays")
    done = complete_steps(directory)
    if not done:
        return []
    newest = done[-1]
    gone = set(done[:-keep])
    root = Path(directory)
    gone |= {int(p.name) for p in root.iterdir() if p.name.isdigit() and int(p.name) < newest
             and not (p / COMPLETE).is_file()}
    deleted = []
    for step in sorted(gone):
        if _ours(root / str(step)):
            shutil.rmtree(root / str(step), ignore_errors=True)
            deleted.append(step)
    return deleted


def _ours(step_dir: Path) -> bool:
    """A step folder holding only what ``write`` makes: ``source-<i>`` (and Orbax's temporary
    ``source-<i>.orbax-checkpoint-tmp-*``), ``COMPLETE`` and its temporary file."""
    if step_dir.is_symlink() or not step_dir.is_dir():
        return False
    try:
        names = [p.name for p in step_dir.iterdir()]
    except OSError:
        return False
    return all(n == COMPLETE or n.startswith(f".{COMPLETE}.")
               or (n.startswith("source-") and n[7:].split(".", 1)[0].isdigit())
               for n in names)
