"""What of a run's submission may be stored in run.json and resubmitted by autoresume.

run.json lives in the runs bucket, which every Ray job can write. Autoresume submits with the
cluster's token, so whatever it resubmits must not be more than "this run again":

* the entrypoint must be ``python -m orchestrator.main ...`` (no shell, no other program);
* only the runtime_env keys in ``ALLOWED_RUNTIME_ENV_KEYS``; ``working_dir`` only as a package
  already uploaded to this cluster (``gcs://_ray_pkg_*``); no env var that changes which code or
  interpreter runs (``PATH``, ``LD_*``, ``PYTHON*`` other than a few harmless ones);
* env var values whose names look like secrets are redacted when run.json is written
  (:func:`redact_runtime_env`); on resubmission those variables are left out, because secrets
  reach the pods from Kubernetes Secrets (deploy/README.md), not from run.json.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
ALLOWED_RUNTIME_ENV_KEYS = frozenset({"env_vars", "working_dir", "config"})
_SECRET_NAME = re.compile(
    r"(secret|token|passw(or)?d|passwd|pwd|credential|api_?key|private_?key|access_?key|"
    r"auth_?token|authorization|cookie|signature|(^|_)key$|_dsn$)", re.IGNORECASE)
_URL_WITH_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]+:[^/@\s]+@", re.IGNORECASE)
_DENIED_ENV = re.compile(r"^(PATH|LD_.*|DYLD_.*|BASH_ENV|ENV|PYTHON.*|RAY_RUNTIME_ENV_HOOK)$")
_ALLOWED_PYTHON_ENV = frozenset({"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER"})
_RAY_PACKAGE = re.compile(r"^gcs://_ray_pkg_[0-9a-f]+\.zip$")
_ENTRYPOINT_PREFIX = ("-m", "orchestrator.main")
_PYTHONS = frozenset({"python", "python3"})


class RefusedResubmission(ValueError):
    """run.json asks for something autoresume will not submit; the message names the fix."""


def looks_secret(name: str, value: object) -> bool:
    """A name like *_TOKEN / *PASSWORD / *API_KEY, or a URL with a password in it."""
    return bool(_SECRET_NAME.search(name)) or (
        isinstance(value, str) and bool(_URL_WITH_PASSWORD.match(value)))


def redact_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``runtime_env`` whose secret-looking env var values are ``<redacted>``.

    Called where the driver writes run.json, so no secret lands in the bucket in clear text.
    """
    out = dict(runtime_env)
    env = runtime_env.get("env_vars")
    if isinstance(env, Mapping):
        out["env_vars"] = {k: (REDACTED if looks_secret(str(k), v) else v)
                           for k, v in env.items()}
    return out


def vet_entrypoint(argv: Sequence[str]) -> str:
    """The shell line to submit for ``argv``, or RefusedResubmission if it is not the driver."""
    if (len(argv) < 3 or argv[0].rsplit("/", 1)[-1] not in _PYTHONS
            or tuple(argv[1:3]) != _ENTRYPOINT_PREFIX):
        raise RefusedResubmission(
            f"entrypoint {shlex.join(argv)[:200]!r} is not `python -m orchestrator.main ...`; "
            "autoresume only resubmits the orchestrator's driver. Fix: submit the run as "
            "`ray job submit -- python -m orchestrator.main ...` and let the driver write run.json")
    return shlex.join(["python", *argv[1:]])


def vet_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime_env to resubmit with: allowed keys only, redacted env vars left out."""
    extra = sorted(set(runtime_env) - ALLOWED_RUNTIME_ENV_KEYS)
    if extra:
        raise RefusedResubmission(
            f"runtime_env keys {extra} are not resubmitted (allowed: "
            f"{sorted(ALLOWED_RUNTIME_ENV_KEYS)}). Fix: bake dependencies into the image and "
            "pass settings as env_vars or config overrides")
    out: dict[str, Any] = {}
    wd = runtime_env.get("working_dir")
    if wd is not None:
        if not isinstance(wd, str) or not _RAY_PACKAGE.match(wd):
            raise RefusedResubmission(
                f"working_dir {str(wd)[:200]!r} is not a package uploaded to this cluster "
                "(gcs://_ray_pkg_<hash>.zip). Fix: submit with --working-dir DIR so Ray uploads "
                "it, or bake the code into the image")
        out["working_dir"] = wd
    config = runtime_env.get("config")
    if config is not None:
        if not isinstance(config, Mapping):
            raise RefusedResubmission("runtime_env.config must be an object")
        out["config"] = dict(config)
    env = runtime_env.get("env_vars")
    if env is not None:
        if not isinstance(env, Mapping):
            raise RefusedResubmission("runtime_env.env_vars must be an object")
        kept: dict[str, str] = {}
        for name, value in env.items():
            name = str(name)
            if _DENIED_ENV.match(name) and name not in _ALLOWED_PYTHON_ENV:
                raise RefusedResubmission(
                    f"env var {name} changes which program or code runs; autoresume does not "
                    "resubmit it. Fix: set it in the image or the pod spec")
            if value == REDACTED:
                continue  # a secret: the pods get it from a Kubernetes Secret
            if not isinstance(value, str):
                raise RefusedResubmission(f"env var {name} is not a string")
            kept[name] = value
        if kept:
            out["env_vars"] = kept
    return out
