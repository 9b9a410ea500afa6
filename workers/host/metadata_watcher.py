"""GCE metadata watcher run inside each host actor: preemption and maintenance notices.

Long-polls ``instance/preempted`` and ``instance/maintenance-event`` with ``wait_for_change=true``
and the last ETag (so no change is missed between two polls), sending ``Metadata-Flavor: Google``
and refusing answers that lack it (a proxy or a captive portal is not the metadata server). A
change to a notice value calls ``callback`` with an event dict in the orchestrator's own schema
(docs/events.md, schema_version 1); the driver feeds it to the intake. ``maintenance-event``
values: ``TERMINATE_ON_HOST_MAINTENANCE`` (or ``SHUTDOWN_...``: Google's sources disagree) is a
maintenance notice with ``maintenance_notice_s``; ``MIGRATE_ON_HOST_MAINTENANCE`` is a live
migration: noted, never a drain with an invented deadline (the VM keeps running).

Pure standard library, no JAX: it runs in a thread of the actor and must never take it down, so
every error (unreachable, 503, garbage) is logged and retried with capped exponential backoff.
``stop()`` closes the in-flight connection, so it returns promptly even mid long-poll.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_ENDPOINT = "http://metadata.google.internal/computeMetadata/v1"
PREEMPTED_KEY = "instance/preempted"
MAINTENANCE_KEY = "instance/maintenance-event"
ID_KEY = "instance/id"
NAME_KEY = "instance/name"
MIGRATE_VALUES = ("MIGRATE_ON_HOST_MAINTENANCE",)
_DMI_FILES = ("/sys/class/dmi/id/product_name", "/sys/class/dmi/id/bios_vendor")


class MetadataError(Exception):
    """One failed request (retried by the watcher, never raised out of it)."""


def on_gce(dmi_files: tuple[str, ...] = _DMI_FILES) -> bool:
    """GCE VMs (TPU VMs included) report "Google" in their DMI data; no network needed."""
    for name in dmi_files:
        with contextlib.suppress(OSError):
            if "google" in Path(name).read_text(errors="replace").lower():
                return True
    return False


def should_watch(enabled: str, *, detect: Callable[[], bool] = on_gce) -> bool:
    """``on``/``off`` force it; ``auto`` watches only on GCE."""
    if enabled == "on":
        return True
    if enabled == "off":
        return False
    if enabled == "auto":
        return detect()
    raise ValueError(f"events.metadata.enabled must be auto, on or off, not {enabled!r}")


class MetadataWatcher:
    """Two long-poll threads (preempted, maintenance-event) reporting notices via ``callback``."""

    def __init__(
        self, *, callback: Callable[[dict[str, Any]], None], host: str,
        slice_name: str | None = None, job: str | None = None, host_kind: str | None = None,
        endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 60.0,
        backoff_initial_s: float = 1.0, backoff_max_s: float = 30.0,
        preemption_notice_s: float = 30.0, maintenance_notice_s: float = 60.0,
        clock: Callable[[], float] = time.time, **_ignored: Any,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"metadata endpoint {endpoint!r} is not an http(s) URL; "
                             "set events.metadata.endpoint like " + DEFAULT_ENDPOINT)
        self._scheme = parts.scheme
        self._netloc = parts.netloc
        self._base_path = parts.path.rstrip("/")
        self._callback = callback
        self.host = host
        self.host_kind = host_kind
        self.slice_name = slice_name
        self.job = job
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.notice_s = {PREEMPTED_KEY: preemption_notice_s,
                         MAINTENANCE_KEY: maintenance_notice_s}
        self._clock = clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._lock = threading.Lock()
        self.errors = 0
        self.emitted = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._stop.clear()
        for key in (PREEMPTED_KEY, MAINTENANCE_KEY):
            thread = threading.Thread(target=self._watch, args=(key,), daemon=True,
                                      name=f"metadata-watch-{key.rsplit('/', 1)[-1]}")
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop both threads; closes in-flight connections so long-polls end now."""
        self._stop.set()
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads = []

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # ------------------------------------------------------------------ polling
    def fetch(self, key: str, *, etag: str | None = None, wait: bool = False) -> tuple[str, str]:
        """One GET of ``key``: (value, etag). Raises MetadataError on any failure."""
        params: dict[str, str] = {}
        if wait:
            params["wait_for_change"] = "true"
            params["timeout_sec"] = str(max(1, int(self.timeout_s)))
            if etag:
                params["last_etag"] = etag
        path = f"{self._base_path}/{key}" + (f"?{urlencode(params)}" if params else "")
        conn_cls = (http.client.HTTPSConnection if self._scheme == "https"
                    else http.client.HTTPConnection)
        conn = conn_cls(self._netloc, timeout=self.timeout_s + 10 if wait else 10)
        try:
            conn.connect()
            # register, then re-check stop: stop() sets the flag before it reads the registry,
            # so either it sees this connection or we see the flag (no missed long-poll)
            with self._lock:
                self._conns[key] = conn
            if self._stop.is_set():
                raise MetadataError("stopping")
            conn.request("GET", path, headers={"Metadata-Flavor": "Google"})
            resp = conn.getresponse()
            body = resp.read(64 * 1024)
            if resp.status != 200:
                raise MetadataError(f"HTTP {resp.status} for {key}")
            if resp.getheader("Metadata-Flavor") != "Google":
                raise MetadataError(f"{self._netloc} answered without Metadata-Flavor: Google; "
                                    "it is not the metadata server")
            return body.decode("utf-8", "replace").strip(), resp.getheader("ETag") or ""
        except (OSError, http.client.HTTPException) as exc:
            raise MetadataError(f"{type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._conns.pop(key, None)
            conn.close()

    def _watch(self, key: str) -> None:
        etag: str | None = None
        last_value: str | None = None
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            try:
                value, new_etag = self.fetch(key, etag=etag, wait=etag is not None)
            except MetadataError as exc:
                if self._stop.is_set():
                    return
                self.errors += 1
                log.warning("metadata watch of %s failed (%s); retrying in %.1fs", key, exc, delay)
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.backoff_max_s)
                continue
            except Exception:  # never let the actor's thread die on a surprise
                self.errors += 1
                log.exception("metadata watch of %s crashed; retrying", key)
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.backoff_max_s)
                continue
            delay = self.backoff_initial_s
            if value != last_value:
                self._maybe_emit(key, value, new_etag)
                last_value = value
            etag = new_etag or etag or "0"

    def _maybe_emit(self, key: str, value: str, etag: str) -> None:
        event = self.event_for(key, value, etag)
        if event is None:
            return
        self.emitted += 1
        try:
            self._callback(event)
        except Exception:
            log.exception("metadata watcher callback failed for %s", key)

    # ------------------------------------------------------------------ events
    def event_for(self, key: str, value: str, etag: str) -> dict[str, Any] | None:
        """The event dict for a value, or None when the value is not a notice."""
        upper = value.strip().upper()
        if key == PREEMPTED_KEY:
            if upper != "TRUE":
                return None
            kind = "preemption_notice"
        elif key == MAINTENANCE_KEY:
            if upper in ("", "NONE"):
                return None
            kind = "live_migration" if upper in MIGRATE_VALUES else "maintenance_scheduled"
        else:
            return None
        now = self._clock()
        target: dict[str, Any] = {"job": self.job, "slice": self.slice_name, "host": self.host}
        if self.host_kind:
            target["host_kind"] = self.host_kind
        return {
            "schema_version": SCHEMA_VERSION,
            "id": f"metadata:{self.host}:{key.rsplit('/', 1)[-1]}:{upper}:{etag or int(now)}",
            "kind": kind,
            "target": target,
            "source": "metadata",
            "observed_at": now,
            "deadline": None if kind == "live_migration" else now + self.notice_s[key],
            "occurred_at": now,
            "incarnation": None,
            "message": f"{key} = {value[:200]}",
            "labels": {"metadata.key": key, "metadata.value": value[:200]},
            "raw": {"key": key, "value": value[:1024], "etag": etag},
        }


