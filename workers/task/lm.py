"""The built-in ``lm`` task: the decoder LM of ``workers/training/model.py`` on the bundled
stateless token data (``workers/training/data.py``), AdamW with warmup + cosine from ``train.*``,
next-token cross-entropy. It goes through the same contract as a user's task (``task.kind: lm``).

Its held-out split (``eval.*``) is the same data from another seed stream (``stream=
EVAL_STREAM``): rows no training step draws. The data has few distinct rows (``_RULES`` rules ×
the vocabulary's start tokens), so held-out rows may equal training rows: its eval loss tracks
the training distribution, it does not measure generalisation."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from orchestrator.shared.task import ModelConfig
from workers.task.contract import Task, TaskContext
from workers.task.optim import adamw_cosine
from workers.training import data as data_lib
from workers.training.model import LOGICAL_RULES, analytic_flops_per_step, build_model


@dataclass(frozen=True)
class TokenData:
    """Rows of ``workers.training.data``: int32 token sequences of ``seq_len``."""

    seq_len: int
    vocab_size: int
    stream: int = 0
    """0: the training rows; ``data_lib.EVAL_STREAM``: the held-out rows."""

    def example(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((self.seq_len,), jnp.int32)

    def rows(self, seed: int, step: int, rows: range) -> np.ndarray:
        return data_lib.make_rows(seed, step, rows, seq_len=self.seq_len,
                                  vocab_size=self.vocab_size, stream=self.stream)


def make_task(settings: ModelConfig, ctx: TaskContext) -> Task:
    model = build_model(settings)
    tx, schedule = adamw_cosine(ctx)
    return Task(init=functools.partial(_init, model, settings.seq_len),
                loss=functools.partial(_loss, model), optimizer=tx, schedule=schedule,
                data=TokenData(settings.seq_len, settings.vocab_size),
                eval_data=TokenData(settings.seq_len, settings.vocab_size,
                                    stream=data_lib.EVAL_STREAM), rules=LOGICAL_RULES,
                flops_per_step=analytic_flops_per_step(settings, ctx.train.global_batch),
                tokens_per_example=settings.seq_len - 1,
                code=("workers.training.model", "workers.training.data"))


def _init(model, seq_len: int, key):
    dummy = jnp.zeros((1, seq_len - 1), jnp.int32)
    return model.init(key, dummy)["params"]


def _loss(model, params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(), {}
