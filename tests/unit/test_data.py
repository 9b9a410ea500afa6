"""The bundled dataset: the global batch of a step is a pure function of (seed, step)."""

from __future__ import annotations

import numpy as np
import pytest

from workers.training.data import make_row, make_rows

SEQ, VOCAB = 32, 128


def test_same_seed_step_row_same_tokens():
    a = make_row(7, 3, 5, seq_len=SEQ, vocab_size=VOCAB)
    b = make_row(7, 3, 5, seq_len=SEQ, vocab_size=VOCAB)
    assert a.dtype == np.int32 and a.shape == (SEQ,)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("other", [(8, 3, 5), (7, 4, 5), (7, 3, 6)])
def test_seed_step_and_row_each_change_the_row(other):
    base = make_row(7, 3, 5, seq_len=SEQ, vocab_size=VOCAB)
    assert not np.array_equal(base, make_row(*other, seq_len=SEQ, vocab_size=VOCAB))


@pytest.mark.parametrize("hosts", [1, 2, 4, 8])
def test_rows_do_not_depend_on_host_count(hosts):
    """Each host takes its contiguous rows; concatenated they are the single-host batch."""
    batch = 16
    whole = make_rows(0, 11, range(batch), seq_len=SEQ, vocab_size=VOCAB)
    per = batch // hosts
    parts = [make_rows(0, 11, range(i * per, (i + 1) * per), seq_len=SEQ, vocab_size=VOCAB)
             for i in range(hosts)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_rows_are_deterministic_across_processes():
    """No hidden global RNG: the same rows come out in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys; from workers.training.data import make_rows; "
            "rows = make_rows(3, 9, range(4), seq_len=32, vocab_size=128); "
            "sys.stdout.write(rows.tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = make_rows(3, 9, range(4), seq_len=SEQ, vocab_size=VOCAB)
    assert bytes.fromhex(out.stdout) == here.tobytes()


def test_tokens_in_vocab_and_follow_a_learnable_rule():
    """Every row follows t[i+1] = (a*t[i] + b) mod V for one of a few (a, b): loss can fall."""
    rows = make_rows(0, 0, range(64), seq_len=SEQ, vocab_size=VOCAB)
    assert rows.min() >= 0 and rows.max() < VOCAB
    for r in rows:
        # Solve (a, b) from the row: with a odd and V a power of two, a is invertible mod V.
        found = {(a, b) for a in range(1, VOCAB, 2) for b in [(int(r[1]) - a * int(r[0])) % VOCAB]
                 if all((a * int(r[i]) + b) % VOCAB == int(r[i + 1]) for i in range(SEQ - 1))}
        assert found, "row does not follow any affine rule"


def test_empty_row_range():
    assert make_rows(0, 0, range(0), seq_len=SEQ, vocab_size=VOCAB).shape == (0, SEQ)
