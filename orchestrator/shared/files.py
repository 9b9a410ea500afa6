"""Files that a crash must not leave half-written, and JSON-lines files that a crash may tear.

One implementation each, for the driver, the hosts, the tools and the bench:

- ``atomic_write_bytes/text/json``: write a private temp file beside the target, then rename it
  over the target (or link it, to create only when absent), so a reader sees the old file or the
  new one, never a part. ``fsync`` where the caller needs the content durable before it goes
  on (it acknowledges something, or others rely on the file); the temp file is removed if
  anything fails. ``mode`` is the new file's permission bits (before the umask), set at creation
  so a secret is never readable by others, not even briefly.
- ``read_jsonl``: the JSON objects of a JSON-lines file; a line a crash cut short (the last one
  of a live or killed writer, or the first one of a tail read) is skipped, unless ``strict``.
- ``jsonl_line`` / ``append_jsonl``: one object per line, appended whole.
- ``open_append``: what every append (a log, a JSON-lines file) opens with.
- ``read_private``: what a secret kept in a run directory is read with.

Nothing here writes through a symbolic link (issue 49): others may write a run directory or a
bucket, and a link planted at a name we write would make us write into whatever it names (the
executables key, a config). A rename replaces the link itself, and appends are opened with
``O_NOFOLLOW``; a link, a hard-linked file or a non-file at the name is ``UnsafeFile``. A
secret is read the same way, and only from a private file of this user (``read_private``).

Standard library only (``orchestrator.shared`` is neutral ground, tests/test_import_direction.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any


class UnsafeFile(OSError):
    """A name we write holds a symbolic link, a file with other names or not a file: someone
    else may have put it there to have us write elsewhere (or, for a secret we read, to have
    us use one they know). ``message`` and ``fix`` as the project's errors have them
    (``orchestrator.main.explain``); given, they replace the ones for a write."""

    def __init__(self, path: str | Path, what: str, message: str | None = None,
                 fix: str | None = None) -> None:
        self.what = what
        self.message = message or (
            f"{path} is {what}; the orchestrator never writes through one (whoever can write "
            "its directory could point it at a key or a config)")
        self.fix = fix or (f"remove {path} (`rm {path}`: nothing of the run is lost, it is "
                           "written afresh) and let only the run's user write its directory")
        super().__init__(errno.ELOOP, f"{self.message}. Fix: {self.fix}", str(path))

    def __str__(self) -> str:
        return self.strerror or self.message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across actors (OSError's would not be)
        return (type(self), (self.filename, self.what, self.message, self.fix))


def atomic_write_bytes(path: str | Path, data: bytes, *, fsync: bool = False,
                       mode: int = 0o666, overwrite: bool = True) -> bool:
    """Put ``data`` at ``path`` in one step. ``overwrite`` False: only if ``path`` does not
    exist yet (two racing writers agree on the first one's file); returns False when it did.
    Raises OSError as the filesystem does; no temp file is left behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    placed = False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
            placed = True
            return True
        try:
            os.link(tmp, path)  # fails when the file exists: the one there stands
        except FileExistsError:
            return False
        return True
    finally:
        if not placed:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str, *, fsync: bool = False, mode: int = 0o666,
                      overwrite: bool = True) -> bool:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync, mode=mode,
                              overwrite=overwrite)


def atomic_write_json(path: str | Path, value: Any, *, fsync: bool = False, mode: int = 0o666,
                      **dumps: Any) -> bool:
    """``atomic_write_text`` of ``json.dumps(value, **dumps)`` (indent, sort_keys, default...)."""
    return atomic_write_text(path, json.dumps(value, **dumps), fsync=fsync, mode=mode)


