"""The executables key lives outside every directory the orchestrator writes (issue 49).

Whoever can write a run directory, its runs root or the executable store can replace a key kept
there (or have the driver write over it), and then sign executables that every host unpickles.
So a key path (``$TPU_ORCH_EXECUTABLES_KEY``, else the per-user default) held by one of them is
bad input: the driver exits 2 before it writes anything, naming the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.shared.errors import ConfigError
from orchestrator.shared.files import holder
from orchestrator.shared.host_env import ENV_KEY, key_path, store_dir


def written_dirs(cfg: Any, run_dir: Path, env: Mapping[str, str]) -> dict[str, Path]:
    """What the driver and its hosts write, by what to call it: the run directory, its runs
    root (the run directory's parent, unless that is the home directory or above it: then
    there is no folder of runs to speak of) and the executable store."""
    dirs = {"the run directory": run_dir}
    root, home = run_dir.parent, Path(os.path.expanduser("~")).absolute()
    if root != home and root not in home.parents:
        dirs["the runs root"] = root
    dirs["the executable store"] = Path(store_dir(cfg.compile.dir, run_dir, env))
    return dirs


def check_key_place(cfg: Any, run_dir: Path, env: Mapping[str, str] | None = None) -> None:
    """``ConfigError`` when the key that signs the executable store lies in a directory the
    run writes; nothing when the store is off (no key is used)."""
    env = os.environ if env is None else env
    if cfg.compile.cache != "on":
        return
    key = key_path(env)
    dirs = written_dirs(cfg, Path(run_dir).absolute(), env)
    inside = holder(key, dirs.values())
    if inside is None:
        return
    what = next(name for name, d in dirs.items() if d == inside)
    raise ConfigError(
        f"${ENV_KEY}", f"the executables key {key} lies in {what} ({inside}): whoever can write "
        "there could replace the key, or plant a link that has the driver write over it, and "
        "then sign executables every host runs",
        f"keep the key outside every directory the orchestrator writes: point ${ENV_KEY} at a "
        "private file elsewhere (`umask 077; openssl rand -hex 32 > ~/.config/tpu-orchestrator/"
        "executables.key`), or move run.run_dir / compile.dir away from the key")
