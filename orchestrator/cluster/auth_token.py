"""The local cluster's auth token file: written for this user alone, never through a link."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from orchestrator.cluster.errors import LocalClusterError


def write_token(path: Path) -> None:
    """A fresh token in ``path``, readable by this user alone.

    Created exclusively with mode 0600, never through a symbolic link. A file there already (a
    crashed ``up``) is rewritten only when it is a regular file of this user with mode 0600;
    anything else could be read, or be a link to a file of someone else's, so it is refused."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = _open_own_token(path, flags)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)  # the umask may have taken bits; 0600 exactly
        fh.truncate(0)
        fh.write(secrets.token_hex(32) + "\n")


def _open_own_token(path: Path, flags: int) -> int:
    fix = f"remove {path} and run `python -m orchestrator.cluster up` again"
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        kind = "a symbolic link" if os.path.islink(path) else f"not writable ({exc.strerror})"
        raise LocalClusterError(f"the token file {path} is {kind}; refusing to write the "
                                "cluster's token through it", fix=fix) from None
    if (problem := _token_problem(os.fstat(fd))) is not None:
        os.close(fd)
        raise LocalClusterError(f"the token file {path} {problem}; refusing to write the "
                                "cluster's token there", fix=fix)
    return fd


def _token_problem(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if (mode := stat.S_IMODE(st.st_mode)) != 0o600:
        return f"has mode {mode:04o}, not 0600"
    return None
