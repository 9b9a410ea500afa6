"""A config file or an override that is hostile in shape (issue 49, the lows on config): every one
is a ConfigError naming the setting and the fix, before it costs memory, never a ValueError or
RecursionError out of the loader. The driver, autoresume and the simulator all load through
``orchestrator/shared/configtools`` (``bounded_yaml``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from orchestrator.autoresume.config import load as load_autoresume
from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError


def alias_bomb(levels: int = 6) -> str:
    """Six lines that expand to a million values when copied."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"bogus: *a{levels - 1}"]) + "\n"


def test_alias_bomb_is_refused_before_it_expands(tmp_path):
    """The bomb is refused as a ConfigError about aliases, and loading it costs < 10 MB (it
    was expanded whole before its unknown keys were refused)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"`--config`.*aliases counted") as err:
            load_config(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "Fix:" in str(err.value) and peak < 10 << 20


@pytest.mark.parametrize("text,setting,problem", [
    ("run:\n  total_steps: " + "9" * 5000 + "\n", "--config", "integer of 5000 digits"),
    ("run:\n  seed: " + "[" * 5000 + "]" * 5000 + "\n", "--config", "nests deeper than"),
    ("a: &a [*a]\n", "--config", "cycle"),
])
def test_hostile_config_file_is_a_config_error(tmp_path, text, setting, problem):
    """A 5,000-digit integer, deep nesting, a self-referencing alias: ConfigError, setting named."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as err:
        load_config(str(path))
    assert err.value.setting == setting


@pytest.mark.parametrize("override,setting,problem", [
    ("run.total_steps=" + "9" * 5000, "run.total_steps", "integer of 5000 digits"),
    ("task.settings=" + "[" * 100_000 + "]" * 100_000, "task.settings", "nests deeper than"),
    ("task.settings." + ".".join(["a"] * 100_000) + "=1", None, "dotted parts"),
])
def test_hostile_override_is_a_config_error(override, setting, problem):
    """The same shapes as overrides (driver and autoresume config): ConfigError, never
    ValueError or RecursionError."""
    for load in (lambda o: load_config(None, [o]), lambda o: load_autoresume(None, [o])):
        with pytest.raises(ConfigError, match=problem) as err:
            load(override)
        if setting is not None:
            assert err.value.setting == setting


def test_oversized_config_file_is_refused_unread(tmp_path):
    """A config file over 1 MiB is refused by its size."""
    path = Path(tmp_path / "big.yaml")
    path.write_text("run:\n  name: x\n" + "#" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="over the"):
        load_config(str(path))
