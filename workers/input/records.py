"""Random-access token records: Grain data sources (``__len__``, ``__getitem__``) over flat token
files (``.bin``, ``.npy``) and ArrayRecord shards. Record ``i`` is a ``(seq_len,)`` int32
array; every read is checked (length, token ids below the vocabulary), so a corrupt record is a
``DataError`` naming the shard and the fix, never a silent garbage batch.

Thread-safe: the prefetch threads read concurrently (memory maps are opened once under a lock;
ranged reads hold no state).
"""

from __future__ import annotations

import bisect
import io
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.data import fs as fslib
from orchestrator.shared.errors import DataError

_NPY_HEADER_READ = 1 << 16
_TOKEN_DTYPES = ("uint16", "uint32", "int32")


@dataclass(frozen=True)
class ShardSpec:
    """One shard as the records layer needs it (from a manifest, or by looking at the file)."""

    path: str
    records: int
    tokens: int = 0
    header: int = 0
    """Bytes before the tokens (a ``.npy`` header)."""


def _check(rec: np.ndarray, *, seq_len: int, vocab_size: int | None, where: str,
           setting: str) -> np.ndarray:
    if rec.shape != (seq_len,):
        raise DataError(setting, f"{where} holds {rec.size} tokens, not {seq_len} (corrupt)",
                        "restore the shard, or re-run `python -m orchestrator.data verify` "
                        "and prepare again")
    if vocab_size is not None and rec.size and (int(rec.max()) >= vocab_size or
                                                int(rec.min()) < 0):
        raise DataError(setting, f"{where} holds token id {int(rec.max())} outside the "
                        f"vocabulary of {vocab_size} (corrupt, or another tokenizer)",
                        "restore the shard or prepare the data again; check that the "
                        "manifest's tokenizer is the model's")
    return rec.astype(np.int32, copy=False)


