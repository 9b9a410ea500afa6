"""The executables key lives outside every directory the orchestrator writes (issue 49).

Whoever can write a run directory, its runs root, the executable store, the local cluster
tool's state directory or the emulated clusters' records can replace a key kept there (or have
the orchestrator write over it), and then sign executables that every host unpickles. So a key
path (``$TPU_ORCH_EXECUTABLES_KEY``, else the per-user default) held by one of them is bad
input: the driver exits 2 before it writes anything, naming the setting that moves the
directory. What other tools are told on their own command line (``cluster up --state-dir``,
autoresume's ``state_dir``, ``data prepare``'s output, an export's ``--to``) the driver cannot
know.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.cluster.local import STATE_DIR_ENV, default_state_dir
from orchestrator.raygroup.reaper import records_dir
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.files import holder
from orchestrator.shared.host_env import ENV_DIR, ENV_KEY, key_path, store_dir


def written_dirs(cfg: Any, run_dir: Path, env: Mapping[str, str]) -> dict[str, tuple[Path, str]]:
    """What the orchestrator writes, known from the run's config and environment, by what to
    call it: (the directory, the setting that moves it). The run directory and the store
    always; the folders around or beside them (the runs root, the cluster tool's state, the
    emulated clusters' records) unless one is the home directory or above it: no folder of
    runs or of state to speak of, and the per-user default key under ~/.config would be
    refused for nothing."""
    dirs = {"the run directory": (run_dir, "run.run_dir"),
            "the executable store": (Path(store_dir(cfg.compile.dir, run_dir, env)),
                                     f"compile.dir or ${ENV_DIR}")}
    folders = {"the runs root": (run_dir.parent, "run.run_dir"),
               "the local cluster tool's state directory": (default_state_dir(env),
                                                            f"${STATE_DIR_ENV}"),
               "the emulated clusters' records": (records_dir(), "$TMPDIR")}
    home = Path(os.path.expanduser("~")).absolute()
    dirs |= {name: place for name, place in folders.items() if not _home_or_above(place[0], home)}
    return {name: (Path(os.path.abspath(d)), setting) for name, (d, setting) in dirs.items()}


def _home_or_above(d: Path, home: Path) -> bool:
    d = Path(os.path.abspath(d))
    return d == home or d in home.parents


def check_key_place(cfg: Any, run_dir: Path, env: Mapping[str, str] | None = None) -> None:
    """``ConfigError`` when the key that signs the executable store lies in a directory the
    orchestrator writes; nothing when the store is off (no key is used)."""
    env = os.environ if env is None else env
    if cfg.compile.cache != "on":
        return
    key = key_path(env)
    dirs = written_dirs(cfg, Path(run_dir).absolute(), env)
    inside = holder(key, (d for d, _ in dirs.values()))
    if inside is None:
        return
    what, setting = next((name, s) for name, (d, s) in dirs.items() if d == inside)
    raise ConfigError(
        f"${ENV_KEY}", f"the executables key {key} lies in {what} ({inside}): whoever can write "
        "there could replace the key, or plant a link that has the orchestrator write over it, "
        "and then sign executables every host runs",
        f"keep the key outside every directory the orchestrator writes: point ${ENV_KEY} at a "
        "private file elsewhere (`umask 077; openssl rand -hex 32 > ~/.config/tpu-orchestrator/"
        f"executables.key`), or move {what} away from the key ({setting})")
