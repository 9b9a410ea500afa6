"""Where data lives: local paths and ``gs://`` through fsspec (``gcsfs`` for Cloud Storage).

Why fsspec and not ``etils.epath`` (which Orbax uses for checkpoints): the input pipeline reads
samples at random, a few KiB each, so the one operation that matters is a ranged read of exactly
``[start, end)``. fsspec has it (``cat_file(path, start, end)``: one Cloud Storage range request,
no read-ahead buffer to throw away), plus ``info`` for sizes, and it is what ``epath`` itself
delegates ``gs://`` to when TensorFlow is absent; with TensorFlow installed ``epath`` silently
switches to ``tf.io.gfile``, a second code path we would not test. Local files are memory-mapped
(``numpy.memmap``) instead: the page cache serves repeated epochs. Orbax keeps ``epath``; both
end in the same gcsfs client for ``gs://``.

Standard library and fsspec only (no JAX): the driver verifies data with it before any host
starts.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any

from orchestrator.shared.errors import DataError

CHUNK = 8 << 20
EDGE = 64 << 10
"""Bytes hashed at each end of a shard for the quick check (``edge_sha256``)."""


def filesystem(path: str, *, setting: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path within it)`` for a local path or URL."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as exc:
        raise DataError(setting, f"{path!r} needs a filesystem package that is not installed "
                        f"({exc})", "pip install gcsfs (for gs://), or copy the data to a "
                        "local path") from exc
    except ValueError as exc:
        raise DataError(setting, f"{path!r} is not a path fsspec can open ({exc})",
                        "give a local path or a gs://bucket/dir URL") from exc


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def join(base: str, name: str) -> str:
    """``name`` relative to ``base`` (a local directory or a URL)."""
    if "://" in base:
        return base.rstrip("/") + "/" + name
    return os.path.join(base, name)


def relative(base: str, path: str) -> str:
    return posixpath.relpath(path, base) if "://" in base else os.path.relpath(path, base)


def size(fs: Any, path: str) -> int:
    return int(fs.info(path)["size"])


def read_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (one ranged read)."""
    return fs.cat_file(path, start=start, end=end)


def sha256(fs: Any, path: str) -> str:
    """The whole file's SHA-256, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def edge_sha256(fs: Any, path: str, nbytes: int) -> str:
    """SHA-256 of the first and last ``EDGE`` bytes and the size: a cheap check that a large
    shard is the one the manifest lists (catches replaced, truncated and appended files)."""
    h = hashlib.sha256(str(nbytes).encode())
    h.update(read_range(fs, path, 0, min(EDGE, nbytes)))
    h.update(read_range(fs, path, max(0, nbytes - EDGE), nbytes))
    return h.hexdigest()
