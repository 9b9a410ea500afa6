"""Who may write the executable store, and how a stored file proves it came from one of them.

Loading a stored executable unpickles it, so a file in the store is code that runs on every host
that loads it; the store itself (``RUN_DIR/executables`` on the runs bucket, or a directory
shared between runs) can be written by others. So every file carries an HMAC-SHA256 over its
header and body, made with a key kept outside the store, and a file whose MAC does not verify is
never unpickled. Where the filesystem can tell, a store or file that someone else could have
written is refused before it is read.

The key: the file named by ``$TPU_ORCH_EXECUTABLES_KEY`` (on GKE a Kubernetes Secret mounted
read-only, deploy/kuberay), else ``~/.config/tpu-orchestrator/executables.key``, created here on
first use (exclusively, mode 0600). Only its path travels (``HostSpec.executables_key``); the key
is never logged. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from orchestrator.shared.files import atomic_write_text
from orchestrator.shared.host_env import ENV_KEY

MIN_KEY_BYTES = 32
MAC_HEX = 64
"""An HMAC-SHA256 in hex."""


class Untrusted(Exception):
    """A key, store or file that must not be used; the message says why and names the fix."""


def load_key(path: str | Path, *, create: bool = True) -> bytes:
    """The key in ``path``; with ``create``, a fresh random one written there when absent.

    Refused (``Untrusted``) when the file is not a regular file, is owned by neither this user
    nor root, or others could write or read it: with this user as owner nothing but the owner
    may have access (0600, 0400); a root-owned file (a Kubernetes Secret mounted with
    ``fsGroup``) may be readable by its group, never writable by it or open to others.
    """
    path = Path(path)
    if create and not path.exists():
        try:
            _create_key(path)
        except OSError as exc:
            raise Untrusted(f"executables key {path} is missing and cannot be created "
                            f"({exc.strerror}); fix: create it (`umask 077; openssl rand -hex "
                            f"32 > {path}`), mount its Secret, or point ${ENV_KEY} at a "
                            "writable place") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise Untrusted(f"executables key {path} cannot be read ({exc.strerror}); fix: create it "
                        f"(`umask 077; openssl rand -hex 32 > {path}`) or point ${ENV_KEY} at "
                        "a readable key file") from None
    try:
        st = os.fstat(fd)
        if (problem := _key_file_problem(st)) is not None:
            raise Untrusted(f"executables key {path} {problem}")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < MIN_KEY_BYTES:
        raise Untrusted(f"executables key {path} holds {len(data)} bytes, fewer than "
                        f"{MIN_KEY_BYTES}; fix: write a longer one (`openssl rand -hex 32`)")
    return data


def _key_file_problem(st: os.stat_result) -> str | None:
    uid = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file; fix: point $TPU_ORCH_EXECUTABLES_KEY at a key file"
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        allowed = 0o700
    elif st.st_uid == 0:
        allowed = 0o750
    else:
        return (f"is owned by uid {st.st_uid}, not by this user ({uid}) or root; fix: use a key "
                "file of your own (mode 0600)")
    if mode & 0o022:
        return f"is writable by others (mode {mode:04o}); fix: chmod go-w and replace the key"
    if mode & ~allowed:
        return (f"is open to others (mode {mode:04o}); fix: chmod 600 and replace the key "
                "(others may have read it)")
    return None


def _create_key(path: Path) -> None:
    """Write a fresh key to ``path`` atomically: a private temp file linked into place, so two
    processes racing here agree on one key and no reader ever sees half of one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # linked, not renamed: when another process won the race, its key stands
    atomic_write_text(path, secrets.token_hex(MIN_KEY_BYTES) + "\n", fsync=True, mode=0o600,
                      overwrite=False)


def sign(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts`` (concatenated) under ``key``, in hex."""
    return sign_chunks(key, parts)


def sign_chunks(key: bytes, chunks: Iterable[bytes]) -> bytes:
    """``sign`` of chunks taken one at a time: a body read in pieces is checked without ever
    being held whole."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for chunk in chunks:
        mac.update(chunk)
    return mac.hexdigest().encode()


def verify(key: bytes, mac: bytes, *parts: bytes) -> bool:
    """Whether ``mac`` is ``sign(key, *parts)`` (constant-time)."""
    return verify_chunks(key, mac, parts)


def verify_chunks(key: bytes, mac: bytes, chunks: Iterable[bytes]) -> bool:
    """``verify`` of chunks taken one at a time (``sign_chunks``)."""
    return hmac.compare_digest(sign_chunks(key, chunks), mac)


def writable_by_others(st: os.stat_result) -> str | None:
    """Why a store directory or file with this ``stat`` could have been written by someone
    other than this user (or root), or None when the filesystem says it could not."""
    uid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (uid, 0):
        return f"is owned by uid {st.st_uid}, not by this user ({uid})"
    if mode & 0o022:
        return f"is writable by its group or others (mode {mode:04o})"
    return None


def store_problem(root: Path) -> str | None:
    """Why the store directory ``root`` must not be used, or None (also None when it does not
    exist yet: it is created private)."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"store {root} cannot be inspected ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"store {root} is not a directory"
    if (why := writable_by_others(st)) is not None:
        return (f"store {root} {why}: anyone who can write it could plant an executable; fix: "
                f"chmod go-w {root} (and own it), or set compile.dir to a private directory")
    return None
