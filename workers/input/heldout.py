"""The held-out split of a prepared dataset (``prepare --eval-records``) as a task's
``eval_data`` (docs/tasks.md, ``eval.*``): eval batch ``b`` is records ``[b·B, (b+1)·B)`` of
the eval shards in the order prepare wrote them, ``B`` = ``train.global_batch``. No shuffle and
no wrap: every eval reads the same rows, each once; an eval asking for more rows than the split
holds is refused (``__len__`` says how many it holds; the driver's task check compares)."""

from __future__ import annotations

from typing import Any

import numpy as np

from orchestrator.shared.errors import DataError


class HeldOut:
    """Rows of the eval split's records (a Grain random-access source of ``(seq_len,)`` int32
    arrays, every read checked like a training record)."""

    def __init__(self, records: Any, *, global_batch: int, seq_len: int, name: str = "",
                 setting: str = "task.data") -> None:
        self.records, self.n = records, len(records)
        self.global_batch, self.seq_len = global_batch, seq_len
        self.name, self.setting = name, setting

    def __len__(self) -> int:
        return self.n

    def example(self) -> Any:
        import jax
        import jax.numpy as jnp

        return jax.ShapeDtypeStruct((self.seq_len,), jnp.int32)

    def rows(self, seed: int, step: int, rows: range) -> np.ndarray:
        """Rows ``rows`` of eval batch ``step``: records ``step·B + r`` (``seed`` unused: the
        split is fixed)."""
        if rows.step != 1 or not 0 <= rows.start <= rows.stop <= self.global_batch:
            raise ValueError(f"rows {rows} are not a contiguous range of the batch of "
                             f"{self.global_batch}")
        base = step * self.global_batch
        if step < 0 or base + rows.stop > self.n:
            raise DataError(f"{self.setting}.dir", f"eval batch {step} needs records up to "
                            f"{base + rows.stop} of the held-out split of {self.name!r}, which "
                            f"holds {self.n}", "lower eval.batches, or prepare with a larger "
                            "--eval-records")
        if rows.start == rows.stop:
            return np.zeros((0, self.seq_len), np.int32)
        return np.stack([self.records[base + r] for r in rows])
