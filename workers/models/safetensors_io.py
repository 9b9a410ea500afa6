"""The safetensors file format, read by offset and written one tensor at a time, bfloat16 included.

Why not ``safetensors.numpy``: it has no bfloat16 (Hugging Face Llama checkpoints are bfloat16),
and its ``save_file`` needs every array in memory at once. The format is small enough to own
(https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header length,
a JSON header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` plus an optional
``"__metadata__"`` of strings), then the tensors' bytes, C order, offsets relative to the end of
the header. Reading maps the file (``np.memmap``): a slice of a tensor reads only the pages
it covers, so a host loads only the part of a checkpoint it owns. Files written here are read
by ``safetensors.safe_open`` and by ``transformers`` (tests check the first).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from orchestrator.shared.errors import OrchestratorError

DTYPES: dict[str, Any] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_CODES = {v: k for k, v in DTYPES.items()}
_ALIGN = 8
_MAX_HEADER = 100 << 20


class SafetensorsError(OrchestratorError):
    """A file that is not a safetensors file this reader understands."""


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    """Byte offset of the tensor's data in the file (absolute)."""

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class SafetensorsFile:
    """One safetensors file, its header parsed; tensors read on demand."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries, self.metadata = _parse_header(self.path)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read(self, name: str, index: Any = ...) -> np.ndarray:
        """The tensor ``name`` (or ``tensor[index]``: only those bytes are read), as a new array."""
        return np.array(self.mapped(name)[index])

    def mapped(self, name: str) -> np.ndarray:
        """The tensor ``name`` mapped read-only, nothing read yet: a view of it (reshaped,
        transposed, sliced) reads only the pages it covers when copied."""
        e = self.entries[name]
        if e.nbytes == 0:
            return np.zeros(e.shape, e.dtype)
        return np.memmap(self.path, dtype=e.dtype, mode="r", offset=e.begin, shape=e.shape)


def _parse_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            (n,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            if not 0 < n <= _MAX_HEADER:
                raise ValueError(f"header length {n} is not a safetensors header's")
            header = json.loads(fh.read(n))
        size = path.stat().st_size
    except (OSError, ValueError) as exc:
        raise SafetensorsError(f"{path} is not a readable safetensors file ({exc}).",
                               fix="point at the checkpoint's .safetensors files as "
                                   "save_pretrained wrote them") from None
    metadata = header.pop("__metadata__", None) or {}
    entries = {}
    for name, info in header.items():
        code = info.get("dtype")
        if code not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has dtype {code}, which this "
                                   "reader does not take.",
                                   fix=f"convert the checkpoint to one of {', '.join(DTYPES)}")
        begin, end = info["data_offsets"]
        entry = Entry(name, DTYPES[code], tuple(int(d) for d in info["shape"]), 8 + n + begin)
        if end - begin != entry.nbytes or 8 + n + end > size:
            raise SafetensorsError(f"{path}: tensor {name}'s offsets do not fit its shape or "
                                   "the file (truncated?).",
                                   fix="copy the checkpoint file again")
        entries[name] = entry
    return entries, metadata


def write(path: str | Path, specs: Mapping[str, tuple[tuple[int, ...], Any]],
          produce: Callable[[str], np.ndarray] | Iterable[tuple[str, np.ndarray]],
          metadata: Mapping[str, str] | None = None) -> None:
    """Write ``specs`` (name -> (shape, dtype), in file order) to ``path``; each tensor's data
    comes from ``produce(name)`` (or the pairs it yields, in ``specs`` order) only when it is
    written, so at most one converted tensor is held at a time. A produced array whose shape or
    dtype is not its spec's is an error (the header is already written)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (shape, dtype) in specs.items():
        dt = np.dtype(dtype)
        if dt not in _CODES:
            raise SafetensorsError(f"{name}: dtype {dt} has no safetensors code",
                                   fix=f"cast to one of {', '.join(map(str, _CODES))}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        header[name] = {"dtype": _CODES[dt], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % _ALIGN)
    pairs = ((n, produce(n)) for n in specs) if callable(produce) else iter(produce)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for (name, (shape, dtype)), (got_name, arr) in zip(specs.items(), pairs, strict=True):
            if got_name != name or arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
                raise SafetensorsError(f"{path}: got {got_name} {arr.shape} {arr.dtype} where "
                                       f"{name} {tuple(shape)} {np.dtype(dtype)} was declared",
                                       fix="this is a bug in the writer's caller")
            fh.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
