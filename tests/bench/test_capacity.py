"""Figure 4's capacity model for the restart baselines (pure)."""

from __future__ import annotations

from bench.schedule import Capacity


def test_a_spare_is_free_at_once_and_the_next_loss_waits_for_the_return():
    c = Capacity(spare=1, replace_after_s=60.0)
    c.lose(100.0)
    assert c.ready_at(100.5) == 100.5  # the spare
    c.lose(130.0)
    assert c.ready_at(130.5) == 160.0  # the first slice's replacement
    assert c.ready_at(160.0) == 160.0


def test_without_spares_every_loss_waits_and_returns_count_once():
    c = Capacity(spare=0, replace_after_s=30.0)
    c.lose(10.0)
    assert c.ready_at(11.0) == 40.0
    assert c.ready_at(40.0) == 40.0
    c.lose(50.0)
    assert c.ready_at(50.0) == 80.0
    assert c.ready_at(200.0) == 200.0 and c.returns == []
