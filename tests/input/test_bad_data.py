"""Bad data is bad input, named with its fix, never a hang: a missing, truncated or changed
shard, a changed tokenizer or another one, a missing manifest, a corrupt record found while
reading, a sequence length or vocabulary the model does not take, a stalled read."""

from __future__ import annotations

import pathlib
import re
import shutil
import threading

import numpy as np
import pytest

from orchestrator.data.manifest import load, verify
from orchestrator.shared.errors import ConfigError, DataError
from tests.input.conftest import SEQ_LEN, VOCAB
from workers.input import DataSettings, open_source
from workers.input.prefetch import ReadAhead


@pytest.fixture
def copy_of(datasets, tmp_path):
    """A writable copy of a prepared dataset."""

    def make(fmt: str) -> pathlib.Path:
        dst = tmp_path / fmt
        shutil.copytree(datasets[fmt], dst)
        return dst

    return make


def _open(path, *, seq_len=SEQ_LEN, **settings):
    return open_source(DataSettings(dir=str(path), **settings), seq_len=seq_len,
                       vocab_size=VOCAB, global_batch=4)


def _flip(path: pathlib.Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x55
    path.write_bytes(bytes(raw))


def test_data_errors_are_bad_input():
    """DataError is a ConfigError: the driver's bad-input path (exit 2) and the task check
    carry it with its setting and fix."""
    assert issubclass(DataError, ConfigError)


def test_missing_and_truncated_shards_are_named(copy_of):
    """Every missing or truncated shard is listed, with the fix (restore or prepare again)."""
    data = copy_of("bin")
    m = load(str(data))
    (data / m.shards[0].path).unlink()
    last = data / m.shards[-1].path
    last.write_bytes(last.read_bytes()[:-10])
    with pytest.raises(DataError) as err:
        verify(str(data))
    msg = str(err.value)
    assert f"shard {m.shards[0].path}: missing" in msg
    assert f"shard {m.shards[-1].path}: {m.shards[-1].bytes - 10} bytes" in msg
    assert "restore the listed files" in msg and "prepare" in msg
    with pytest.raises(DataError, match="missing"):
        _open(data)


@pytest.mark.parametrize("level", ("full", "quick"))
def test_a_changed_shard_fails_the_checksum(copy_of, level):
    """One flipped byte (same size) fails the full hash; at a shard's edge, the quick one too."""
    data = copy_of("arrayrecord")
    m = load(str(data))
    _flip(data / m.shards[1].path, 100)
    with pytest.raises(DataError, match=f"shard {m.shards[1].path}: checksum"):
        verify(str(data), level=level)


def test_a_changed_or_other_tokenizer_is_refused(copy_of):
    """An edited tokenizer.json, or data of another tokenizer than the run expects."""
    data = copy_of("bin")
    m = load(str(data))
    with pytest.raises(DataError, match="not the tokenizer this run expects"):
        _open(data, tokenizer_sha256="0" * 64)
    with pytest.raises(DataError, match="not the tokenizer this run expects"):
        _open(data, verify="off", tokenizer_sha256="0" * 64)
    assert _open(data, tokenizer_sha256=m.tokenizer.sha256).n == m.records
    tok = data / "tokenizer.json"
    tok.write_text(tok.read_text().replace("<|endoftext|>", "<|end|>"))
    with pytest.raises(DataError, match=r"tokenizer tokenizer\.json: checksum"):
        verify(str(data))


def test_no_or_a_garbled_manifest_names_prepare(copy_of, tmp_path):
    """A directory prepare never finished (no manifest), or a garbled one."""
    with pytest.raises(DataError, match=r"has no manifest\.json") as err:
        _open(tmp_path / "empty")
    assert "python -m orchestrator.data prepare" in err.value.fix
    data = copy_of("npy")
    (data / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="not a valid manifest"):
        _open(data)


def test_a_corrupt_record_found_while_reading_names_its_shard(copy_of):
    """With verify off, a corrupted ArrayRecord chunk and an out-of-vocabulary token in a .bin
    fail the read that meets them, naming the record and shard (never a garbage batch)."""
    data = copy_of("arrayrecord")
    m = load(str(data))
    _flip(data / m.shards[0].path, 300)
    where = re.escape(f"of {data / m.shards[0].path} cannot be read")
    with _open(data, verify="off", shuffle=False, prefetch_steps=0) as src, \
            pytest.raises(DataError, match=where):
        for step in range(m.shards[0].records // 4 + 1):
            src.rows(0, step, range(4))
    data = copy_of("bin")
    m = load(str(data))
    shard = data / m.shards[0].path
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[5 * SEQ_LEN + 3] = 60000
    tokens.tofile(shard)
    with _open(data, verify="off", shuffle=False) as src:
        src.rows(0, 0, range(4))
        with pytest.raises(DataError, match=r"record 5 of .* token id 60000 outside"):
            src.rows(0, 1, range(4))


def test_a_model_that_cannot_take_the_data_is_refused(datasets):
    """ArrayRecord records of another length, a vocabulary larger than the model's, a
    sequence longer than any shard: refused naming model.seq_len / model.vocab_size."""
    with pytest.raises(DataError, match=r"model\.seq_len") as err:
        _open(datasets["arrayrecord"], seq_len=SEQ_LEN * 2)
    assert f"--seq-len {SEQ_LEN * 2}" in err.value.fix
    with pytest.raises(DataError, match=r"model\.vocab_size"):
        open_source(DataSettings(dir=datasets["bin"]), seq_len=SEQ_LEN, vocab_size=VOCAB // 2,
                    global_batch=4)
    with pytest.raises(DataError, match="longer than the largest shard"):
        _open(datasets["bin"], seq_len=10**7)


def test_remote_arrayrecord_is_refused_before_any_network(datasets):
    """ArrayRecord shards on gs:// are refused with the fix (a FUSE mount, or --format bin)."""
    from workers.input.records import ArrayRecordTokens, ShardSpec

    with pytest.raises(DataError, match="local paths only") as err:
        ArrayRecordTokens([ShardSpec("gs://bucket/shard-00000.arrayrecord", 10)],
                          dtype="uint16", seq_len=SEQ_LEN, vocab_size=VOCAB)
    assert "--format bin" in err.value.fix


def test_a_stalled_read_fails_within_its_timeout():
    """A prefetched read that never returns is a DataError after read_timeout_s, not a hang."""
    release = threading.Event()

    def read(seed, step, start, stop):
        if step > 0:
            release.wait(30)
        return step

    ahead = ReadAhead(read, steps=1, threads=1, timeout_s=0.3)
    try:
        assert ahead.get(0, 0, 0, 4) == 0
        with pytest.raises(DataError, match="took longer than"):
            ahead.get(0, 1, 0, 4)
    finally:
        release.set()
        ahead.close()


def test_settings_are_validated():
    """DataSettings refuses bad values naming task.data.<field>."""
    with pytest.raises(ConfigError, match=r"task\.data\.verify"):
        DataSettings(dir="/x", verify="sometimes")
    with pytest.raises(ConfigError, match=r"task\.data\.tokenizer_sha256"):
        DataSettings(dir="/x", tokenizer_sha256="abc")
    with pytest.raises(ConfigError, match=r"task\.data\.read_threads"):
        DataSettings(dir="/x", read_threads=0)
    with pytest.raises(ConfigError, match=r"task\.data\.dir"):
        DataSettings(dir=" ")
