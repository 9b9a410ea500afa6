"""Which steps the RAM tier copies: every ``every`` steps, or only in alternate blocks (the
bench's side-by-side mode). Pure: no holders are contacted."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from workers.ram.replicator import Replicator


def _replicator(every: int = 1, ab: int = 0) -> Replicator:
    return Replicator([], token="t", writer="n0", incarnation=1, source=0, sources=2,
                      every=every, keep=2, max_host_bytes=1 << 20, ab_block_steps=ab)


def test_every_step_by_default_and_every_nth_otherwise():
    assert [s for s in range(1, 9) if _replicator().periodic_due(s)] == list(range(1, 9))
    assert [s for s in range(1, 9) if _replicator(every=3).periodic_due(s)] == [3, 6]


def test_alternate_blocks_copy_in_the_first_block_of_each_pair():
    due = [s for s in range(1, 31) if _replicator(ab=5).periodic_due(s)]
    assert due == [*range(1, 6), *range(11, 16), *range(21, 26)]


def test_a_negative_block_size_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["checkpoint.ram.ab_block_steps=-1"])
    assert "checkpoint.ram.ab_block_steps" in str(info.value) and "set e.g. 10" in str(info.value)
