"""A token source whose position *is the step* (DESIGN "Tasks", docs/data.md).

The records (``workers/input/records.py``) go through a Grain ``MapDataset``:
``MapDataset.source(records).shuffle(seed).repeat()``. Grain's global shuffle is a seeded
bijection per epoch (seed + epoch), so element ``i`` of the repeated dataset is a pure function
of ``(seed, i)``; element ``i`` of epoch ``e = i // N`` is one of that epoch's permutation. The
global batch of step ``s`` is elements ``[s·B, (s+1)·B)``; row ``r`` of it is element
``s·B + r``. Each process asks only for its rows, so any number of processes (a resize, a
hand-over, a restore from any tier) reads the same global batch, and a dataset shorter than the
run wraps into a new, differently shuffled epoch (logged, counted by ``position``).

``rows(seed, step, rows)`` is the task contract's ``DataSource`` (``workers/task/contract.py``);
``local_batch`` is the same for a caller that shards by process index and count.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.shared.errors import ConfigError
from orchestrator.shared.files import open_append
from workers.input.prefetch import ReadAhead

log = logging.getLogger(__name__)
_SEED_SALT = 0x64617461  # "data": the shuffle's seed is not the init key's


def shuffle_seed(seed: int) -> int:
    """Grain's shuffle takes a 32-bit seed; the run's seed is mixed into one."""
    return int(np.random.SeedSequence([seed % (1 << 63), _SEED_SALT]).generate_state(1)[0])


@dataclass(frozen=True)
class Position:
    """Where step ``step`` reads: epoch ``epoch`` (0-based), from record ``index`` of that
    epoch's shuffled order, ``records`` per epoch."""

    step: int
    epoch: int
    index: int
    records: int
    global_batch: int


