"""What of a run's submission may be stored in run.json and resubmitted by autoresume.

run.json lives in the runs bucket, which every Ray job can write. Autoresume submits with the
cluster's token, so whatever it resubmits must not be more than "this run again":

* the entrypoint must be ``python -m orchestrator.main ...`` with allow-listed arguments
  (``orchestrator/autoresume/entrypoint.py``);
* only the runtime_env keys in ``ALLOWED_RUNTIME_ENV_KEYS``; ``working_dir`` only as a package
  already uploaded to this cluster (``gcs://_ray_pkg_*``); env vars only by name from
  ``ALLOWED_ENV_VARS`` (knobs of JAX/XLA/TPU and Python's output: never a path, a proxy, a
  certificate or anything that picks which code runs);
* secrets are redacted when run.json is written, in one place (:func:`redact_runtime_env`,
  :func:`redact_argv`): env var values whose names look secret (``*_TOKEN``, ``*PASSPHRASE``,
  ``*WEBHOOK*``, ``*_CREDS``, ``*_AUTH``, ``PRIVKEY``...) or that hold a credential; URL
  credentials (``https://user:secret@host``), tokens known by their shape (``ghp_...``,
  ``xoxb-...``, ``AKIA...``) and connection-string keys (``AccountKey=...``) anywhere in the
  runtime_env or the argv; the values of secret-looking overrides and flags
  (``foo.password=...``, ``x.passphrase=...``, ``--token X``, ``--webhook URL``). On
  resubmission redacted variables are left out, because secrets reach the pods from Kubernetes
  Secrets (deploy/README.md), not from run.json.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
ALLOWED_RUNTIME_ENV_KEYS = frozenset({"env_vars", "working_dir", "config"})
ALLOWED_ENV_VARS = frozenset({
    "JAX_PLATFORMS", "JAX_TRACEBACK_FILTERING", "JAX_LOG_COMPILES", "JAX_DEBUG_NANS",
    "JAX_ENABLE_X64", "JAX_DEFAULT_MATMUL_PRECISION", "XLA_FLAGS", "LIBTPU_INIT_ARGS",
    "TPU_STDERR_LOG_LEVEL", "TPU_MIN_LOG_LEVEL", "TPU_VMODULE", "TF_CPP_MIN_LOG_LEVEL",
    "TF_CPP_MAX_VLOG_LEVEL", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER",
    "OMP_NUM_THREADS", "GRPC_VERBOSITY",
})
_SECRET_NAME = re.compile(
    r"(secret|token|passw(or)?d|passwd|pwd|passphrase|credential|(^|_)creds?($|_)|api_?key|"
    r"private_?key|priv_?key|access_?key|auth_?token|authorization|bearer|cookie|signature|"
    r"jwt|webhook|(^|_)key$|_dsn$|(^|_)pass$|(^|_)pat$|(^|_)auth$|(^|_)sas($|_))",
    re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"([a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.")
# Tokens known by their shape, whatever the name they are under (GitHub, GitLab, Slack, AWS
# access key ids, Google API keys, PEM private keys), and connection-string keys (Azure).
_TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|"
    r"xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|.*)",
    re.DOTALL)
_CONNECTION_KEY = re.compile(
    r"((?:AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)=)[^;\s]+",
    re.IGNORECASE)
_RAY_PACKAGE = re.compile(r"^gcs://_ray_pkg_[0-9a-f]+\.zip$")


class RefusedResubmission(ValueError):
    """run.json asks for something autoresume will not submit; the message names the fix."""


def secret_name(name: str) -> bool:
    """A name like *_TOKEN / *PASSWORD / *_API_KEY / *_PASS / *_PAT / JWT / *_SAS, as an env var,
    a dotted override key (``foo.password``) or a flag (``--api-key``)."""
    return bool(_SECRET_NAME.search(re.sub(r"[-.]", "_", name.lstrip("-"))))


def holds_credential(value: object) -> bool:
    """A URL with credentials in it (anywhere, e.g. the second of several index URLs), a JWT, a
    token known by its shape (``ghp_...``) or a connection string's key (``AccountKey=...``)."""
    return isinstance(value, str) and any(
        pattern.search(value) for pattern in (_URL_CREDENTIALS, _JWT, _TOKEN, _CONNECTION_KEY))


def looks_secret(name: str, value: object) -> bool:
    """A secret-looking name, or a value holding a credential."""
    return secret_name(name) or holds_credential(value)


def _scrub(value: Any) -> Any:
    """``value`` with URL credentials, JWTs, shaped tokens and connection-string keys replaced,
    in every string it holds."""
    if isinstance(value, str):
        value = _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", value)
        value = _CONNECTION_KEY.sub(rf"\1{REDACTED}", _TOKEN.sub(REDACTED, value))
        return _JWT.sub(REDACTED + ".", value)
    if isinstance(value, Mapping):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def redact_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``runtime_env`` fit for run.json: secret-looking env var values (by name or by
    content) are ``<redacted>``, and URL credentials anywhere else (pip index URLs, ...) too.

    Called where the driver writes run.json, so no secret lands in the bucket in clear text.
    """
    out = {k: _scrub(v) for k, v in runtime_env.items() if k != "env_vars"}
    env = runtime_env.get("env_vars")
    if isinstance(env, Mapping):
        out["env_vars"] = {k: (REDACTED if looks_secret(str(k), v) else v)
                           for k, v in env.items()}
    elif "env_vars" in runtime_env:
        out["env_vars"] = _scrub(env)
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` fit for run.json: ``key=value`` and ``--flag=value`` with a secret-looking key
    keep the key only, the word after a secret-looking ``--flag`` is redacted, and URL
    credentials are replaced wherever they appear."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        key, eq, _value = word.partition("=")
        if eq and secret_name(key):
            out.append(f"{key}={REDACTED}")
        elif word.startswith("-") and not eq and secret_name(word):
            out.append(word)
            hide_next = True
        else:
            out.append(_scrub(word))
    return out


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
            if value == REDACTED:
                continue  # a secret: the pods get it from a Kubernetes Secret
            if name not in ALLOWED_ENV_VARS:
                raise RefusedResubmission(
                    f"env var {name[:100]} is not one autoresume resubmits (it may pick which "
                    "code, interpreter, certificate, proxy or directory is used; allowed are "
                    "knobs of JAX/XLA/TPU and Python output: runenv.ALLOWED_ENV_VARS). Fix: set "
                    "it in the image or the pod spec, or drop it from the job's runtime_env")
            if not isinstance(value, str):
                raise RefusedResubmission(f"env var {name} is not a string")
            kept[name] = value
        if kept:
            out["env_vars"] = kept
    return out
