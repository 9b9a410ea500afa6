"""The built-in ``llama`` task: a Llama-style decoder (``workers/models/llama.py``: presets
``tiny``, ``1b``, ``8b``) on the bundled stateless token data, AdamW with warmup + cosine from
``train.*``, next-token cross-entropy, MFU from the family's analytic FLOPs; held-out rows from
another seed stream of the same data, as the ``lm`` task's (``eval.*``).

``task.data`` (``DataSettings``: a directory ``python -m orchestrator.data prepare`` wrote, e.g.
with a model's own ``--tokenizer tokenizer.json``) trains on that data instead, read through the
input pipeline (``workers.input``) as ``examples/text_lm``'s, eval from its held-out split;
``task.model.vocab_size`` must hold the data's tokenizer and ``task.model.seq_len`` fit its
records (examples/llama_finetune/).

``task: {kind: llama, preset: 1b}``; a preset's fields are overridden under ``task.model``
(``task.model.num_layers=8``, ``task.model.param_dtype=bfloat16``), validated by
``LlamaConfig`` naming ``task.model.<field>`` (docs/models.md). ``task.init_from: DIR`` starts a
new run from a Hugging Face Llama directory (``HfSource``; docs/hf.md)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from orchestrator.data.settings import DataSettings
from orchestrator.shared.errors import ConfigError, OrchestratorError
from workers.models import hf_llama
from workers.models.llama import LLAMA_RULES, LlamaConfig, build_llama, flops_per_step
from workers.task.contract import DataSource, Task, TaskContext
from workers.task.lm import TokenData, _init, _loss
from workers.task.optim import adamw_cosine
from workers.training.data import EVAL_STREAM

NUMERICS_ONLY = ("attention", "remat")
"""``task.model`` fields left out of the task's fingerprint (``fingerprint_settings``)."""


@dataclass(frozen=True, kw_only=True)
class LlamaSettings:
    preset: str = "tiny"
    model: dict[str, Any] = field(default_factory=dict)
    """Fields of the preset to override (``LlamaConfig``)."""
    init_from: str | None = None
    """A Hugging Face Llama directory a new run starts from (``HfSource``); checked by the
    driver's task check, read only when the run has no committed step. Not part of the task's
    fingerprint: it says where a run starts, not which checkpoints fit (as ``run.seed``)."""
    data: DataSettings | None = None
    """Prepared data to train on (``python -m orchestrator.data prepare``); None: the bundled
    synthetic tokens. Not part of the fingerprint: it says what the steps read, not which
    checkpoints fit (the data's position is checked by the input pipeline on restore)."""

    def __post_init__(self) -> None:
        self.config()  # a bad preset or field is refused with the config, naming the setting
        if self.init_from is not None and not (isinstance(self.init_from, str)
                                               and self.init_from.strip()):
            raise ConfigError(INIT_FROM, f"{self.init_from!r} is not a directory path", FIX)

    def config(self) -> LlamaConfig:
        return LlamaConfig.preset(self.preset, **self.model)

    def fingerprint_settings(self) -> dict[str, Any]:
        """The settings that decide which checkpoints fit: all but ``NUMERICS_ONLY``, which
        change how the step computes, not the state (a run saved with plain attention resumes
        with fused, and the other way), ``init_from``, where a new run starts, and ``data``,
        what the steps read."""
        return {"preset": self.preset,
                "model": {k: v for k, v in self.model.items() if k not in NUMERICS_ONLY}}


def make_task(settings: LlamaSettings, ctx: TaskContext) -> Task:
    cfg = settings.config()
    model = build_llama(cfg)
    tx, schedule = adamw_cosine(ctx)
    data, eval_data = _data(settings.data, cfg, ctx)
    return Task(init=functools.partial(_init, model, cfg.seq_len),
                loss=functools.partial(_loss, model), optimizer=tx, schedule=schedule,
                data=data, eval_data=eval_data, rules=LLAMA_RULES,
                flops_per_step=flops_per_step(cfg, ctx.train.global_batch),
                tokens_per_example=cfg.seq_len - 1,
                init_from=HfSource(settings.init_from, cfg) if settings.init_from else None,
                code=("workers.models.llama", "workers.training.data"))


