"""The local cluster tool trusts only its own user's state files (issue 49, finding 6).

cluster.json names a URL, a token file and process groups: `status` sent the named file's text as
a Bearer token to the named URL, and `down` killed the named groups, whoever wrote it. Driven as
the other local user would: a cluster.json of another uid (the test runs as root and gives it to
nobody), or one others can write, pointing at a listening server of ours and at a live process
group of ours. What must hold: nothing is sent, nothing is killed, exit 2 with the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from orchestrator.cluster.__main__ import main

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="making another user's file needs root")


@pytest.fixture
def listener() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A job-API look-alike on loopback that records every request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            body = b'{"data": {"summary": []}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def plant(state_dir: Path, url: str, token_path: Path, pgid: int = 0, *, uid: int | None = 65534,
          mode: int = 0o644) -> None:
    """A cluster.json as the other user writes it (owner ``uid``, ``mode``)."""
    state_dir.mkdir(exist_ok=True)
    path = state_dir / "cluster.json"
    path.write_text(json.dumps({
        "url": url, "gcs_address": "127.0.0.1:1", "temp_dir": str(state_dir / "nothing"),
        "token_path": str(token_path), "auth": True, "shape": {},
        "nodes": [{"name": "head", "pid": pgid, "log": ""}] if pgid else []}))
    path.chmod(mode)
    if uid is not None:
        os.chown(path, uid, uid)


@pytest.mark.parametrize("uid,mode,why", ids=["other-uid", "0666", "0664"], argvalues=[
    (65534, 0o644, "owned by uid 65534"),
    (None, 0o666, "writable by others (mode 0666)"),
    (None, 0o664, "writable by others (mode 0664)"),
])
def test_status_sends_no_token_where_a_foreign_state_file_points(tmp_path, capsys, listener,
                                                                 uid, mode, why):
    """`status` with a planted cluster.json naming our secret file and a URL: no request is
    made, exit 2 naming the file, the problem and the fix."""
    url, seen = listener
    secret = tmp_path / "my-secret"
    secret.write_text("hunter2\n")
    plant(tmp_path / "state", url, secret, uid=uid, mode=mode)
    assert main(["--state-dir", str(tmp_path / "state"), "status"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert seen == [] and why in err and "cluster.json" in err and "Fix:" in err


def test_down_kills_no_process_group_a_foreign_state_file_lists(tmp_path, capsys, listener):
    """`down` with a planted cluster.json listing a live process group: it lives on."""
    url, _ = listener
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        plant(tmp_path / "state", url, tmp_path / "token", pgid=victim.pid)
        assert main(["--state-dir", str(tmp_path / "state"), "down"]) == 2
        assert victim.poll() is None
        assert "owned by uid 65534" in " ".join(capsys.readouterr().err.split())
        assert (tmp_path / "state" / "cluster.json").exists()
    finally:
        victim.kill()
        victim.wait()


def test_a_token_file_of_another_user_is_not_sent(tmp_path, capsys, listener):
    """Our own cluster.json whose token file is not ours: refused before any request."""
    url, seen = listener
    token = tmp_path / "token"
    token.write_text("theirs\n")
    os.chown(token, 65534, 65534)
    plant(tmp_path / "state", url, token, uid=None, mode=0o600)
    assert main(["--state-dir", str(tmp_path / "state"), "status"]) == 2
    assert seen == [] and "the token file" in capsys.readouterr().err
