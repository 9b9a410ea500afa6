"""Write an export: ``model.npz``, ``model.safetensors``, ``config.yaml`` and ``export.json``,
made in a temporary directory beside ``--to`` and renamed into place only when all are written, so
a failed export leaves nothing at ``--to``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.export.read import PARAMS, read
from orchestrator.export.select import ExportError, choose

NPZ = "model.npz"
SAFETENSORS = "model.safetensors"
CONFIG = "config.yaml"
MANIFEST = "export.json"
CONFIG_SECTIONS = ("model", "task")
"""The sections of the run's config.yaml an export carries: what builds the model again."""
META_KEYS = ("model", "task", "model_fingerprint", "task_fingerprint", "config_digest", "plan")
"""What ``export.json`` keeps of an Orbax step's own run metadata (``<step>/meta/metadata``)."""


def export_run(run_dir: str | Path, to: str | Path, *, step: int | None = None,
               with_opt_state: bool = False) -> dict[str, Any]:
    """Export ``step`` (default: the newest complete one) of ``run_dir`` to the new directory
    ``to``; returns what ``export.json`` says. ``ExportError`` (nothing written) on bad input."""
    run_dir, to = Path(run_dir).absolute(), Path(to).absolute()
    _check_target(to)
    source = choose(run_dir, step)
    config = _run_config(run_dir)
    arrays, meta = read(source, run_dir, with_opt_state=with_opt_state)
    _check_dtypes(arrays)
    sections, config_from = _sections(config, meta)
    manifest = {
        "step": source.step, "tier": source.tier, "source": str(source.path),
        "run_dir": str(run_dir), "with_opt_state": with_opt_state,
        "arrays": {k: {"shape": list(a.shape), "dtype": a.dtype.name} for k, a in arrays.items()},
        "parameters": int(sum(a.size for k, a in arrays.items() if k.startswith(PARAMS + "/"))),
        "bytes": int(sum(a.nbytes for a in arrays.values())),
        "digest": digest(arrays), "config_from": config_from,
        "checkpoint_meta": {k: meta[k] for k in META_KEYS if k in meta},
        "exported_at": time.time(),
    }
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{to.name}.tmp-", dir=to.parent))
    except OSError as exc:
        raise _write_failed(to, exc) from None
    try:
        manifest["files"] = _write_files(tmp, arrays, sections, manifest)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(tmp, to)  # to is absent or an empty directory (checked above)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _write_failed(to, exc) from None
        raise
    return manifest


def digest(arrays: Mapping[str, Any]) -> str:
    """sha256 over every array's name, dtype, shape and bytes in name order: the same for the
    npz and the safetensors file of one export, and for two exports of the same step."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(memoryview(a).cast("B") if a.flags.c_contiguous else a.tobytes())
    return "sha256:" + h.hexdigest()


def _write_files(tmp: Path, arrays: dict[str, Any], sections: dict, manifest: dict
                 ) -> dict[str, str]:
    import numpy as np
    from safetensors.numpy import save_file

    np.savez(tmp / NPZ, **arrays)
    # np.ascontiguousarray would make a 0-d array (an optimizer's step count) 1-d
    save_file({k: np.require(a, requirements="C") for k, a in arrays.items()},
              str(tmp / SAFETENSORS),
              metadata={"step": str(manifest["step"]), "tier": manifest["tier"],
                        "digest": manifest["digest"], "source": manifest["source"]})
    (tmp / CONFIG).write_text(yaml.safe_dump(sections, sort_keys=False))
    return {name: "sha256:" + _file_sha256(tmp / name) for name in (NPZ, SAFETENSORS, CONFIG)}


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_target(to: Path) -> None:
    if to.is_symlink() or to.is_file() or (to.is_dir() and any(to.iterdir())):
        raise ExportError(f"--to {to} exists and is not an empty directory.",
                          fix="pass a new directory to --to (an export never overwrites one)")


def _run_config(run_dir: Path) -> dict | None:
    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ExportError(f"{path} cannot be read ({type(exc).__name__}: {exc}).",
                          fix="restore the run's config.yaml (the driver writes it at each "
                              "start)") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} is not a YAML mapping.",
                          fix="restore the run's config.yaml (the driver writes it at each start)")
    return data


def _sections(config: dict | None, meta: dict) -> tuple[dict, str]:
    """The config an export carries, and where it came from. The step's own metadata wins for a
    section it records differently from config.yaml (a config.yaml rewritten by a later start
    with another model would not describe these arrays)."""
    sections = {k: config[k] for k in CONFIG_SECTIONS if config and config.get(k) is not None}
    source = "config.yaml" if config is not None else "none"
    for key in CONFIG_SECTIONS:
        if isinstance(meta.get(key), dict) and meta[key] != sections.get(key):
            sections[key], source = meta[key], "checkpoint"
    return sections, source


def _check_dtypes(arrays: Mapping[str, Any]) -> None:
    odd = {k: str(a.dtype) for k, a in arrays.items()
           if a.dtype.isbuiltin != 1 or a.dtype.kind in "OSUV"}
    if odd:
        name, dtype = next(iter(odd.items()))
        raise ExportError(f"{len(odd)} array(s) have a dtype npz and safetensors' numpy API "
                          f"cannot store faithfully (e.g. {name}: {dtype}).",
                          fix="keep parameters in a numpy dtype (Flax's param_dtype defaults "
                              "to float32; model.dtype only sets the compute dtype)")


def _write_failed(to: Path, exc: OSError) -> ExportError:
    return ExportError(f"Could not write the export to {to} ({type(exc).__name__}: {exc}).",
                       fix="free space or pick a writable --to; nothing was written there")
