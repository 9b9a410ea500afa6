"""A resubmission only resumes: it is the run's own command, as Ray recorded it, and nothing else.

run.json lives where every job can write, and the allow-lists (``entrypoint.py``, ``runenv.py``)
only say which settings may be given at all: a forged record with allowed words alone could
still send a run's events and metrics to another project, reopen its inbox, switch it to the
emulated cluster, cut it to one step, turn its protection off or make XLA dump to a folder.
What a resubmission may differ in from the run's recorded command is only what the service
decides itself: the submission id and ``run.run_dir`` (pinned to the folder of the record).

The recorded command is Ray's record of the run's newest submission (its entrypoint and
runtime_env: only holders of the cluster's token submit; autoresume's own resubmissions were
checked here before they were made). :func:`check` compares run.json against it:

* with a recorded command: the words after the interpreter must be the recorded words, secrets
  redacted as the driver redacts them (``redact_argv``), ``run.run_dir`` words left out on both
  sides; ``XLA_*``/``LIBTPU_*`` env vars and ``working_dir`` must be the recorded ones;
* without one (Ray lists no submission of the run with a driver command: its job table was lost,
  or run.json was edited so the id it records no longer runs its command): settings under
  ``PINNED`` and ``XLA_*``/``LIBTPU_*`` env vars cannot be shown to be the run's, so they are
  refused; the run's --config file (under ``config_roots`` or in its package) still sets them.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.autoresume.runenv import (
    REDACTED,
    RefusedResubmission,
    redact_argv,
    redact_runtime_env,
)
from policies.autoresume import Submission, restart_number

PINNED = (
    "events",  # event sources (inbox, Pub/Sub, metadata server) and the Pub/Sub destination
    "metrics.cloud_monitoring",  # the metrics project and namespace
    "cluster",  # cluster mode, the emulated cluster, slices
    "run.total_steps",
    "checkpoint", "controller.warm", "controller.checkpoint_interval",  # protection
    "task",  # the task's settings (config.yaml, which records them, is as forgeable)
)
PINNED_ENV_PREFIXES = ("XLA_", "LIBTPU_")
_DRIVER = ("-m", "orchestrator.main")
_FIX = ("Fix: if the run is to change, submit it again by hand (`ray job submit --submission-id "
        "<run>-r<n+1> ...`), or put the setting in its --config file")


@dataclass(frozen=True)
class RecordedCommand:
    """What Ray recorded for one submission: its shell line and runtime_env."""

    submission_id: str
    entrypoint: str
    runtime_env: Mapping[str, Any] = field(default_factory=dict)

    def argv(self) -> list[str] | None:
        """The driver's words, redacted as run.json records them; None if not the driver."""
        try:
            words = shlex.split(self.entrypoint)
        except ValueError:
            return None
        if len(words) < 3 or tuple(words[1:3]) != _DRIVER:
            return None
        return redact_argv(words)


def newest_recorded(submissions: Sequence[Submission],
                    command: Callable[[str], RecordedCommand | None],
                    tries: int = 3) -> RecordedCommand | None:
    """Ray's record (``command``: the job API seam) of the run's newest submission that ran
    the driver, looking at the newest ``tries``; None if none did."""
    newest = sorted(submissions, reverse=True,
                    key=lambda s: (s.start_time or 0.0, restart_number(s.submission_id)))
    for sub in newest[:tries]:
        recorded = command(sub.submission_id)
        if recorded is not None and recorded.argv() is not None:
            return recorded
    return None


def pinned(key: str) -> bool:
    """``key`` (dotted) is a PINNED setting or lies inside one."""
    return any(key == p or key.startswith(p + ".") for p in PINNED)


def pinned_env(name: str) -> bool:
    return name.startswith(PINNED_ENV_PREFIXES)


def override_key(word: str) -> str | None:
    """The dotted key of override ``word`` as the driver reads it, or None for a flag/value."""
    if word.startswith("-") or "=" not in word:
        return None
    return ".".join(p for p in word.split("=", 1)[0].strip().split(".") if p)


def _decided_by_the_service(word: str) -> bool:
    return override_key(word) == "run.run_dir"


def check(argv: Sequence[str], runtime_env: Mapping[str, Any],
          recorded: RecordedCommand | None) -> None:
    """RefusedResubmission unless ``argv`` (run.json's entrypoint, already allow-listed) and
    ``runtime_env`` (already vetted) resume the run as the module docstring says."""
    if recorded is None:
        _check_unrecorded(argv, runtime_env)
        return
    want = recorded.argv()
    assert want is not None, "the caller passes only a driver's command"
    have_words = [w for w in argv[1:] if not _decided_by_the_service(w)]
    want_words = [w for w in want[1:] if not _decided_by_the_service(w)]
    if have_words != want_words:
        raise RefusedResubmission(
            f"run.json's command differs from the one Ray recorded for "
            f"{recorded.submission_id} ({_first_difference(have_words, want_words)}): a "
            f"resubmission only resumes the run as it was submitted. {_FIX}")
    _check_env(runtime_env, recorded)


def _first_difference(have: list[str], want: list[str]) -> str:
    for i in range(max(len(have), len(want))):
        a = have[i] if i < len(have) else None
        b = want[i] if i < len(want) else None
        if a != b:
            if a is None:
                return f"run.json lacks {b[:120]!r}"
            if b is None:
                return f"run.json adds {a[:120]!r}"
            return f"run.json has {a[:120]!r} where Ray has {b[:120]!r}"
    return "same words"


def _env_pins(runtime_env: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    env = runtime_env.get("env_vars")
    env = env if isinstance(env, Mapping) else {}
    return ({str(k): v for k, v in env.items() if pinned_env(str(k)) and v != REDACTED},
            runtime_env.get("working_dir"))


def _check_env(runtime_env: Mapping[str, Any], recorded: RecordedCommand) -> None:
    have_env, have_wd = _env_pins(runtime_env)
    want_env, want_wd = _env_pins(redact_runtime_env(recorded.runtime_env or {}))
    for name in sorted(set(have_env) | set(want_env)):
        if have_env.get(name) != want_env.get(name):
            raise RefusedResubmission(
                f"env var {name[:100]} in run.json ({str(have_env.get(name))[:120]!r}) is not "
                f"what Ray recorded for {recorded.submission_id} "
                f"({str(want_env.get(name))[:120]!r}). {_FIX}")
    if have_wd != want_wd:
        raise RefusedResubmission(
            f"working_dir in run.json ({str(have_wd)[:120]!r}) is not the package Ray recorded "
            f"for {recorded.submission_id} ({str(want_wd)[:120]!r}). {_FIX}")


def _check_unrecorded(argv: Sequence[str], runtime_env: Mapping[str, Any]) -> None:
    why = ("Ray holds no record of the run's command (no submission of the run with a driver "
           "command is listed) to show it is the run's own")
    for word in argv[1:]:
        key = override_key(word)
        if key is not None and pinned(key):
            raise RefusedResubmission(
                f"override {key[:120]!r} steers where the run reports, what it listens to, how "
                f"long it runs or how it is protected, and {why}. {_FIX}")
    env, _ = _env_pins(runtime_env)
    if env:
        raise RefusedResubmission(f"env var {sorted(env)[0][:100]} is kept only as Ray "
                                  f"recorded it, and {why}. {_FIX}")
