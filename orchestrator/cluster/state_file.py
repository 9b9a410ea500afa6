"""Reading the cluster tool's own files (cluster.json, the token) only when they are this user's.

cluster.json names a URL, a token file and process groups: ``status`` sends the token file's
text as a Bearer token to that URL and ``down`` kills those groups. So a state file is read
only when it is a regular file (no link), owned by this user and not writable by group or others;
anything else is refused with a LocalClusterError naming the file and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.cluster.errors import LocalClusterError

MAX_BYTES = 1 << 20


def read_own_text(path: Path, what: str) -> str | None:
    """The text of ``path``; None if it does not exist; LocalClusterError if it is not this
    user's own file (module docstring). ``what`` names it in the message."""
    fix = (f"if {path} is yours, `chmod go-w {path}`; if not, remove it (or use your own "
           "--state-dir) and start your own cluster with `python -m orchestrator.cluster up`")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise LocalClusterError(f"{what} {path} is {kind}; refusing to use it", fix=fix) from None
    with os.fdopen(fd, "rb") as fh:
        problem = _problem(os.fstat(fh.fileno()))
        if problem is not None:
            raise LocalClusterError(f"{what} {path} {problem}: the URL, token and processes it "
                                    "names are not trusted", fix=fix)
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise LocalClusterError(f"{what} {path} is over {MAX_BYTES} bytes", fix=fix)
    return data.decode("utf-8", "replace")


def _problem(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if (mode := stat.S_IMODE(st.st_mode)) & 0o022:
        return f"is writable by others (mode {mode:04o})"
    return None
