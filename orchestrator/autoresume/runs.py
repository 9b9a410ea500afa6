"""Find a run's directory and submission metadata (RUN_DIR/run.json, written by the driver).

The registry scans configured globs each time it is asked: runs come and go, and the scan is a
few stat calls. A run matches by its ``run_id`` alone (a job name is not unique); two run
directories claiming the same id are refused as ambiguous. An operator stops autoresume for a run
by creating ``RUN_DIR/DO_NOT_RESUME`` (its text, if any, is the reason).

Two rules keep other writers of the runs area from steering a run (:func:`check_hold`,
:meth:`RunRegistry.find`):

* a ``DO_NOT_RESUME`` marker is honoured only if it is a regular file owned by the run's user
  (run.json's owner) in a run directory that others cannot write; a stray one (a symlink,
  another user's, or in a directory writable by others) is ignored, logged and audited, so
  it cannot keep the run down. On a bucket mounted by GCS FUSE every file shows the mount's
  user, so there this rule cannot tell writers apart: limit who may write the bucket.
* a submission id run.json records counts for the run only if no other run directory records
  it too (a run.json copied from another run, ids and all, claims nothing).

The scan reads every run.json under the globs for every alert, so one hostile file must not stop
autoresume for the others (:func:`read_run_json`, :meth:`RunRegistry.find`): run.json is read
only when it is a regular file (no link) owned by autoresume's own user, at most
``RUN_JSON_MAX_BYTES``, nested at most ``RUN_JSON_MAX_DEPTH`` levels; a run directory reached
through a link (its resolved path is not the path scanned) is skipped, so an alias of another
run's folder is no run; a run id ending in ``-r<digits>`` is another run's restart id, no run.
Any failure reading one run is logged with the run directory and that run is left out; the scan
goes on.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from orchestrator.events import bounded
from orchestrator.events.model import MalformedEvent
from orchestrator.shared.files import read_jsonl
from policies.autoresume import Heartbeat, restart_shaped

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What autoresume needs to resubmit a run faithfully."""

    run_id: str
    job: str
    run_dir: str
    entrypoint: tuple[str, ...]
    runtime_env: dict[str, Any] = field(default_factory=dict)
    incarnation: int = 0
    submission_ids: tuple[str, ...] = ()  # ids the driver recorded for itself, if any


HOLD_FILE = "DO_NOT_RESUME"
RUN_JSON_MAX_BYTES = 1 << 20  # the driver writes ~2 KiB
RUN_JSON_MAX_DEPTH = 16  # the driver's run.json nests 4 levels (runtime_env.config.x)


class RunMetadataError(ValueError):
    """run.json exists but cannot be used; ``reason`` goes to the audit log."""


class AmbiguousRunError(RunMetadataError):
    """Several run directories claim the same run id: autoresume acts on none of them."""


