"""Which steps the RAM tier copies: every ``every`` steps. Pure: no holders are contacted. (The
bench's side-by-side mode, copies in alternate blocks only, is bench/ab_blocks.py's wrapper:
tests/bench/test_ab_blocks.py.)"""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from workers.ram.replicator import Replicator


def _replicator(every: int = 1) -> Replicator:
    return Replicator([], token="t", writer="n0", incarnation=1, source=0, sources=2,
                      every=every, keep=2, max_host_bytes=1 << 20)


def test_every_step_by_default_and_every_nth_otherwise():
    assert [s for s in range(1, 9) if _replicator().periodic_due(s)] == list(range(1, 9))
    assert [s for s in range(1, 9) if _replicator(every=3).periodic_due(s)] == [3, 6]


def test_the_bench_aid_is_no_setting():
    """Alternate blocks are the bench's (bench/ab_blocks.py), not a production setting."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["checkpoint.ram.ab_block_steps=10"])
    assert "checkpoint.ram.ab_block_steps" in str(info.value)
    assert "unknown setting" in str(info.value)
