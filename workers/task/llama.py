"""The built-in ``llama`` task: a Llama-style decoder (``workers/models/llama.py``: presets
``tiny``, ``1b``, ``8b``) on the bundled stateless token data, AdamW with warmup + cosine from
``train.*``, next-token cross-entropy, MFU from the family's analytic FLOPs; held-out rows from
another seed stream of the same data, as the ``lm`` task's (``eval.*``).

``task: {kind: llama, preset: 1b}``; a preset's fields are overridden under ``task.model``
(``task.model.num_layers=8``, ``task.model.param_dtype=bfloat16``), validated by
``LlamaConfig`` naming ``task.model.<field>`` (docs/models.md)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from workers.models.llama import LLAMA_RULES, LlamaConfig, build_llama, flops_per_step
from workers.task.contract import Task, TaskContext
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

    def __post_init__(self) -> None:
        self.config()  # a bad preset or field is refused with the config, naming the setting

    def config(self) -> LlamaConfig:
        return LlamaConfig.preset(self.preset, **self.model)

    def fingerprint_settings(self) -> dict[str, Any]:
        """The settings that decide which checkpoints fit: all but ``NUMERICS_ONLY``, which
        change how the step computes, not the state (a run saved with plain attention resumes
        with fused, and the other way)."""
        return {"preset": self.preset,
                "model": {k: v for k, v in self.model.items() if k not in NUMERICS_ONLY}}


def make_task(settings: LlamaSettings, ctx: TaskContext) -> Task:
    cfg = settings.config()
    model = build_llama(cfg)
    tx, schedule = adamw_cosine(ctx)
    return Task(init=functools.partial(_init, model, cfg.seq_len),
                loss=functools.partial(_loss, model), optimizer=tx, schedule=schedule,
                data=TokenData(cfg.seq_len, cfg.vocab_size),
                eval_data=TokenData(cfg.seq_len, cfg.vocab_size, stream=EVAL_STREAM),
                rules=LLAMA_RULES,
                flops_per_step=flops_per_step(cfg, ctx.train.global_batch),
                tokens_per_example=cfg.seq_len - 1,
                code=("workers.models.llama", "workers.training.data"))
