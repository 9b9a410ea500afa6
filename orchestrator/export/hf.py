"""``--format hf``: a ``llama`` run's parameters as a Hugging Face ``LlamaForCausalLM`` directory.

Writes ``config.json`` (``workers.models.hf_llama.config_to_hf``: the run's model, in the
spellings transformers 4.x and 5.x read), the weights under Hugging Face's names and layouts in
``model.safetensors`` or, above ``shard_bytes``, in ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, as ``float32`` (lossless from a float32 run) or ``bfloat16``
(round to nearest even), the data's tokenizer file when the task's prepared data names one, and
``export.json`` (step, tier, source, dtype, files). Made in a temporary directory beside
``--to`` and renamed into place when complete, as the native export is; a run whose task is
not ``llama`` is refused before anything is read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.export.read import PARAMS, read
from orchestrator.export.select import ExportError, choose
from orchestrator.export.write import (
    MANIFEST,
    _check_target,
    _file_sha256,
    _run_config,
    _sections,
    _tokenizer,
    staged,
)
from orchestrator.shared import layout as ckpt_layout

DTYPES = {"f32": "float32", "bf16": "bfloat16"}
DEFAULT_SHARD_BYTES = 5 * 10**9
"""transformers' 4.x ``save_pretrained`` default (``max_shard_size="5GB"``)."""


def export_hf(run_dir: str | Path, to: str | Path, *, step: int | None = None,
              dtype: str = "f32", shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict[str, Any]:
    """Export ``step`` (default: the newest complete) of the ``llama`` run ``run_dir`` to the
    new directory ``to`` as a Hugging Face model; returns what ``export.json`` says."""
    from workers.models import hf_llama

    run_dir, to = Path(run_dir).absolute(), Path(to).absolute()
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype} is not one this export writes.",
                          fix=f"pass --dtype {' or '.join(DTYPES)}")
    if shard_bytes < 1:
        raise ExportError(f"--shard-size {shard_bytes} is not a size.",
                          fix="pass a positive size such as 5GB or 500MB")
    _check_target(to)
    source = choose(run_dir, step)
    config = _run_config(run_dir)
    sections, _ = _sections(config, _step_meta(source))
    cfg = _llama_config(sections.get("task"), run_dir)
    arrays, _ = read(source, run_dir, with_opt_state=False)
    params = _nested(arrays)
    _check_fits(params, cfg, hf_llama, source)
    np_dtype = hf_llama.NP_DTYPES[DTYPES[dtype]]
    shards = _shards([(t.hf, t.hf_shape) for t in hf_llama.tensors(cfg)],
                     np_dtype.itemsize, shard_bytes)
    tokenizer, tokenizer_info = _tokenizer(sections.get("task"))
    extra = {"eos_token_id": tokenizer_info["tokenizer"]["eos_id"]} if tokenizer else {}
    manifest = {"format": "hf", "step": source.step, "tier": source.tier,
                "source": str(source.path), "run_dir": str(run_dir), "dtype": DTYPES[dtype],
                "task": sections["task"], "parameters": int(sum(
                    a.size for k, a in arrays.items() if k.startswith(PARAMS + "/"))),
                **tokenizer_info, "exported_at": time.time()}
    with staged(to) as tmp:
        files = _write_weights(tmp, shards, hf_llama.hf_tensors(params, cfg, np_dtype),
                               np_dtype, source.step)
        (tmp / hf_llama.CONFIG).write_text(json.dumps(
            hf_llama.config_to_hf(cfg, dtype=DTYPES[dtype], **extra), indent=2) + "\n")
        files.append(hf_llama.CONFIG)
        if tokenizer is not None:
            (tmp / tokenizer_info["tokenizer"]["file"]).write_bytes(tokenizer)
            files.append(tokenizer_info["tokenizer"]["file"])
        manifest["files"] = {f: "sha256:" + _file_sha256(tmp / f) for f in files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _step_meta(source: Any) -> dict:
    """The step's own run metadata (Orbax steps carry it; RAM-tier steps do not)."""
    try:
        return ckpt_layout.read_run_meta(source.path) if source.tier == "orbax" else {}
    except ValueError:
        return {}


def _llama_config(task: dict | None, run_dir: Path) -> Any:
    from orchestrator.shared.errors import OrchestratorError
    from workers.models import hf_llama

    kind = task["kind"] if task else None
    if kind != "llama":
        raise ExportError(
            f"{run_dir} ran task.kind {kind!r}; --format hf writes Hugging Face Llama "
            "checkpoints, so it takes only runs of task.kind llama.",
            fix="export this run without --format hf (the native format: model.safetensors "
                "under the tree's own names, config.yaml, rebuild())")
    try:
        return hf_llama.config_of_task(task.get("settings") or {})
    except OrchestratorError as exc:
        raise ExportError(f"The run's llama settings do not build a model: {exc.message}",
                          fix=exc.fix) from None


def _nested(arrays: dict[str, Any]) -> dict[str, Any]:
    """``params/a/b`` -> ``{"a": {"b": ...}}``."""
    tree: dict[str, Any] = {}
    for name, arr in arrays.items():
        *parents, leaf = name.split("/")[1:]
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = arr
    return tree


def _check_fits(params: dict, cfg: Any, hf_llama: Any, source: Any) -> None:
    """Every tensor the config's model has is in the step with its shape, before a byte is
    written (a run directory whose config.yaml describes another model than its steps)."""
    for t in hf_llama.tensors(cfg):
        try:
            got: Any = tuple(hf_llama.layer_leaf(params, cfg, t).shape)
        except (KeyError, IndexError) as exc:
            got = f"absent ({type(exc).__name__}: {exc})"
        if got != t.kernel:
            raise ExportError(
                f"Step {source.step} ({source.path}) does not hold the model its task "
                f"settings describe: {t.hf} (the tree's {'/'.join(t.path)}, layer "
                f"{t.layer}) should be {t.kernel}, the step's is {got}.",
                fix="export with the run's own config.yaml (a later start with other "
                    "task.model settings rewrote it)")


def _shards(entries: list[tuple[str, tuple[int, ...]]], itemsize: int, limit: int
            ) -> list[dict[str, tuple[int, ...]]]:
    """Tensors split, in order, into files of at most ``limit`` bytes (a larger tensor gets a
    file of its own), as transformers' ``save_pretrained(max_shard_size=...)`` splits them."""
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    size = 0
    for name, shape in entries:
        nbytes = itemsize
        for d in shape:
            nbytes *= d
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = shape
        size += nbytes
    return shards


def _write_weights(tmp: Path, shards: list[dict], produced: Any, np_dtype: Any, step: int
                   ) -> list[str]:
    from workers.models import hf_llama
    from workers.models.safetensors_io import write

    meta = {"format": "pt", "step": str(step)}  # transformers checks format == "pt"
    if len(shards) == 1:
        names = [hf_llama.SINGLE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                 for i in range(len(shards))]
    total = 0
    for name, shard in zip(names, shards, strict=True):
        specs = {t: (shape, np_dtype) for t, shape in shard.items()}
        write(tmp / name, specs, (next(produced) for _ in specs), metadata=meta)
        total += sum(_nbytes(shape, np_dtype) for shape, _ in specs.values())
    if len(shards) > 1:
        weight_map = {t: name for name, shard in zip(names, shards, strict=True) for t in shard}
        (tmp / hf_llama.INDEX).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        names.append(hf_llama.INDEX)
    return names


def _nbytes(shape: tuple[int, ...], np_dtype: Any) -> int:
    n = np_dtype.itemsize
    for d in shape:
        n *= d
    return n
