"""Which driver command line autoresume resubmits: ``python -m orchestrator.main`` and
arguments that cannot steer the run anywhere but "this run again".

run.json (in a bucket every job can write) records the driver's argv; autoresume submits it with
the cluster's token, so every word after ``-m orchestrator.main`` is checked, the way the driver
itself reads it (``orchestrator/main.py: parse_args``, ``configtools.parse_override``):

* flags: ``--config PATH``, ``--log-format``, ``--log-level`` only (also as ``--flag=value``);
  anything else that starts with ``-`` (``-h``, argparse abbreviations, ``--``) is refused;
* ``--config``: a relative path without ``..`` (inside the job's working directory: its Ray
  package or the image) or an absolute one under ``config_roots`` (read-only directories of the
  image, default ``/app/configs``); never a file in the runs bucket or another writable place;
* overrides ``key=value``: the key must be in ``ALLOWED_OVERRIDES`` (a section or a setting that
  names no path, URL, endpoint, subscription or metric identity: ``compile.dir``,
  ``cluster.address``, ``events.pubsub.subscription``... are not);
* the task: ``task.kind`` (which code a host imports) only ever comes from the ``--config`` file
  (inside the job's working_dir package, or under ``config_roots``), never an override.
  ``task.<setting>`` overrides of a user's task (``task.data.dir=...``) are the task's own settings,
  opaque here (one may name a path): each is resubmitted only when it changes nothing in the
  task the run recorded (``RUN_DIR/config.yaml``, which the driver writes at every start), so the
  resubmission brings back the run's task and settings, never others. The alert names only the
  run id; nothing of the task comes from it;
* ``run.run_dir`` must be the folder where run.json was found (the service must see run
  directories at the path the jobs write them, /runs in deploy/); when the argv does not name
  it, ``run.run_dir=<that folder>`` is appended, so the resubmission writes nowhere else;
  ``run.name``, when named, must be the run id.

These allow-lists say which words may be resubmitted at all; ``resume_only.py`` then holds the
argv to the command Ray recorded for the run (config.yaml, checked above, is as forgeable as
run.json), so allowed words cannot steer a run either.
"""

from __future__ import annotations

import copy
import os
import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.autoresume.runenv import REDACTED, RefusedResubmission
from orchestrator.shared import bounded_yaml
from orchestrator.shared.configtools import parse_override
from orchestrator.shared.errors import ConfigError

_ENTRYPOINT_PREFIX = ("-m", "orchestrator.main")
_PYTHONS = frozenset({"python", "python3"})
_FLAGS = frozenset({"--config", "--log-format", "--log-level"})
ALLOWED_OVERRIDES = (
    "run.name", "run.run_dir", "run.total_steps", "run.seed", "run.steps_per_call", "eval",
    "cluster.mode", "cluster.emulate", "cluster.accelerator", "cluster.slices",
    "cluster.connect_timeout_s",
    "mesh", "model", "train", "checkpoint", "timeouts",
    "compile.cache", "compile.ahead", "compile.share",
    "controller.budgets", "controller.budget_window_s", "controller.backoff",
    "controller.max_wait_for_capacity_s", "controller.elastic", "controller.batch_on_resize",
    "controller.lr_on_scale", "controller.checkpoint_interval", "controller.deadline",
    "controller.health", "controller.warm",
    "events.pubsub.project", "events.pubsub.topic", "events.pubsub.emulator",
    "events.pubsub.max_messages", "events.pubsub.max_bytes", "events.pubsub.max_payload_bytes",
    "events.pubsub.reconnect_initial_s", "events.pubsub.reconnect_max_s",
    "events.metadata.enabled", "events.metadata.timeout_s", "events.metadata.backoff_initial_s",
    "events.metadata.backoff_max_s", "events.metadata.preemption_notice_s",
    "events.metadata.maintenance_notice_s", "events.inbox", "events.inbox_poll_s",
    "events.dedupe_window", "events.notice_s", "events.stale_grace_s", "events.cluster",
    "events.max_payload_depth",
    "metrics.console_every_steps", "metrics.jsonl", "metrics.ray_metrics",
    "metrics.cloud_monitoring.enabled", "metrics.cloud_monitoring.project",
    "metrics.cloud_monitoring.window_s", "metrics.cloud_monitoring.queue_size",
    "metrics.cloud_monitoring.location", "metrics.cloud_monitoring.namespace",
    "metrics.cloud_monitoring.timeout_s", "metrics.cloud_monitoring.max_attempts",
    "metrics.cpu_peak_flops_per_device", "metrics.queue_size", "metrics.rolling_window_s",
)
RECORDED_CONFIG = "config.yaml"
_RECORDED_MAX_BYTES = 1 << 20
_TASK_FIX = ("Fix: give the task's kind and settings in the --config file (in the job's "
             "working_dir package or under autoresume's config_roots), or submit the run again "
             "by hand")
_FIX = ("Fix: put the setting in the --config file (under autoresume's config_roots or in the "
        "job's working_dir package) or the image, and submit the run again by hand")


def override_allowed(key: str) -> bool:
    """``key`` (dotted) is an allowed setting or lies inside an allowed section."""
    return any(key == a or key.startswith(a + ".") for a in ALLOWED_OVERRIDES)


def _refuse(argv: Sequence[str], why: str) -> RefusedResubmission:
    return RefusedResubmission(f"entrypoint {shlex.join(argv)[:200]!r}: {why}")