class _Index:
    """Record number → (shard number, record within the shard)."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.ends = list(itertools.accumulate(counts))
        self.total = self.ends[-1] if self.ends else 0

    def locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.total:
            raise IndexError(f"record {i} outside [0, {self.total})")
        k = bisect.bisect_right(self.ends, i)
        return k, i - (self.ends[k - 1] if k else 0)


class FlatTokens:
    """Flat token files cut into records of ``seq_len`` tokens: record ``j`` of a shard is its
    tokens ``[j·seq_len, (j+1)·seq_len)``; a tail shorter than a record is not read. Local
    files are memory-mapped, ``gs://`` ones read by range (``orchestrator/data/fs.py``)."""

    def __init__(self, shards: Sequence[ShardSpec], *, dtype: str, seq_len: int,
                 vocab_size: int | None, setting: str = "data.dir") -> None:
        if dtype not in _TOKEN_DTYPES:
            raise DataError(setting, f"token dtype {dtype!r} is not one of {_TOKEN_DTYPES}",
                            "store tokens as uint16 (vocabularies up to 65,536) or uint32")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.seq_len, self.vocab_size, self.setting = seq_len, vocab_size, setting
        self.shards = [ShardSpec(s.path, s.tokens // seq_len, s.tokens, s.header)
                       for s in shards]
        self.index = _Index([s.records for s in self.shards])
        self._maps: dict[int, Any] = {}
        self._fs: dict[int, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_files(cls, paths: Sequence[str], *, seq_len: int, dtype: str | None = None,
                   vocab_size: int | None = None, setting: str = "data.dir") -> FlatTokens:
        """Shards by looking at the files: ``.npy`` headers give dtype and length; ``.bin``
        files need ``dtype``."""
        specs, dtypes = [], set()
        for path in paths:
            fs, p = fslib.filesystem(path, setting=setting)
            try:
                if path.endswith(".npy"):
                    header, count, dt = _npy_header(fs, p, setting)
                    dtypes.add(dt)
                else:
                    if dtype is None:
                        raise DataError(setting, f"{path!r} is a flat token file without a "
                                        "header: its dtype is not known",
                                        "pass dtype='uint16' or 'uint32' (or use a manifest)")
                    header, count = 0, fslib.size(fs, p) // np.dtype(dtype).itemsize
            except FileNotFoundError:
                raise DataError(setting, f"token file {path!r} is missing",
                                "check the path, or restore the file") from None
            specs.append(ShardSpec(path, count // seq_len, count, header))
        if len(dtypes) > 1 or (dtypes and dtype is not None and dtypes != {dtype}):
            raise DataError(setting, f"the token files mix dtypes {sorted(dtypes)}",
                            "write every shard with one dtype")
        return cls(specs, dtype=dtype or dtypes.pop(), seq_len=seq_len,
                   vocab_size=vocab_size, setting=setting)

    def __len__(self) -> int:
        return self.index.total

    def __getitem__(self, i: int) -> np.ndarray:
        k, j = self.index.locate(int(i))
        shard = self.shards[k]
        where = f"record {j} of {shard.path}"
        try:
            rec = self._read(k, j * self.seq_len, (j + 1) * self.seq_len)
        except OSError as exc:
            raise DataError(self.setting, f"{where} cannot be read ({exc})",
                            "check that the shard exists and is readable; run `python -m "
                            "orchestrator.data verify` on the data directory") from exc
        return _check(rec, seq_len=self.seq_len, vocab_size=self.vocab_size, where=where,
                      setting=self.setting)

    def _read(self, k: int, start: int, stop: int) -> np.ndarray:
        if k not in self._fs:
            with self._lock:
                self._fs.setdefault(k, fslib.filesystem(self.shards[k].path,
                                                        setting=self.setting))
        fs, path = self._fs[k]
        shard = self.shards[k]
        if fslib.is_local(fs):
            if k not in self._maps:
                with self._lock:
                    if k not in self._maps:
                        self._maps[k] = np.memmap(path, dtype=self.dtype, mode="r",
                                                  offset=shard.header, shape=(shard.tokens,))
            return np.array(self._maps[k][start:stop])
        size = self.dtype.itemsize
        raw = fslib.read_range(fs, path, shard.header + start * size,
                               shard.header + stop * size)
        return np.frombuffer(raw, dtype=self.dtype)


def _npy_header(fs: Any, path: str, setting: str) -> tuple[int, int, str]:
    """(header bytes, token count, dtype) of a 1-D ``.npy`` token file."""
    head = io.BytesIO(fslib.read_range(fs, path, 0, _NPY_HEADER_READ))
    try:
        version = np.lib.format.read_magic(head)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(head)
    except ValueError as exc:
        raise DataError(setting, f"{path!r} is not a readable .npy file ({exc})",
                        "write token files with numpy.save") from exc
    if len(shape) != 1 or dtype.name not in _TOKEN_DTYPES:
        raise DataError(setting, f"{path!r} holds a {dtype} array of shape {shape}",
                        f"save a 1-D array of one of {_TOKEN_DTYPES}")
    return head.tell(), int(shape[0]), dtype.name


@dataclass(frozen=True)
class _FileInstruction:
    """ArrayRecord's ``FileInstruction`` protocol: the record count is known from the
    manifest, so no shard is opened until it is read."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


class ArrayRecordTokens:
    """ArrayRecord shards, one record per sequence (its tokens' bytes), read with Grain's
    ``ArrayRecordDataSource``. Local paths only: array_record opens files with its own C++
    layer, which fsspec cannot feed (mount a bucket with Cloud Storage FUSE, or use ``bin``)."""

    def __init__(self, shards: Sequence[ShardSpec], *, dtype: str, seq_len: int,
                 vocab_size: int | None, setting: str = "data.dir") -> None:
        import grain

        remote = [s.path for s in shards if "://" in s.path]
        if remote:
            raise DataError(setting, f"ArrayRecord shards are read from local paths only; "
                            f"{remote[0]!r} is remote",
                            "mount the bucket (Cloud Storage FUSE) and give the mount path, "
                            "or prepare the data with --format bin (read from gs:// directly)")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.seq_len, self.vocab_size, self.setting = seq_len, vocab_size, setting
        self.shards = list(shards)
        self.index = _Index([s.records for s in shards])
        for s in self.shards:
            if not fslib.filesystem(s.path, setting=setting)[0].exists(s.path):
                raise DataError(setting, f"ArrayRecord shard {s.path!r} is missing",
                                "restore it, or prepare the data again")
        self._source = grain.sources.ArrayRecordDataSource(
            [_FileInstruction(s.path, 0, s.records, s.records) for s in self.shards])

    def __len__(self) -> int:
        return self.index.total

    def __getitem__(self, i: int) -> np.ndarray:
        k, j = self.index.locate(int(i))
        where = f"record {j} of {self.shards[k].path}"
        try:
            raw = self._source[int(i)]
        except (RuntimeError, OSError, ValueError) as exc:
            raise DataError(self.setting, f"{where} cannot be read: {str(exc)[:300]}",
                            "restore the shard or prepare the data again (`python -m "
                            "orchestrator.data verify` lists every changed shard)") from exc
        if len(raw) % self.dtype.itemsize:
            raise DataError(self.setting, f"{where} has {len(raw)} bytes, not a whole number "
                            f"of {self.dtype.name} tokens (corrupt)",
                            "restore the shard or prepare the data again")
        rec = np.frombuffer(raw, dtype=self.dtype)
        return _check(rec, seq_len=self.seq_len, vocab_size=self.vocab_size, where=where,
                      setting=self.setting)
