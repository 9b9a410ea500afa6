"""A decoder LM trained on real text: the model of ``workers/training/model.py`` fed by the input
pipeline (``workers.input``) over a directory ``python -m orchestrator.data prepare`` wrote.

    python -m orchestrator.data prepare --input examples/data --out $PWD/runs/data/sqlite
    python -m orchestrator.main --config examples/text_lm/config.yaml \\
        task.data.dir=$PWD/runs/data/sqlite

The factory opens (and verifies) the data, so a missing or changed shard, another tokenizer, or
a model that cannot take the data stops the run at the driver's task check (exit 2) with the
fix. The batch of step ``s`` is records ``[s·B, (s+1)·B)`` of the seeded shuffle: every restore,
resize and hand-over keeps the sample order (docs/data.md).

Eval (``eval.every``) reads the held-out split ``prepare --eval-records N`` wrote (the stream's
last N records, never trained on), with the training loss as the eval's:

    python -m orchestrator.data prepare --input examples/data --out $PWD/runs/data/sqlite \\
        --eval-records 128 --overwrite
    python -m orchestrator.main --config examples/text_lm/config.yaml \\
        task.data.dir=$PWD/runs/data/sqlite eval.every=50
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp
import optax

from orchestrator.data.settings import DataSettings
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.task import ModelConfig
from workers.input import open_heldout, open_source
from workers.task import Task, TaskContext
from workers.task.optim import adamw_cosine
from workers.training.model import LOGICAL_RULES, analytic_flops_per_step, build_model


@dataclass(frozen=True, kw_only=True)
class TextLMSettings:
    """``task.*``: the model's dimensions and ``task.data`` (``DataSettings``)."""

    data: DataSettings
    vocab_size: int = 4096
    """At least the data's tokenizer's (its manifest's ``vocab_size``)."""
    seq_len: int = 128
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 512
    dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "num_layers", "num_heads", "d_ff"):
            if getattr(self, name) < 1:
                raise ConfigError(f"task.{name}", f"must be >= 1, got {getattr(self, name)}",
                                  f"set task.{name} to 1 or more")
        if self.d_model % self.num_heads:
            raise ConfigError("task.num_heads", f"d_model={self.d_model} does not divide by "
                              f"num_heads={self.num_heads}", "pick a divisor of task.d_model")

    def model(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, d_model=self.d_model,
                           num_layers=self.num_layers, num_heads=self.num_heads, d_ff=self.d_ff,
                           seq_len=self.seq_len, dtype=self.dtype)


def make_task(settings: TextLMSettings, ctx: TaskContext) -> Task:
    cfg = settings.model()
    model = build_model(cfg)
    data = open_source(settings.data, seq_len=settings.seq_len,
                       vocab_size=settings.vocab_size, global_batch=ctx.train.global_batch,
                       total_steps=ctx.total_steps, model_setting="task", setting="task.data")
    # the held-out split prepare --eval-records wrote (None without one: eval.every refused)
    held_out = open_heldout(settings.data, seq_len=settings.seq_len,
                            vocab_size=settings.vocab_size, global_batch=ctx.train.global_batch,
                            model_setting="task", setting="task.data")
    tx, schedule = adamw_cosine(ctx)
    return Task(init=functools.partial(_init, model, settings.seq_len),
                loss=functools.partial(_loss, model), optimizer=tx, schedule=schedule,
                data=data, eval_data=held_out, rules=LOGICAL_RULES,
                flops_per_step=analytic_flops_per_step(cfg, ctx.train.global_batch),
                tokens_per_example=settings.seq_len - 1, code=("workers.training.model",))


def _init(model, seq_len: int, key):
    return model.init(key, jnp.zeros((1, seq_len - 1), jnp.int32))["params"]


def _loss(model, params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), {}