def start_watcher(settings: dict[str, Any], *, host: Any,
                  sink: Callable[[dict[str, Any]], None],
                  job: str | None = None) -> MetadataWatcher | None:
    """What the host actor calls: ``settings`` is the ``events.metadata`` section as a dict.

    Returns the running watcher, or None when it should not run here (``enabled: off``, or
    ``auto`` off GCE). Events name the host by its instance name (what GCE calls it) and carry
    its slice, so the intake can match them to the mesh (``HostRef.matches``).
    """
    opts = dict(settings)
    if not should_watch(str(opts.pop("enabled", "auto"))):
        return None
    instance = getattr(host, "instance", None)
    name = instance or str(getattr(host, "index", "")) or None
    if not name:
        raise ValueError("start_watcher needs a HostRef-like host with an instance name or index")
    watcher = MetadataWatcher(callback=sink, host=name, host_kind="instance" if instance else
                              "index", slice_name=getattr(host, "slice_name", None) or None,
                              job=opts.pop("job", None) or job, **opts)
    watcher.start()
    return watcher


def instance_identity(settings: dict[str, Any]) -> tuple[str, str] | None:
    """(numeric instance id, instance name) from this VM's metadata server, or None off GCE or
    on any error: what a host reports at start so events naming only the id can be targeted
    (``EventIntake.set_instance_ids``). ``settings`` is the ``events.metadata`` section."""
    opts = dict(settings)
    if not should_watch(str(opts.pop("enabled", "auto"))):
        return None
    opts.pop("job", None)
    try:
        probe = MetadataWatcher(callback=lambda _e: None, host="identity", **opts)
        instance_id, _ = probe.fetch(ID_KEY)
        name, _ = probe.fetch(NAME_KEY)
    except (MetadataError, ValueError) as exc:
        log.warning("metadata identity unavailable (%s); events naming only the instance id "
                    "cannot be targeted to this host", exc)
        return None
    return (instance_id, name) if instance_id and name else None


def put_bounded(sink: Any, event: dict, timeout_s: float) -> None:
    """``sink.put_nowait(event)``, but never longer than ``timeout_s`` (the host actor hands the
    watcher's events to the driver's queue with this): Ray's queue waits for its actor without
    a timeout, and a hung queue actor must not stop the metadata watcher.
    A put that times out may still land later; the intake drops the duplicate by event id."""
    done, failed = threading.Event(), []

    def put() -> None:
        try:
            sink.put_nowait(event)
        except Exception as exc:
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=put, name="notice-put", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"the driver's queue did not answer within {timeout_s:g} s")
    if failed:
        raise failed[0]
