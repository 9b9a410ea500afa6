"""The ``llama`` task with a golden's input ids as its rows: a task whose first step's loss is
transformers' reference loss when its parameters are the golden's (``task.init_from``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from workers.task.contract import Task, TaskContext
from workers.task.llama import LlamaSettings
from workers.task.llama import make_task as llama_task

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "llama" / "gqa_untied"
MODEL = ("task.model.vocab_size=128", "task.model.d_model=32", "task.model.d_ff=96",
         "task.model.rope_theta=500000.0", "task.model.seq_len=16")
"""The golden ``gqa_untied``'s model over the ``tiny`` preset (layers, heads, KV heads, eps and
untied embeddings are the preset's already)."""


@dataclasses.dataclass(frozen=True)
class GoldenRows:
    """The golden's ``input_ids`` (2 × 16) as every step's rows."""

    def example(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((16,), jnp.int32)

    def rows(self, seed: int, step: int, rows: range) -> np.ndarray:
        with np.load(GOLDEN / "reference.npz") as ref:
            return ref["input_ids"].astype(np.int32)[rows.start:rows.stop]


def make_task(settings: LlamaSettings, ctx: TaskContext) -> Task:
    """The ``llama`` task (``init_from`` and all) with the golden's tokens as its data."""
    return dataclasses.replace(llama_task(settings, ctx), data=GoldenRows())