def read_jsonl(path: str | Path, *, tail_bytes: int | None = None, strict: bool = False,
               on_skip: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``path``, in order; nothing if it does not exist (other OSErrors
    propagate). ``tail_bytes``: only the last that many bytes, less a first line they cut.
    A line that is not a JSON object (a torn write, garbage) is skipped and ``on_skip`` called;
    ``strict``: ValueError naming the line instead. Bytes that are not UTF-8 are replaced."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; a generator holds it
    except FileNotFoundError:
        return
    with fh:
        if tail_bytes is not None:
            size = fh.seek(0, os.SEEK_END)
            if size > tail_bytes:
                fh.seek(size - tail_bytes - 1)
                if fh.read(1) != b"\n":
                    fh.readline()  # the cut first line
            else:
                fh.seek(0)
        for n, raw in enumerate(fh, start=1):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except ValueError:
                value = None
            if isinstance(value, dict):
                yield value
                continue
            if strict:
                raise ValueError(f"{path}: line {n} is not a JSON object: {line[:80]!r}")
            if on_skip is not None:
                on_skip()


def jsonl_line(record: Mapping[str, Any], **dumps: Any) -> str:
    """``record`` as one JSON-lines line (newline included); ``dumps`` as for ``json.dumps``
    (no ``indent``: a line holds one object)."""
    if dumps.get("indent") is not None:
        raise ValueError("a JSON-lines record cannot be indented")
    return json.dumps(record, **dumps) + "\n"


def append_jsonl(path: str | Path, record: Mapping[str, Any] | str, *, fsync: bool = False,
                 **dumps: Any) -> int:
    """Append one record (or a line from ``jsonl_line``) to ``path`` in one write; returns the
    bytes written. ``fsync``: durable before returning."""
    line = record if isinstance(record, str) else jsonl_line(record, **dumps)
    data = line.encode("utf-8")
    with open_append(path, binary=True) as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    return len(data)


def open_append(path: str | Path, *, binary: bool = False, truncate: bool = False,
                mode: int = 0o666) -> IO[Any]:
    """``path`` opened to append (created with ``mode`` when absent; ``truncate``: emptied
    first), text in UTF-8 unless ``binary``. Never through a symbolic link, into a file that
    has other names (a hard link) or into anything but a regular file (a FIFO would block):
    ``UnsafeFile``. Other OSErrors as the filesystem raises them."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
             | os.O_CLOEXEC)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise UnsafeFile(path, "a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise UnsafeFile(path, "not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, "not a regular file")
        if st.st_nlink > 1:
            raise UnsafeFile(path, f"a file with {st.st_nlink} names (a hard link)")
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab" if binary else "a", **({} if binary else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


FUSE_SUPER_MAGIC = 0x65735546  # statfs f_type of every FUSE filesystem (GCS FUSE among them)


def read_private(path: str | Path, *, fix: str) -> bytes | None:
    """The bytes of ``path``, a secret of this user's; None when there is none. ``UnsafeFile``
    (with ``fix``) when the name holds a symbolic link, anything but a regular file, a file
    with other names, or a file another user owns or its group or others may read or write:
    someone else chose its text, or knows it. Owner and mode are checked where the filesystem
    keeps them; on FUSE (the runs bucket's GCS FUSE mount) every file shows the mount's owner
    and mode, which tell nothing (there, who may read the bucket decides)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise _unsafe_secret(path, "a symbolic link", fix) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        if (what := _not_private(os.fstat(fd), fd)) is not None:
            raise _unsafe_secret(path, what, fix)
        return fh.read()


def _not_private(st: os.stat_result, fd: int) -> str | None:
    """Why the open file ``fd`` (its ``st``) is no private file of this user, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return f"a file with {st.st_nlink} names (a hard link)"
    if _on_fuse(fd):
        return None
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if (mode := stat.S_IMODE(st.st_mode)) & 0o077:
        return f"open to its group or others (mode {mode:04o})"
    return None


def _unsafe_secret(path: str | Path, what: str, fix: str) -> UnsafeFile:
    return UnsafeFile(path, what, message=(
        f"{path} is {what}; a secret is read only from a private file of the run's user "
        "(whoever else put it there or can read it could know it)"), fix=fix)


def _on_fuse(fd: int) -> bool:
    """Whether open file ``fd`` lies on a FUSE filesystem; False where that cannot be told
    (another OS): the owner and mode checks then apply."""
    return fs_type(fd) == FUSE_SUPER_MAGIC


def fs_type(fd: int) -> int | None:
    """The ``f_type`` (magic number) of the filesystem holding open file ``fd`` (Linux
    ``fstatfs``), or None where it cannot be asked."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: libc's
        buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field
        if libc.fstatfs(fd, buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return ctypes.c_long.from_buffer(buf).value


def holder(path: str | Path, dirs: Iterable[str | Path]) -> Path | None:
    """The first of ``dirs`` that holds ``path`` (or is it), or None. Each is compared as
    written (made absolute) and with its links resolved, both ways: a path that only *leads*
    through a directory (a link inside it pointing out) is held by it too, since whoever writes
    the directory can change where it leads."""
    mine = {Path(os.path.abspath(path)), Path(os.path.realpath(path))}
    for d in dirs:
        theirs = {Path(os.path.abspath(d)), Path(os.path.realpath(d))}
        if any(p == t or t in p.parents for p in mine for t in theirs):
            return Path(d)
    return None