def _check_config_path(argv: Sequence[str], path: str, config_roots: Sequence[str]) -> None:
    if not path or path == REDACTED:
        raise _refuse(argv, "--config has no path")
    if os.path.isabs(path):
        norm = os.path.normpath(path)
        roots = [os.path.normpath(r) for r in config_roots]
        if not any(norm.startswith(r.rstrip("/") + "/") for r in roots):
            raise _refuse(argv, f"--config {path[:200]!r} is outside autoresume's config_roots "
                          f"{roots} (a file there could be anyone's). {_FIX}, or add its "
                          "read-only directory to config_roots")
    elif ".." in path.replace("\\", "/").split("/"):
        raise _refuse(argv, f"--config {path[:200]!r} climbs out of the job's working directory")


def _check_override(argv: Sequence[str], word: str, *, run_dir: str, run_id: str) -> str:
    """The dotted key of override ``word`` after its checks."""
    try:
        path, value = parse_override(word)
    except ConfigError:
        raise _refuse(argv, f"{word[:200]!r} is neither a known flag nor key=value") from None
    key = ".".join(path)
    if path[0] == "task":
        _check_task_override(argv, path, value, run_dir=run_dir)
        return key
    if not override_allowed(key):
        raise _refuse(argv, f"override {key[:200]!r} is not one autoresume resubmits (it may "
                      "name a path, URL, subscription or another run; allowed: "
                      "orchestrator/autoresume/entrypoint.py ALLOWED_OVERRIDES). " + _FIX)
    if key == "run.run_dir":
        here = os.path.realpath(run_dir)
        if not (isinstance(value, str) and os.path.isabs(value)
                and os.path.realpath(value) == here):
            raise _refuse(argv, f"run.run_dir={str(value)[:200]!r} is not the run directory "
                          f"{here} where this run.json lies. Fix: record the run with an "
                          "absolute run.run_dir equal to its own directory")
    if key == "run.name" and (isinstance(value, dict | list) or str(value) != run_id):
        raise _refuse(argv, f"run.name={str(value)[:100]!r} is not the run id {run_id!r}")
    return key


def recorded_task(run_dir: str) -> dict[str, Any] | None:
    """The ``task`` section (``{kind, settings}``) of the config the run's driver recorded in
    ``RUN_DIR/config.yaml``, or None when there is none to read."""
    path = os.path.join(run_dir, RECORDED_CONFIG)
    try:
        if os.path.islink(path) or os.path.getsize(path) > _RECORDED_MAX_BYTES:
            return None
        with open(path, encoding="utf-8") as fh:
            data = bounded_yaml.load(fh.read(_RECORDED_MAX_BYTES + 1), where=RECORDED_CONFIG)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError):
        return None  # deep, an alias bomb, huge: as unreadable
    task = data.get("task") if isinstance(data, dict) else None
    if not (isinstance(task, dict) and isinstance(task.get("settings", {}), dict)):
        return None
    return task


def _check_task_override(argv: Sequence[str], path: list[str], value: Any, *,
                         run_dir: str) -> None:
    """``task.<setting>=value`` (or ``task.settings.<setting>``) passes only when it changes
    nothing in the task the run recorded; ``task`` and ``task.kind`` never pass."""
    key = ".".join(path)
    if len(path) == 1 or path[1] == "kind":
        raise _refuse(argv, f"override {key[:200]!r} would choose the task's code: a task's "
                      "kind comes from the --config file, never from an override autoresume "
                      "resubmits. " + _TASK_FIX)
    recorded = recorded_task(run_dir)
    if recorded is None:
        raise _refuse(argv, f"override {key[:200]!r} cannot be checked: the run recorded no "
                      f"readable {RECORDED_CONFIG} in {run_dir}. " + _TASK_FIX)
    settings = recorded.get("settings") or {}
    sub = path[2:] if path[1] == "settings" else path[1:]
    after: Any = copy.deepcopy(settings)
    if sub:
        node = after
        for part in sub[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            after = None
        else:
            node[sub[-1]] = value
    else:
        after = value
    if after != settings:
        raise _refuse(argv, f"override {key[:200]}={str(value)[:200]!r} differs from the "
                      f"task the run recorded in {RECORDED_CONFIG} (kind "
                      f"{str(recorded.get('kind'))[:100]!r}): autoresume brings back the run's "
                      "own task and settings only. " + _TASK_FIX)


def vet_entrypoint(argv: Sequence[str], *, run_dir: str, run_id: str,
                   config_roots: Sequence[str] = ()) -> str:
    """The shell line to resubmit for ``argv`` (pinned to ``run_dir``), or RefusedResubmission
    naming what is wrong and the fix."""
    argv = list(argv)
    if (len(argv) < 3 or argv[0].rsplit("/", 1)[-1] not in _PYTHONS
            or tuple(argv[1:3]) != _ENTRYPOINT_PREFIX):
        raise RefusedResubmission(
            f"entrypoint {shlex.join(argv)[:200]!r} is not `python -m orchestrator.main ...`; "
            "autoresume only resubmits the orchestrator's driver. Fix: submit the run as "
            "`ray job submit -- python -m orchestrator.main ...` and let the driver write run.json")
    if any("\x00" in word for word in argv):
        raise _refuse(argv, "a word holds a NUL character")
    args, keys = argv[3:], set()
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-"):
            flag, eq, value = word.partition("=")
            if flag not in _FLAGS:
                raise _refuse(argv, f"flag {word[:100]!r} is not one of {sorted(_FLAGS)}")
            if not eq:
                if i + 1 >= len(args):
                    raise _refuse(argv, f"{flag} has no value")
                i += 1
                value = args[i]
            if flag == "--config":
                _check_config_path(argv, value, config_roots)
        else:
            keys.add(_check_override(argv, word, run_dir=run_dir, run_id=run_id))
        i += 1
    words = ["python", *argv[1:]]
    if "run.run_dir" not in keys:
        words.append(f"run.run_dir={os.path.abspath(run_dir)}")
    return shlex.join(words)