def _read_record(path: str, uid: int) -> bytes:
    """run.json's bytes, if it is a regular file of ``uid`` within the size limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise RunMetadataError(f"{path} is {kind}; only the driver's own file is read") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RunMetadataError(f"{path} is not a regular file")
        if st.st_uid != uid:
            raise RunMetadataError(
                f"{path} is owned by uid {st.st_uid}, not by autoresume's user (uid {uid}): "
                "another user's record is not resubmitted with the cluster's token. Fix: run "
                "the job as autoresume's user, or remove the stray run.json")
        if st.st_size > RUN_JSON_MAX_BYTES:
            raise RunMetadataError(f"{path} is {st.st_size} bytes, over the "
                                   f"{RUN_JSON_MAX_BYTES} a driver's run.json can be")
        data = fh.read(RUN_JSON_MAX_BYTES + 1)
    if len(data) > RUN_JSON_MAX_BYTES:
        raise RunMetadataError(f"{path} grew past {RUN_JSON_MAX_BYTES} bytes while read")
    return data


def read_run_json(run_dir: str, *, uid: int | None = None) -> RunRecord:
    """The record in RUN_DIR/run.json, read as the module docstring says (``uid``: the owner it
    must have, autoresume's own user by default); RunMetadataError naming the problem."""
    path = os.path.join(run_dir, "run.json")
    raw = _read_record(path, os.geteuid() if uid is None else uid)
    try:
        data = bounded.loads(raw, max_bytes=RUN_JSON_MAX_BYTES, max_depth=RUN_JSON_MAX_DEPTH)
    except MalformedEvent as exc:
        raise RunMetadataError(f"{path}: {exc.reason.replace('payload', 'run.json', 1)}") from None
    if not isinstance(data, dict):
        raise RunMetadataError(f"{path}: not a JSON object")
    run_id = data.get("run_id")
    argv = data.get("entrypoint")
    if not isinstance(run_id, str) or not run_id:
        raise RunMetadataError(f"{path}: run_id missing")
    if restart_shaped(run_id):
        raise RunMetadataError(f"{path}: run_id {run_id[:100]!r} ends in -r<digits>, the shape "
                               "of another run's restart job id. Fix: rename the run (run.name) "
                               "and submit it again")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RunMetadataError(f"{path}: entrypoint must be a non-empty list of strings")
    env = data.get("runtime_env") or {}
    if not isinstance(env, dict):
        raise RunMetadataError(f"{path}: runtime_env must be an object")
    subs = data.get("submission_ids") or []
    for key in ("submission_id", "ray_job_submission_id"):
        if isinstance(data.get(key), str):
            subs = [*subs, data[key]]
    incarnation = data.get("incarnation", 0)
    return RunRecord(
        run_id=run_id, job=str(data.get("job") or run_id), run_dir=run_dir,
        entrypoint=tuple(argv), runtime_env=env,
        incarnation=incarnation if isinstance(incarnation, int) else 0,
        submission_ids=tuple(s for s in subs if isinstance(s, str)),
    )


class RunRegistry:
    """Run directories under the configured globs, looked up by run id only."""

    def __init__(self, patterns: tuple[str, ...], *, uid: int | None = None) -> None:
        self._patterns = patterns
        self.uid = os.geteuid() if uid is None else uid
        """The user whose run.json files are read (autoresume's own)."""

    def _scan(self) -> list[RunRecord]:
        """Every readable record under the globs; a bad one is logged and left out, whatever
        went wrong with it (module docstring)."""
        out = []
        for pattern in self._patterns:
            for run_dir in sorted(glob.glob(pattern)):
                if not os.path.lexists(os.path.join(run_dir, "run.json")):
                    continue
                try:
                    out.append(self._read(run_dir))
                except RunMetadataError as exc:
                    log.warning("autoresume_bad_run_json", run_dir=run_dir, reason=str(exc))
                except Exception as exc:  # one run's file never stops the scan for the others
                    log.warning("autoresume_bad_run_json", run_dir=run_dir,
                                reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        return out

    def _read(self, run_dir: str) -> RunRecord:
        real = os.path.realpath(run_dir)
        if real != os.path.abspath(run_dir):
            raise RunMetadataError(
                f"{run_dir} resolves to {real}: a run directory reached through a link is an "
                "alias, not a run. Fix: configure run_dirs with the real path, and remove the "
                "link if it is not yours")
        return read_run_json(run_dir, uid=self.uid)

    def find(self, run_id: str) -> RunRecord | None:
        """The one run with this id; None if none; AmbiguousRunError if several claim it."""
        found: dict[str, RunRecord] = {}
        claims: dict[str, set[str]] = {}  # submission id -> run directories recording it
        for record in self._scan():
            real = os.path.realpath(record.run_dir)
            for sid in record.submission_ids:
                claims.setdefault(sid, set()).add(real)
            if record.run_id == run_id:
                found[real] = record
        if len(found) > 1:
            raise AmbiguousRunError(
                f"run id {run_id!r} is claimed by {len(found)} run directories "
                f"({', '.join(sorted(found))}); autoresume resubmits none of them. Fix: give "
                "each run its own run.name (the run id) and remove the stray run.json")
        if not found:
            return None
        real, record = next(iter(found.items()))
        contested = [s for s in record.submission_ids if claims.get(s, set()) - {real}]
        if contested:
            log.warning("autoresume_recorded_ids_contested", run=run_id, run_dir=record.run_dir,
                        submission_ids=contested,
                        reason="other run directories record these ids too; they are not "
                               "counted as this run's")
            record = replace(record, submission_ids=tuple(
                s for s in record.submission_ids if s not in contested))
        return record


@dataclass(frozen=True)
class Hold:
    """``reason``: why the operator put the run on hold (None: not on hold); ``ignored``: why a
    DO_NOT_RESUME that is there was not honoured (None: none was ignored)."""

    reason: str | None = None
    ignored: str | None = None


def check_hold(run_dir: str) -> Hold:
    """RUN_DIR/DO_NOT_RESUME, honoured only as the module docstring says."""
    path = os.path.join(run_dir, HOLD_FILE)
    try:
        marker = os.lstat(path)
    except FileNotFoundError:
        return Hold()
    except OSError as exc:
        return Hold(ignored=f"{HOLD_FILE} in {run_dir} unreadable ({exc})")
    why = _stray(run_dir, marker)
    if why:
        log.warning("autoresume_hold_ignored", run_dir=run_dir, reason=why)
        return Hold(ignored=f"{HOLD_FILE} in {run_dir} ignored: {why}")
    try:  # never through a link, never blocking on a FIFO swapped in after the lstat
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(500).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return Hold(reason=f"{HOLD_FILE} in {run_dir}" + (f": {text}" if text else ""))


def _stray(run_dir: str, marker: os.stat_result) -> str | None:
    fix = (f"Fix: as the run's user, `chmod o-w {run_dir}` and recreate {HOLD_FILE} if the "
           "run must stay down")
    if not stat.S_ISREG(marker.st_mode):
        return f"it is not a regular file (a symlink or other). {fix}"
    try:
        owner = os.stat(os.path.join(run_dir, "run.json")).st_uid
        folder = os.stat(run_dir).st_mode
    except OSError as exc:
        return f"cannot check its owner ({exc})"
    if marker.st_uid != owner:
        return f"owned by uid {marker.st_uid}, not the run's user (uid {owner}, run.json's). {fix}"
    if folder & stat.S_IWOTH:
        return (f"the run directory is writable by others (mode {stat.S_IMODE(folder):o}), so "
                f"anyone could have put it there. {fix}")
    return None


def hold_reason(run_dir: str) -> str | None:
    """Why the run is on hold (an honoured RUN_DIR/DO_NOT_RESUME), or None."""
    return check_hold(run_dir).reason


def last_heartbeat(run_dir: str, *, tail_bytes: int = 16384) -> Heartbeat | None:
    """Last step record in RUN_DIR/metrics.jsonl (step, wall_time), if any; None when unknown."""
    try:  # a torn line (a driver killed mid-write) is skipped
        records = list(read_jsonl(os.path.join(run_dir, "metrics.jsonl"), tail_bytes=tail_bytes))
    except (OSError, RecursionError) as exc:  # RecursionError: a line nested thousands deep
        log.warning("autoresume_metrics_unreadable", run_dir=run_dir,
                    reason=f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    for rec in reversed(records):
        step, at = rec.get("step"), rec.get("wall_time")
        if isinstance(step, int) and isinstance(at, (int, float)):
            return Heartbeat(step=step, at=float(at))
    return None
