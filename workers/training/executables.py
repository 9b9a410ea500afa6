"""Compiled executables kept in the run directory, so a re-formed or resumed group loads its step
instead of compiling it (COMPILING with the executable loaded is measured in bench/RESULTS.md).

The persistent compilation cache does not work across processes on CPU (only process 0 writes,
keys differ per process), so a process serialises its compiled
executable (``jax.experimental.serialize_executable``) into ``RUN_DIR/executables/``, one file
per (key, process) — or one for the whole group where its lowest process compiles for all
(``workers.training.compile_share``; the others load its file). The key is everything that makes an
executable valid: versions, XLA flags, platform, the source of the step's code, the
model/optimizer/train config, the mesh (axes, shape, device assignment), the process index and
count, and the function. A file is used only when its key matches exactly; a missing,
mismatched, corrupt or unloadable file means "compile", with the reason logged, never an error:
the store is an optimisation, never a reason to fail a run.

The key functions are pure (no JAX); JAX is imported only where executables are read or written.
Loading unpickles the file, so the store is treated as writable by others
(``workers.training.exec_auth``): every file is signed (HMAC-SHA256 over magic, header and body,
with a key kept outside the store) and is unpickled only once its signature verifies; a store or
file that someone else could have written is refused where the filesystem can tell. A refused file
is compiled afresh, the reason logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import os
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.shared.files import atomic_write_bytes, holder
from orchestrator.shared.host_env import key_path
from workers.training.exec_auth import (
    MAC_HEX,
    Untrusted,
    load_key,
    sign,
    store_problem,
    verify_chunks,
    writable_by_others,
)

log = logging.getLogger(__name__)

FORMAT = 2
"""Bumped when the file layout or the key's shape changes: older files then never match."""
MAGIC = b"tpu-orchestrator executable v2\n"
"""Then the MAC line (64 hex digits), the JSON header line, the pickled body."""
SUFFIX = ".xla"
CHUNK = 1 << 20
"""A body is MAC-checked in pieces this big before it is read whole (issue 49)."""
KEEP_PER_PROCESS = 8
"""Newest files kept per (function, process index/count): enough for the few meshes a run moves
between (N slices, N-1, N with a spare), bounded so a long run does not fill the disk."""
CODE_MODULES = ("workers.training.trainer", "workers.training.mesh", "workers.task.state")
"""Modules whose source defines the orchestrator's side of the step: an edit there makes stored
executables stale. The task's own code enters the key's config as ``task_code``
(``workers.task.resolve.code_digest``)."""
LIBRARIES = ("flax", "optax")
JAX_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_threefry_partitionable",
               "jax_default_prng_impl", "jax_numpy_rank_promotion")
"""JAX options that change what a traced function lowers to."""


# ---- the key (pure) -----------------------------------------------------------------------------

def executable_key(*, function: str, runtime: Mapping[str, Any], config: Mapping[str, Any],
                   mesh: Mapping[str, Any], process_index: int, process_count: int) -> dict:
    """The full key of one process's executable of ``function`` (a JSON-able dict)."""
    if not function or not all(c.isalnum() or c in "_-" for c in function):
        raise ValueError(f"function name {function!r} must be letters, digits, '_' or '-'")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process index {process_index} is outside 0..{process_count - 1}")
    return {"format": FORMAT, "function": function, "runtime": dict(runtime),
            "config": dict(config), "mesh": dict(mesh),
            "process": {"index": int(process_index), "count": int(process_count)}}


