"""The settings of a prepared-data source (``workers.input.open_source``): plain data, so a
config section or a task's settings dataclass can hold them (``data: DataSettings | None``).

Errors name ``task.data.<field>`` (``SETTING``), where a task's settings keep them;
a section elsewhere passes its own prefix to ``validate_data_settings``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from orchestrator.shared.errors import ConfigError

SETTING = "task.data"


@dataclass(frozen=True, kw_only=True)
class DataSettings:
    dir: str
    """A directory written by ``python -m orchestrator.data prepare`` (local or ``gs://``)."""
    shuffle: bool = True
    """A seeded global shuffle, anew each epoch; off reads records in order."""
    verify: Literal["auto", "full", "quick", "off"] = "auto"
    """Check the shards against the manifest when the source opens (``auto``: every byte up to
    1 GiB, sizes and edge hashes above; ``off`` only for data checked another way)."""
    tokenizer_sha256: str | None = None
    """The tokenizer the run expects (its file's SHA-256); data of another is refused."""
    prefetch_steps: int = 2
    """Steps read ahead on background threads (0: read in the step's thread)."""
    read_threads: int = 2
    read_timeout_s: float = 120.0
    """A read not done within this is an error (a stalled bucket never hangs a host)."""
    trace_dir: str | None = None
    """Tests: each process appends the sample ids of every read to
    ``<trace_dir>/samples-<host>-<pid>.jsonl``."""

    def __post_init__(self) -> None:
        validate_data_settings(self, SETTING)


def validate_data_settings(s: DataSettings, prefix: str) -> None:
    def bad(name: str, problem: str, fix: str) -> None:
        raise ConfigError(f"{prefix}.{name}", problem, fix)

    if not isinstance(s.dir, str) or not s.dir.strip():
        bad("dir", f"{s.dir!r} is not a path", "give the directory `python -m "
            "orchestrator.data prepare --out DIR` wrote (local or gs://)")
    if s.verify not in ("auto", "full", "quick", "off"):
        bad("verify", f"{s.verify!r} is not auto, full, quick or off", "use auto")
    sha = s.tokenizer_sha256
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        bad("tokenizer_sha256", f"{sha!r} is not a lowercase hex SHA-256",
            "copy tokenizer.sha256 from the data's manifest.json, or leave it unset")
    for name in ("prefetch_steps", "read_threads"):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 64:
            bad(name, f"{value!r} is not a whole number in [0, 64]", f"set {name} to 0..64")
    if s.prefetch_steps and not s.read_threads:
        bad("read_threads", "0 threads cannot read ahead", "set read_threads >= 1, or "
            "prefetch_steps=0")
    if not isinstance(s.read_timeout_s, int | float) or not s.read_timeout_s > 0:
        bad("read_timeout_s", f"{s.read_timeout_s!r} is not a positive number of seconds",
            "set it to 120 (or more for slow storage)")


FIELDS = tuple(f.name for f in fields(DataSettings))
