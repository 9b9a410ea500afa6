"""A local HTTP server that behaves like the GCE metadata server for the watcher tests.

Honours ``wait_for_change`` with ``last_etag`` (hangs until the value changes or ``timeout_sec``),
sends ETag and ``Metadata-Flavor: Google``, refuses requests without that header (403), and can
be told to fail the next N requests with 503 or to leave out its flavor header.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"


class FakeMetadata:
    def __init__(self) -> None:
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self.etags = dict.fromkeys(self.values, 1)
        self.cond = threading.Condition()
        self.fail_next = 0
        self.send_flavor = True
        self.requests: list[dict] = []
        self.closing = False

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.values[key] = value
            self.etags[key] += 1
            self.cond.notify_all()

    def etag(self, key: str) -> str:
        return f"etag-{self.etags[key]}"


def _handler(state: FakeMetadata):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output quiet
            return

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            with state.cond:
                state.requests.append({"path": parts.path, "query": query,
                                       "flavor": self.headers.get("Metadata-Flavor")})
            if self.headers.get("Metadata-Flavor") != "Google":
                self._reply(403, "Missing Metadata-Flavor:Google header.", etag=None)
                return
            key = parts.path[len(PREFIX):] if parts.path.startswith(PREFIX) else None
            if key not in state.values:
                self._reply(404, "not found", etag=None)
                return
            with state.cond:
                if state.fail_next > 0:
                    state.fail_next -= 1
                    fail = True
                else:
                    fail = False
            if fail:
                self._reply(503, "unavailable", etag=None)
                return
            if query.get("wait_for_change") == "true":
                timeout = float(query.get("timeout_sec", "30"))
                with state.cond:
                    state.cond.wait_for(
                        lambda: state.closing or query.get("last_etag") != state.etag(key),
                        timeout=timeout)
            with state.cond:
                value, etag = state.values[key], state.etag(key)
            self._reply(200, value, etag=etag)

        def _reply(self, status: int, body: str, *, etag: str | None) -> None:
            data = body.encode()
            self.send_response(status)
            if state.send_flavor:
                self.send_header("Metadata-Flavor", "Google")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(data)

    return Handler


@contextlib.contextmanager
def fake_metadata_server() -> Iterator[tuple[str, FakeMetadata]]:
    """Yield (endpoint URL, state); the server and its threads are always shut down."""
    state = FakeMetadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/computeMetadata/v1", state
    finally:
        with state.cond:
            state.closing = True
            state.cond.notify_all()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
