"""A bundled, deterministic token dataset on which loss visibly falls.

Row ``r`` of step ``s`` is a pure function of ``(seed, s, r)``: any host count, any resume point,
the same batch. ``stream`` > 0 draws rows from another seed stream (NumPy's ``SeedSequence``
spawn key): the built-in tasks' held-out rows are ``stream=EVAL_STREAM``, rows no training step
draws; the rules stay the run's (the same task).
Each sequence follows an affine recurrence ``t[i+1] = (a·t[i] + b) mod V`` with
(a, b) drawn from a small set per row, so a model can learn it (loss drops from ln V towards 0)
but must read context to know which rule a row uses.
"""

from __future__ import annotations

import numpy as np

_RULES = 8
EVAL_STREAM = 1
"""The held-out stream of the built-in tasks' eval (``workers/task/lm.py``)."""


def make_row(seed: int, step: int, row: int, *, seq_len: int, vocab_size: int,
             stream: int = 0) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, step, row], spawn_key=(stream,))
                                if stream else [seed, step, row])
    rule = int(rng.integers(_RULES))
    rule_rng = np.random.default_rng([seed, 10_007, rule])
    a = int(rule_rng.integers(1, vocab_size)) | 1
    b = int(rule_rng.integers(0, vocab_size))
    out = np.empty(seq_len, dtype=np.int32)
    out[0] = int(rng.integers(vocab_size))
    for i in range(1, seq_len):
        out[i] = (a * int(out[i - 1]) + b) % vocab_size
    return out


def make_rows(seed: int, step: int, rows: range, *, seq_len: int, vocab_size: int,
              stream: int = 0) -> np.ndarray:
    """The given rows of step ``step``'s global batch, shape (len(rows), seq_len)."""
    return np.stack([make_row(seed, step, r, seq_len=seq_len, vocab_size=vocab_size,
                              stream=stream)
                     for r in rows]) if len(rows) else np.zeros((0, seq_len), np.int32)