def _data(data: DataSettings | None, cfg: LlamaConfig,
          ctx: TaskContext) -> tuple[DataSource, DataSource | None]:
    """The training and held-out rows: ``task.data``'s prepared records (opened and verified
    here, so a missing shard, another tokenizer or a model that cannot take the data stops the
    run at the driver's task check naming ``task.data`` or ``task.model.<field>``), else the
    bundled tokens and their eval stream."""
    if data is None:
        return (TokenData(cfg.seq_len, cfg.vocab_size),
                TokenData(cfg.seq_len, cfg.vocab_size, stream=EVAL_STREAM))
    from workers.input import open_heldout, open_source  # the input pipeline: only with data

    shape = dict(seq_len=cfg.seq_len, vocab_size=cfg.vocab_size,
                 global_batch=ctx.train.global_batch, model_setting=SETTING, setting=DATA)
    return (open_source(data, total_steps=ctx.total_steps, **shape),
            open_heldout(data, **shape))  # None without one: eval.every refused


SETTING, DATA = "task.model", "task.data"
INIT_FROM = "task.init_from"
_FILES = (".safetensors", ".json")
"""The directory's files whose change makes ``HfSource`` parse its headers again."""
FIX = ("point task.init_from at a Hugging Face Llama directory (config.json beside "
       "model.safetensors or model.safetensors.index.json) that the driver and every host can "
       "read, or remove task.init_from to start from the seeded init")


class HfSource:
    """``task.init_from``: a Hugging Face Llama directory read into the family's tree slice by
    slice (a ``workers.task.contract.ParamSource``). Built with the task on every host; nothing
    is read until ``check`` (config and headers) or ``read`` (one device's slice, by offset)."""

    def __init__(self, model_dir: str, cfg: LlamaConfig) -> None:
        self.dir, self.cfg = Path(model_dir), cfg
        self.leaves = hf_llama.leaf_tensors(cfg)
        self._ckpt: hf_llama.Checkpoint | None = None
        self._files: list = []

    def check(self, params: Any) -> None:
        """The directory holds this task's model: its config.json matches ``task.model``
        (refused naming the field and the value to set), every tensor is there with its shape,
        and the family's tree is the one ``params`` describes."""
        if not self.dir.is_dir():
            raise ConfigError(INIT_FROM, f"{self.dir} is not a directory (seen from "
                              f"{os.getcwd()})", FIX)
        if not (self.dir / hf_llama.CONFIG).is_file():
            raise ConfigError(INIT_FROM, f"{self.dir} has no {hf_llama.CONFIG}", FIX)
        with _refused():
            hf_llama.check_matches(self.cfg, hf_llama.read_config(self.dir),
                                   source=str(self.dir / hf_llama.CONFIG))
            self._checkpoint().check(self.cfg)
        stacked = self.cfg.scan_layers
        want = {path: (len(ts), *ts[0].kernel) if stacked and ts[0].layer is not None
                else ts[0].kernel for path, ts in self.leaves.items()}
        got = {_keys(path): tuple(leaf.shape)
               for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
        if got != want:
            raise ConfigError(INIT_FROM, "the task's parameters are not the llama family's "
                              f"tree the checkpoint maps into ({sorted(set(got) ^ set(want))[:3]}"
                              " differ)", "start from the seeded init (no task.init_from)")

    def read(self, path: tuple[str, ...], index: tuple[slice, ...]) -> np.ndarray:
        with _refused():
            return hf_llama.read_leaf(self._checkpoint(), self.cfg, self.leaves[path], index)

    def _checkpoint(self) -> hf_llama.Checkpoint:
        """The directory's checkpoint, its headers parsed again whenever its files changed (the
        task lives as long as its process: headers must never describe replaced files)."""
        try:
            files = sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size)
                           for e in os.scandir(self.dir) if e.name.endswith(_FILES))
        except OSError:  # a new run whose directory this host cannot see
            raise ConfigError(INIT_FROM, f"{self.dir} is not a directory (seen from "
                              f"{os.getcwd()})", FIX) from None
        if self._ckpt is None or files != self._files:
            self._ckpt, self._files = hf_llama.Checkpoint(self.dir), files
        return self._ckpt


@contextmanager
def _refused() -> Iterator[None]:
    """The checkpoint's refusals (``HfCheckpointError``, ``SafetensorsError``) as config errors:
    ``task.model.<field>`` for a config mismatch, else ``task.init_from``."""
    try:
        yield
    except ConfigError:
        raise
    except OrchestratorError as exc:
        raise ConfigError(getattr(exc, "setting", INIT_FROM), exc.message,
                          exc.fix or FIX) from None
    except OSError as exc:  # a file gone or unreadable between the check and the load
        raise ConfigError(INIT_FROM, f"cannot be read ({exc})", FIX) from None


def _keys(path: Any) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)
