"""Write an export: ``model.npz``, ``model.safetensors``, ``config.yaml``, ``export.json`` and
the data's tokenizer (when the task's data was prepared with one), made in a temporary directory
beside ``--to`` and renamed into place only when all are written, so a failed export leaves
nothing at ``--to``.

``config.yaml`` describes the exported model: ``task`` (its kind and its settings as the run ran
them, defaults filled in), the ``train`` section and ``run.seed``/``run.total_steps`` its
factory was called with, and for the built-in ``lm`` the same settings as ``model`` (where tools
before tasks looked). ``orchestrator.export.rebuild`` builds the model from it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.export.read import PARAMS, read
from orchestrator.export.select import ExportError, choose

NPZ = "model.npz"
SAFETENSORS = "model.safetensors"
CONFIG = "config.yaml"
MANIFEST = "export.json"
RUN_KEYS = ("seed", "total_steps")
"""What the exported config keeps of ``run``: the task factory's ``TaskContext`` besides
``train``."""
CONFIG_HEADER = ("# The exported model: task.kind built with task.settings (as the run ran them),\n"
                 "# called with this train section and run.seed/run.total_steps. Rebuild it:\n"
                 "# orchestrator.export.rebuild(EXPORT_DIR) -> (the task, its parameters)\n")
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
    tokenizer, tokenizer_info = _tokenizer(sections.get("task"))
    manifest = {
        "step": source.step, "tier": source.tier, "source": str(source.path),
        "run_dir": str(run_dir), "with_opt_state": with_opt_state,
        "arrays": {k: {"shape": list(a.shape), "dtype": a.dtype.name} for k, a in arrays.items()},
        "parameters": int(sum(a.size for k, a in arrays.items() if k.startswith(PARAMS + "/"))),
        "bytes": int(sum(a.nbytes for a in arrays.values())),
        "digest": digest(arrays), "config_from": config_from, **tokenizer_info,
        "checkpoint_meta": {k: meta[k] for k in META_KEYS if k in meta},
        "exported_at": time.time(),
    }
    with staged(to) as tmp:
        manifest["files"] = _write_files(tmp, arrays, sections, manifest)
        if tokenizer is not None:
            name = manifest["tokenizer"]["file"]
            (tmp / name).write_bytes(tokenizer)
            manifest["files"][name] = "sha256:" + hashlib.sha256(tokenizer).hexdigest()
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@contextlib.contextmanager
def staged(to: Path) -> Iterator[Path]:
    """A new directory beside ``to`` to write the export in, renamed to ``to`` (absent or an
    empty directory, checked before) when the block ends well and removed when it does not: a
    failed export leaves nothing at ``to``."""
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{to.name}.tmp-", dir=to.parent))
    except OSError as exc:
        raise _write_failed(to, exc) from None
    try:
        yield tmp
        os.rename(tmp, to)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _write_failed(to, exc) from None
        raise


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
    (tmp / CONFIG).write_text(CONFIG_HEADER + yaml.safe_dump(sections, sort_keys=False))
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
    """The config an export carries (module docstring), and where its task came from. The step's
    own metadata wins over config.yaml (a config.yaml rewritten by a later start with another
    model would not describe these arrays); a custom task gets no ``model`` section (the
    built-in lm's defaults there described another model, issue 53)."""
    from orchestrator.shared.layout import task_of

    task, source = task_of(meta), "checkpoint"
    if task is None and config is not None:
        task, source = _task_of_config(config), "config.yaml"
    sections: dict = {}
    if task is not None:
        sections["task"] = {"kind": task["kind"], "settings": task.get("settings") or {}}
        if task["kind"] == "lm":
            sections["model"] = sections["task"]["settings"]
    if config and isinstance(config.get("train"), dict):
        sections["train"] = config["train"]
    if config and isinstance(config.get("run"), dict):
        sections["run"] = {k: config["run"][k] for k in RUN_KEYS if k in config["run"]}
    return sections, source if task is not None else "none"


def _task_of_config(config: dict) -> dict | None:
    """``{"kind", "settings"}`` of a run's config.yaml: the lm task's settings are its
    ``model`` section, another task's its ``task.settings`` (or inline keys)."""
    task = config.get("task") if isinstance(config.get("task"), dict) else {}
    kind = task.get("kind", "lm")
    if kind == "lm":
        model = config.get("model")
        return {"kind": "lm", "settings": model if isinstance(model, dict) else
                task.get("settings") or {}}
    settings = dict(task.get("settings") or {})
    settings.update({k: v for k, v in task.items() if k not in ("kind", "settings")})
    return {"kind": kind, "settings": settings}


def _tokenizer(task: dict | None) -> tuple[bytes | None, dict]:
    """The tokenizer file the task's prepared data names (its manifest's ``tokenizer``), to copy
    beside the weights: (its bytes, what ``export.json`` says). A tokenizer that cannot be read
    now (the data moved, or changed since it was prepared) is said, never an export's failure."""
    dirs = _data_dirs(task.get("settings") if task else None, "task")
    if not dirs:
        return None, {"tokenizer": None}
    from orchestrator.data import fs as fslib
    from orchestrator.data import manifest as datamanifest
    from orchestrator.shared.errors import OrchestratorError

    setting, data_dir = dirs[0]
    try:
        m = datamanifest.load(data_dir, setting=setting)
        fs, path = fslib.filesystem(fslib.join(data_dir, m.tokenizer.file), setting=setting)
        data = fs.cat_file(path)
    except OrchestratorError as exc:
        return None, {"tokenizer": None, "tokenizer_missing": exc.message}
    except Exception as exc:  # a filesystem's own error (a bucket without its client, ...)
        return None, {"tokenizer": None, "tokenizer_missing":
                      f"{setting}={data_dir}: {type(exc).__name__}: {exc}"}
    if hashlib.sha256(data).hexdigest() != m.tokenizer.sha256:
        return None, {"tokenizer": None, "tokenizer_missing":
                      f"{setting}={data_dir}: {m.tokenizer.file} differs from the one its "
                      "manifest names (changed since prepare)"}
    info = {"file": _safe_name(m.tokenizer.file), "name": m.tokenizer.name,
            "sha256": m.tokenizer.sha256, "vocab_size": m.tokenizer.vocab_size,
            "eos_id": m.tokenizer.eos_id, "from": path}
    return data, {"tokenizer": info}


def _data_dirs(settings: Any, prefix: str) -> list[tuple[str, str]]:
    """``(setting, dir)`` of every prepared-data setting (a mapping with a ``dir``, the shape of
    ``DataSettings``) in the task's settings, depth first."""
    if not isinstance(settings, dict):
        return []
    if isinstance(settings.get("dir"), str) and settings["dir"]:
        return [(f"{prefix}.dir", settings["dir"])]
    return [found for key, value in settings.items()
            for found in _data_dirs(value, f"{prefix}.{key}")]


def _safe_name(name: str) -> str:
    """The file's own name, kept off the export's fixed names."""
    base = Path(name.replace("\\", "/")).name or "tokenizer.json"
    return base if base not in (NPZ, SAFETENSORS, CONFIG, MANIFEST) else "tokenizer-" + base


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
