"""The sample order of a source whose position is the step: the same global batch for any
number of processes, the same samples after a restart at any step, epochs that wrap with a new
shuffle, and read-ahead that changes nothing."""

from __future__ import annotations

import json
import logging
import os
import pathlib

import numpy as np
import pytest

from tests.input.conftest import SEQ_LEN, VOCAB
from workers.input import DataSettings, open_source

SEED = 1234
BATCH = 8
FORMATS = ("bin", "npy", "arrayrecord")


def _open(data_dir: str, *, seq_len=SEQ_LEN, total_steps=None, **settings):
    return open_source(DataSettings(dir=data_dir, **settings), seq_len=seq_len,
                       vocab_size=VOCAB, global_batch=BATCH, total_steps=total_steps)


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_global_batch_for_1_2_4_processes(datasets, fmt):
    """Processes 0..P-1 reading their rows put together the 1-process global batch, for P=1,2,4."""
    steps = range(0, 40, 3)
    with _open(datasets[fmt]) as one:
        whole = {s: one.local_batch(SEED, s, accum_steps=2) for s in steps}
        ids = {s: one.sample_ids(SEED, s) for s in steps}
    for count in (2, 4):
        sources = [_open(datasets[fmt]) for _ in range(count)]  # one per simulated process
        try:
            for s in steps:
                parts = [src.local_batch(SEED, s, accum_steps=2, process_index=p,
                                         process_count=count)
                         for p, src in enumerate(sources)]
                assert np.array_equal(np.concatenate(parts, axis=1), whole[s]), (count, s)
                assert all(np.array_equal(src.sample_ids(SEED, s), ids[s]) for src in sources)
        finally:
            for src in sources:
                src.close()


def test_rows_are_the_records_of_the_sample_ids(datasets):
    """Row r of step s is record sample_ids[r], and the ids of a step are distinct records."""
    with _open(datasets["bin"]) as src:
        for s in (0, 5, 17):
            ids = src.sample_ids(SEED, s)
            assert len(set(ids.tolist())) == BATCH
            expected = np.stack([src.records[i] for i in ids])
            assert np.array_equal(src.rows(SEED, s, range(BATCH)), expected)


@pytest.mark.parametrize("fmt", ("bin", "arrayrecord"))
def test_restart_at_any_step_reads_the_same_samples(datasets, fmt):
    """A source recreated (a restart) and read from step s gives the samples the first one did."""
    with _open(datasets[fmt]) as first:
        seen = {s: (first.sample_ids(SEED, s), first.rows(SEED, s, range(BATCH)))
                for s in range(60)}
    for restart in (0, 1, 13, 59):
        with _open(datasets[fmt], prefetch_steps=3) as again:
            for s in range(restart, 60):
                assert np.array_equal(again.sample_ids(SEED, s), seen[s][0]), (restart, s)
                assert np.array_equal(again.rows(SEED, s, range(BATCH)), seen[s][1])


def test_the_seed_changes_the_order_and_shuffle_off_reads_in_order(datasets):
    """Another seed is another permutation; shuffle=False reads records 0, 1, 2, ... in order."""
    with _open(datasets["bin"]) as src:
        assert not np.array_equal(src.sample_ids(SEED, 0), src.sample_ids(SEED + 1, 0))
    with _open(datasets["bin"], shuffle=False) as plain:
        assert plain.sample_ids(SEED, 3).tolist() == list(range(3 * BATCH, 4 * BATCH))


def test_a_short_dataset_wraps_into_new_shuffled_epochs(datasets, caplog):
    """Each epoch reads every record once, in a new order; position counts epochs; logged."""
    caplog.set_level(logging.INFO, logger="workers.input.source")
    with _open(datasets["arrayrecord"], total_steps=10_000) as src:
        n = src.n
        steps_per_epoch, rest = divmod(n, BATCH)
        order = np.concatenate([src.sample_ids(SEED, s) for s in range(3 * n // BATCH + 1)])
        epochs = [order[e * n:(e + 1) * n] for e in range(3)]
        for epoch in epochs:
            assert sorted(epoch.tolist()) == list(range(n))
        assert not np.array_equal(epochs[0], epochs[1])
        assert not np.array_equal(epochs[1], epochs[2])
        for s in (0, 1, steps_per_epoch, steps_per_epoch + 1, 2 * steps_per_epoch + 1):
            pos = src.position(s)
            assert pos.epoch == s * BATCH // n
            assert epochs[pos.epoch][pos.index] == src.sample_ids(SEED, s)[0]
        assert src.epochs(10_000) == -(-10_000 * BATCH // n)
        src.rows(SEED, steps_per_epoch + (1 if rest else 0), range(BATCH))
    text = caplog.text
    assert "shorter than the run" in text and "epoch 1" in text


def test_prefetch_does_not_change_what_is_read(datasets):
    """Read-ahead on threads returns the same rows as reading in the step's thread, also when
    a restore jumps back and the ranges differ per call."""
    plan = [(s, r) for s in range(25) for r in (range(0, 4), range(4, 8))]
    plan += [(s, range(0, 8)) for s in (3, 4, 5, 40, 41)]  # a restore to 3, a jump to 40
    with _open(datasets["bin"], prefetch_steps=0) as direct, \
            _open(datasets["bin"], prefetch_steps=4, read_threads=3) as ahead:
        for s, r in plan:
            assert np.array_equal(ahead.rows(SEED, s, r), direct.rows(SEED, s, r)), (s, r)
        assert ahead.prefetch_stats["hits"] > 40
        assert direct.prefetch_stats["hits"] == 0


def test_rows_are_int32_of_the_example_shape(datasets):
    """rows() gives example()'s shape and dtype with a leading axis of len(rows)."""
    with _open(datasets["npy"]) as src:
        ex = src.example()
        got = src.rows(SEED, 2, range(3, 7))
        assert got.shape == (4, *ex.shape) and got.dtype == ex.dtype == np.int32
        assert got.max() < VOCAB


def test_flat_files_are_cut_to_the_model_seq_len(datasets):
    """A .bin prepared for 16 tokens serves records of 8 (twice as many) and of 24."""
    with _open(datasets["bin"], seq_len=8) as short, _open(datasets["bin"]) as full:
        assert short.n == 2 * full.n
        assert short.rows(SEED, 0, range(2)).shape == (2, 8)
        assert np.array_equal(short.records[1], full.records[0][8:])
    with _open(datasets["bin"], seq_len=24) as long:
        assert long.rows(SEED, 0, range(2)).shape == (2, 24)


def test_trace_records_the_samples_each_step_consumed(datasets, tmp_path):
    """With trace_dir, every read appends its step, rows, ids and epoch to a JSONL file."""
    with _open(datasets["bin"], trace_dir=str(tmp_path)) as src:
        src.rows(SEED, 7, range(2, 6))
        ids = src.sample_ids(SEED, 7, range(2, 6)).tolist()
    [trace] = list(pathlib.Path(tmp_path).glob("samples-*.jsonl"))
    line = json.loads(trace.read_text().splitlines()[0])
    assert line.pop("pid") == os.getpid() and line.pop("t") > 0
    assert line == {"step": 7, "rows": [2, 6], "ids": ids, "epoch": 0}