class TokenSource:
    """Rows of token records for the step's global batch of ``global_batch`` records.

    ``records``: a Grain random-access source of ``(seq_len,)`` int32 arrays.
    """

    def __init__(self, records: Any, *, global_batch: int, seq_len: int, shuffle: bool = True,
                 prefetch_steps: int = 2, read_threads: int = 2, read_timeout_s: float = 120.0,
                 total_steps: int | None = None, trace_dir: str | None = None,
                 name: str = "", setting: str = "task.data") -> None:
        self.records = records
        self.n = len(records)
        if self.n < 1:
            raise ConfigError(f"{setting}.dir", f"the data {name!r} holds no record of "
                              f"{seq_len} tokens", "prepare more text, or lower seq_len")
        if global_batch < 1:
            raise ConfigError("train.global_batch", f"{global_batch} rows per step",
                              "set train.global_batch >= 1")
        self.global_batch, self.seq_len, self.shuffle = global_batch, seq_len, shuffle
        self.name, self.setting = name, setting
        self._datasets: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._epochs_logged: set[int] = set()
        self._ahead = ReadAhead(self._read, steps=prefetch_steps, threads=read_threads,
                                timeout_s=read_timeout_s, setting=f"{setting}.read_timeout_s")
        self._trace = _Trace(trace_dir) if trace_dir else None
        if total_steps:
            epochs = self.epochs(total_steps)
            if epochs > 1:
                log.warning("data %s: %d records, the run reads %d (%d steps × %d): the data is "
                            "shorter than the run and is read %d times, each epoch shuffled "
                            "anew", name, self.n, total_steps * global_batch, total_steps,
                            global_batch, epochs)

    # ---- the task contract (workers.task.contract.DataSource) ---------------------------

    def example(self) -> Any:
        import jax
        import jax.numpy as jnp

        return jax.ShapeDtypeStruct((self.seq_len,), jnp.int32)

    def rows(self, seed: int, step: int, rows: range) -> np.ndarray:
        """Rows ``rows`` of step ``step``'s global batch, ``(len(rows), seq_len)`` int32."""
        if rows.step != 1 or not 0 <= rows.start <= rows.stop <= self.global_batch:
            raise ValueError(f"rows {rows} are not a contiguous range of the global batch of "
                             f"{self.global_batch}")
        if step < 0:
            raise ValueError(f"step {step} < 0")
        out = self._ahead.get(seed, step, rows.start, rows.stop)
        self._note_epochs(step)
        if self._trace is not None:
            self._trace.write(step, rows, self.sample_ids(seed, step, rows),
                              self.position(step).epoch)
        return out

    # ---- positions and sample ids --------------------------------------------------------

    def position(self, step: int) -> Position:
        epoch, index = divmod(step * self.global_batch, self.n)
        return Position(step=step, epoch=epoch, index=index, records=self.n,
                        global_batch=self.global_batch)

    def epochs(self, total_steps: int) -> int:
        """Epochs a run of ``total_steps`` steps reads (a started epoch counts)."""
        return max(1, math.ceil(total_steps * self.global_batch / self.n))

    def sample_ids(self, seed: int, step: int, rows: range | None = None) -> np.ndarray:
        """The record ids behind rows ``rows`` (default: all) of step ``step``, without reading
        a record: what a test records to compare sample orders."""
        rows = range(self.global_batch) if rows is None else rows
        ids, _ = self._dataset(seed)
        base = step * self.global_batch
        return np.array([ids[base + r] for r in rows], dtype=np.int64)

    # ---- per-process batches -------------------------------------------------------------

    def local_batch(self, seed: int, step: int, *, accum_steps: int = 1,
                    process_index: int = 0, process_count: int = 1) -> np.ndarray:
        """This process's rows of step ``step``: ``(accum_steps, micro / process_count,
        seq_len)`` int32, where ``micro = global_batch / accum_steps`` and process ``p`` holds
        rows ``[p·m, (p+1)·m)`` of each micro-batch (the trainer's layout: the batch axis
        sharded over the processes in order)."""
        parts = [self.rows(seed, step, rg) for rg in process_rows(
            self.global_batch, accum_steps=accum_steps, process_index=process_index,
            process_count=process_count)]
        return np.stack(parts)

    # ---- reading -------------------------------------------------------------------------

    def _dataset(self, seed: int) -> tuple[Any, Any]:
        """(ids, samples): Grain datasets of the record id and the record at every element."""
        with self._lock:
            if seed not in self._datasets:
                import grain

                ids = grain.MapDataset.range(self.n)
                samples = grain.MapDataset.source(self.records)
                if self.shuffle:
                    s32 = shuffle_seed(seed)
                    ids, samples = ids.shuffle(seed=s32), samples.shuffle(seed=s32)
                self._datasets[seed] = (ids.repeat(), samples.repeat())
            return self._datasets[seed]

    def _read(self, seed: int, step: int, start: int, stop: int) -> np.ndarray:
        _, samples = self._dataset(seed)
        base = step * self.global_batch
        if start == stop:
            return np.zeros((0, self.seq_len), np.int32)
        return np.stack([samples[base + r] for r in range(start, stop)])

    def _note_epochs(self, step: int) -> None:
        first = step * self.global_batch // self.n
        last = ((step + 1) * self.global_batch - 1) // self.n
        for epoch in range(first, last + 1):
            if epoch > 0 and epoch not in self._epochs_logged:
                self._epochs_logged.add(epoch)
                begins = epoch * self.n // self.global_batch
                log.info("data %s: epoch %d (of %d records, shuffled anew) begins at step %d; "
                         "this process reads it from step %d", self.name, epoch, self.n,
                         begins, step)

    @property
    def prefetch_stats(self) -> dict[str, int]:
        return {"hits": self._ahead.hits, "misses": self._ahead.misses}

    def close(self) -> None:
        self._ahead.close()
        if self._trace is not None:
            self._trace.close()

    def __enter__(self) -> TokenSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def process_rows(global_batch: int, *, accum_steps: int, process_index: int,
                 process_count: int) -> list[range]:
    """Process ``process_index``'s rows of the global batch, one range per micro-batch."""
    if accum_steps < 1 or global_batch % accum_steps:
        raise ConfigError("train.global_batch", f"{global_batch} rows do not split into "
                          f"{accum_steps} micro-batches", "make global_batch a multiple of "
                          "the accumulation steps")
    micro = global_batch // accum_steps
    if process_count < 1 or micro % process_count or not 0 <= process_index < process_count:
        raise ConfigError("train.global_batch", f"micro-batches of {micro} rows do not split "
                          f"over {process_count} processes (process {process_index})",
                          "make the micro-batch a multiple of the process count")
    m = micro // process_count
    return [range(a * micro + process_index * m, a * micro + (process_index + 1) * m)
            for a in range(accum_steps)]


TASK_CHECK_ENV = "TPU_ORCH_TASK_NOTES"
"""Set in the driver's task check's subprocess (``orchestrator/driver/task_check.py``)."""


class _Trace:
    """Appends ``{"step", "rows", "ids", "epoch", "pid", "t"}`` per read to a file of this
    process's (``t``: wall time, so a test can tell the reads of each restore apart). The driver's
    task check probes rows too (the first and last step's): those go to ``check-*.jsonl``, as
    they are read for the check, not trained on."""

    def __init__(self, trace_dir: str) -> None:
        os.makedirs(trace_dir, exist_ok=True)
        who = "check" if os.environ.get(TASK_CHECK_ENV) == "1" else "samples"
        name = f"{who}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self._f = open_append(os.path.join(trace_dir, name))  # never through a link
        self._lock = threading.Lock()

    def write(self, step: int, rows: range, ids: np.ndarray, epoch: int) -> None:
        line = json.dumps({"step": step, "rows": [rows.start, rows.stop],
                           "ids": ids.tolist(), "epoch": epoch, "pid": os.getpid(),
                           "t": time.time()})
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()