def key_digest(key: Mapping[str, Any]) -> str:
    """Short stable digest of a key (canonical JSON, sha256, 16 hex digits)."""
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def key_differences(old: Mapping[str, Any], new: Mapping[str, Any], *, limit: int = 5
                    ) -> list[str]:
    """What changed between two keys, as ``dotted.path: old -> new`` (for the log)."""
    a, b = _flatten(old), _flatten(new)
    out = [f"{k}: {_short(a.get(k))} -> {_short(b.get(k))}"
           for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def file_name(key: Mapping[str, Any]) -> str:
    """``<function>.<digest>.p<index>-of-<count>.xla``: one file per (key, process)."""
    p = key["process"]
    return f"{key['function']}.{key_digest(key)}.p{p['index']}-of-{p['count']}{SUFFIX}"


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _short(v: Any) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


# ---- ingredients read from the live process -----------------------------------------------------

@functools.lru_cache(maxsize=1)
def code_digest(modules: tuple[str, ...] = CODE_MODULES) -> str:
    """Digest of the source files that define the step (an edit makes old executables stale)."""
    h = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        h.update(name.encode())
        h.update(Path(origin).read_bytes() if origin and os.path.exists(origin) else b"?")
    return h.hexdigest()[:16]


def runtime_ingredients(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Versions, flags and platform of this process's JAX (call after the backend started)."""
    from importlib import metadata

    import jax
    import jaxlib

    env = os.environ if env is None else env
    dev = jax.devices()[0]
    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libs[name] = None
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "libraries": libs,
            "platform": dev.platform, "platform_version": dev.client.platform_version,
            "device_kind": dev.device_kind, "xla_flags": env.get("XLA_FLAGS", ""),
            "libtpu_init_args": env.get("LIBTPU_INIT_ARGS", ""),
            "options": {name: _option(jax, name) for name in JAX_OPTIONS},
            "code": code_digest()}


def _option(jax: Any, name: str) -> Any:
    value = getattr(jax.config, name, None)
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def mesh_ingredients(mesh: Any, shape: Mapping[str, int], *, num_slices: int) -> dict[str, Any]:
    """Axes, shape and device assignment of ``mesh`` (a ``jax.sharding.Mesh``): the executable
    addresses devices by id, so the same ids must sit at the same mesh positions."""
    devices = [[int(d.id), int(d.process_index), list(getattr(d, "coords", None) or []),
                getattr(d, "slice_index", None)] for d in mesh.devices.flat]
    return {"axes": list(mesh.axis_names), "shape": [int(n) for n in mesh.devices.shape],
            "plan": dict(shape), "num_slices": int(num_slices), "devices": devices}


# ---- the store ----------------------------------------------------------------------------------

@dataclass
class Lookup:
    """A load attempt: ``compiled`` is None when the caller must compile, and ``reason`` says
    why (empty on a hit)."""

    compiled: Any
    reason: str
    meta: dict = dataclasses.field(default_factory=dict)
    load_s: float = 0.0
    damaged: bool = False
    """A file was there for this key but could not be used (worth a warning)."""


class ExecutableStore:
    """``root`` holds one file per (key, process); written atomically (temp file + rename) and
    signed with the key in ``key_file`` (default ``host_env.key_path()``)."""

    def __init__(self, root: str | Path, *, keep: int = KEEP_PER_PROCESS,
                 key_file: str | None = None) -> None:
        self.root = Path(root)
        self.keep = keep
        self.key_file = key_file or key_path()

    def _key(self) -> bytes:
        """The signing key (read each time: a replaced key takes effect at once); refused
        when it lies in the store, where whoever plants executables could replace it."""
        if holder(self.key_file, [self.root]) is not None:
            raise Untrusted(f"executables key {self.key_file} lies in the store {self.root}: "
                            "whoever can write the store could replace it; fix: keep the key "
                            "outside every directory the orchestrator writes (point "
                            "$TPU_ORCH_EXECUTABLES_KEY elsewhere, or move compile.dir)")
        return load_key(self.key_file)

    def path(self, key: Mapping[str, Any]) -> Path:
        return self.root / file_name(key)

    def load(self, key: Mapping[str, Any], *, args: tuple, devices: Any = None) -> Lookup:
        """The stored executable for ``key``, or why not. Never raises.

        ``args`` are the (abstract) arguments the caller will pass: an executable stored for
        another argument tree, shape or dtype is refused (deserialize_and_load needs the trees;
        they are pickled with it). ``devices``: the mesh's, when it is not every device of the
        runtime (XLA aborts the process when an executable is loaded onto more devices than
        its shardings span).
        """
        t0 = time.perf_counter()
        path = self.path(key)
        if (problem := store_problem(self.root)) is not None:
            return Lookup(None, f"refused: {problem}", damaged=True)
        try:
            if not path.is_file():
                return Lookup(None, self._why_absent(key))
            header, body = _read(path, key=self._key())
            if header.get("key") != key:  # a digest collision or a hand-copied file
                diff = key_differences(header.get("key") or {}, key)
                return Lookup(None, f"{path.name} holds another key ({'; '.join(diff)})",
                              damaged=True)
            payload, stored_in, out_tree = pickle.loads(body)
            import jax
            from jax.experimental import serialize_executable

            in_tree = jax.tree.structure((args, {}))
            if stored_in != in_tree:
                return Lookup(None, f"{path.name} was compiled for another argument tree",
                              damaged=True)
            execution = sorted(devices, key=lambda d: d.id) if devices is not None else None
            compiled = serialize_executable.deserialize_and_load(payload, stored_in, out_tree,
                                                                 execution_devices=execution)
            if _avals(compiled.args_info) != _avals((args, {})):
                return Lookup(None, f"{path.name} was compiled for other argument shapes or "
                                    "dtypes", damaged=True)
        except Untrusted as exc:  # never unpickled: compile afresh, and say why
            return Lookup(None, f"{path.name} refused, compiled afresh: {exc}", damaged=True)
        except Exception as exc:  # corrupt, truncated, or not loadable here: compile instead
            return Lookup(None, f"{path.name} is unreadable ({type(exc).__name__}: "
                                f"{str(exc)[:300]})", damaged=True)
        return Lookup(compiled, "", dict(header.get("meta") or {}), time.perf_counter() - t0)

    def save(self, key: Mapping[str, Any], compiled: Any, *, meta: Mapping[str, Any] | None = None
             ) -> float | None:
        """Serialise ``compiled`` for ``key``; returns the seconds it took, or None when it could
        not be written (logged: the run goes on compiling next time)."""
        t0 = time.perf_counter()
        path = self.path(key)
        if (problem := store_problem(self.root)) is not None:
            log.warning("executable %s not stored: %s", path.name, problem)
            return None
        try:
            signing_key = self._key()
            from jax.experimental import serialize_executable

            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
            body = pickle.dumps((payload, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)
            header = {"key": dict(key), "digest": key_digest(key), "meta": dict(meta or {}),
                      "written_at": time.time()}
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            atomic_write_bytes(path, encode(signing_key, header, body), fsync=True, mode=0o644)
        except Exception as exc:  # no key, a full disk, an unserialisable executable: go on
            log.warning("executable %s not stored (%s: %s); the next group compiles it",
                        path.name, type(exc).__name__, exc)
            return None
        self._prune(key)
        return time.perf_counter() - t0

    # ---- internals ------------------------------------------------------------------------

    def _siblings(self, key: Mapping[str, Any]) -> list[Path]:
        """Files of the same function and process index/count, newest first."""
        p = key["process"]
        pattern = f"{key['function']}.*.p{p['index']}-of-{p['count']}{SUFFIX}"
        try:
            found = [(f.stat().st_mtime, f) for f in self.root.glob(pattern)]
        except OSError:
            return []
        return [f for _, f in sorted(found, key=lambda t: t[0], reverse=True)]

    def _why_absent(self, key: Mapping[str, Any]) -> str:
        """'none stored yet', or what changed against the newest file of this function and
        process (the ingredient that invalidated it)."""
        for f in self._siblings(key):
            try:
                header, _ = _read(f)  # unverified: only for the log, never loaded
            except Exception as exc:
                log.debug("unreadable sibling %s: %s", f.name, exc)
                continue
            diff = key_differences(header.get("key") or {}, key)
            return f"key changed since {f.name}: {'; '.join(diff)}"
        return "no executable stored for this key yet"

    def _prune(self, key: Mapping[str, Any]) -> None:
        for old in self._siblings(key)[self.keep:]:
            with contextlib.suppress(OSError):
                old.unlink()


def _avals(tree: Any) -> list[tuple[tuple[int, ...], str]]:
    import jax

    return [(tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(tree)]


def encode(signing_key: bytes, header: Mapping[str, Any], body: bytes) -> bytes:
    """A stored file's bytes: magic, MAC over (magic, header line, body), header line (with the
    body's length and sha256 added), body."""
    header = {**header, "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
    line = json.dumps(header, sort_keys=True, default=str).encode() + b"\n"
    return MAGIC + sign(signing_key, MAGIC, line, body) + b"\n" + line + body


def _read(path: Path, *, key: bytes | None = None) -> tuple[dict, bytes]:
    """(header, body) of a stored file; ValueError when it is not one or is damaged.

    With ``key``: the body too, returned only when the file is one nobody else could have
    written (where the filesystem can tell), its size is the header's, and its MAC verifies,
    else ``Untrusted``; the MAC is checked in ``CHUNK``s before the body is read whole, so a
    forged or padded file costs no more memory than a chunk. Without: the header alone,
    unverified (for the log; never for loading)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if key is not None and (why := writable_by_others(st)) is not None:
            raise Untrusted(f"the file {why}; fix: remove it (the next compile rewrites it)")
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not an executable file of this format")
        mac = f.readline(MAC_HEX + 1)
        line = f.readline(1 << 20)
        if len(mac) != MAC_HEX + 1 or not mac.endswith(b"\n") or not line.endswith(b"\n"):
            raise ValueError("truncated header")
        header = json.loads(line)
        if key is None:
            return header, b""
        start, body_len = f.tell(), header.get("body_len")
        if type(body_len) is not int or st.st_size - start != body_len:
            raise ValueError(f"body is damaged ({st.st_size - start} bytes, the header says "
                             f"{body_len!r})")
        body_sha = hashlib.sha256()
        signed = verify_chunks(key, mac[:-1], _chunks(f, MAGIC + line, body_len, body_sha))
        if body_sha.hexdigest() != header.get("body_sha256"):
            raise ValueError(f"body is damaged ({body_len} bytes, checksum mismatch)")
        if not signed:
            raise Untrusted("its signature does not verify with this store's key (forged, or "
                            "written with another key); fix: remove it, or give every run "
                            "sharing the store the same key file ($TPU_ORCH_EXECUTABLES_KEY)")
        f.seek(start)
        data = f.read(body_len)
    # read twice: the checksum the MAC vouches for says it is still the body that was checked
    if len(data) != body_len or hashlib.sha256(data).hexdigest() != header.get("body_sha256"):
        raise ValueError(f"body is damaged ({len(data)} bytes, checksum mismatch)")
    return header, data


def _chunks(f: Any, head: bytes, n: int, body_sha: Any) -> Any:
    """``head``, then the next ``n`` bytes of ``f`` in ``CHUNK``s (fewer when it ends early),
    each also fed to ``body_sha``."""
    yield head
    while n > 0 and (chunk := f.read(min(CHUNK, n))):
        n -= len(chunk)
        body_sha.update(chunk)
        yield chunk


def read_header(path: str | Path) -> dict:
    """The JSON header of a stored file (key, digest, meta), unverified, without loading it."""
    return _read(Path(path))[0]
