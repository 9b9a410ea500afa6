"""Per-cause restart budgets, backoff and jitter."""

from __future__ import annotations

import pytest

from policies.causes import StopCause
from policies.restart_budget import (
    GiveUp,
    Restart,
    RestartBudgetPolicy,
    RestartObservation,
    RestartRecord,
)

LOST = StopCause.HOST_LOST
SPOT = StopCause.SPOT_PREEMPTION


def policy(**kw) -> RestartBudgetPolicy:
    args = dict(limits={LOST: 3, SPOT: 2, StopCause.APPLICATION_ERROR: 0}, backoff_base_s=1.0,
                backoff_max_s=10.0, backoff_multiplier=2.0, jitter=0.0)
    args.update(kw)
    return RestartBudgetPolicy(**args)


def history(*items: tuple[StopCause, float]) -> tuple[RestartRecord, ...]:
    return tuple(RestartRecord(cause=c, at=t) for c, t in items)


def test_exponential_backoff_per_attempt():
    """Delays double per attempt of the same cause, from the injected clock."""
    p = policy(limits={LOST: 10})
    delays = []
    hist: tuple[RestartRecord, ...] = ()
    for i in range(6):
        d = p.decide(RestartObservation(cause=LOST, now=100.0 + i, history=hist))
        assert isinstance(d, Restart) and d.attempt == i + 1
        assert d.until == 100.0 + i + d.delay_s
        delays.append(d.delay_s)
        hist += (RestartRecord(cause=LOST, at=100.0 + i),)
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_budgets_are_separate_per_cause():
    """Spot preemptions do not consume the lost-host budget and vice versa."""
    p = policy()
    hist = history((SPOT, 1.0), (SPOT, 2.0))
    assert isinstance(p.decide(RestartObservation(cause=SPOT, now=3.0, history=hist)), GiveUp)
    d = p.decide(RestartObservation(cause=LOST, now=3.0, history=hist))
    assert isinstance(d, Restart) and d.attempt == 1


def test_exhausted_budget_names_cause_count_and_setting():
    """The terminal decision says which cause, how many times, and which setting to raise."""
    p = policy()
    hist = history((LOST, 1.0), (LOST, 2.0), (LOST, 3.0))
    d = p.decide(RestartObservation(cause=LOST, now=4.0, history=hist))
    assert isinstance(d, GiveUp)
    assert (d.cause, d.count, d.limit, d.setting) == (LOST, 4, 3, "controller.budgets.host_lost")
    assert "host_lost stop #4" in d.reason
    assert "budget of 3" in d.reason and "raise controller.budgets.host_lost" in d.reason


def test_zero_budget_and_unlisted_cause_give_up_at_once():
    """A cause with budget 0 (or missing from the limits) stops the run on its first stop."""
    p = policy()
    assert isinstance(
        p.decide(RestartObservation(cause=StopCause.APPLICATION_ERROR, now=0.0)), GiveUp)
    assert isinstance(p.decide(RestartObservation(cause=StopCause.TIMEOUT, now=0.0)), GiveUp)


def test_window_forgets_old_restarts():
    """With a window, restarts older than window_s no longer count."""
    p = policy(window_s=3600.0)
    hist = history((LOST, 0.0), (LOST, 10.0), (LOST, 20.0))
    assert isinstance(p.decide(RestartObservation(cause=LOST, now=3000.0, history=hist)), GiveUp)
    d = p.decide(RestartObservation(cause=LOST, now=3605.0, history=hist))
    assert isinstance(d, Restart) and d.attempt == 3
    d = p.decide(RestartObservation(cause=LOST, now=3621.0, history=hist))
    assert isinstance(d, Restart) and d.attempt == 1
    g = p.decide(RestartObservation(cause=LOST, now=100.0, history=hist))
    assert isinstance(g, GiveUp) and "within 3600s" in g.reason


def test_announced_causes_skip_backoff():
    """A drained, saved preemption goes straight back to planning (delay 0) unless configured."""
    d = policy().decide(RestartObservation(cause=SPOT, now=5.0))
    assert isinstance(d, Restart) and d.delay_s == 0.0 and d.until == 5.0
    d = policy(backoff_announced=True).decide(RestartObservation(cause=SPOT, now=5.0))
    assert isinstance(d, Restart) and d.delay_s == 1.0


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 0.75), (0.5, 1.0), (0.75, 1.125)])
def test_jitter_uses_injected_draw(draw, expected):
    """Jitter spreads the delay by ±jitter using the draw passed in (deterministic)."""
    d = policy(jitter=0.25).decide(RestartObservation(cause=LOST, now=0.0, jitter_draw=draw))
    assert isinstance(d, Restart) and d.delay_s == pytest.approx(expected)


def test_jitter_never_exceeds_max():
    """The jittered delay stays within backoff_max_s."""
    p = policy(jitter=1.0, limits={LOST: 100})
    hist = history(*[(LOST, float(i)) for i in range(20)])
    d = p.decide(RestartObservation(cause=LOST, now=30.0, history=hist, jitter_draw=0.999))
    assert isinstance(d, Restart) and d.delay_s <= 10.0


def test_huge_attempt_counts_do_not_overflow():
    """Thousands of earlier restarts still give a finite, capped delay."""
    p = policy(limits={LOST: 10_000})
    hist = history(*[(LOST, 0.0)] * 5000)
    d = p.decide(RestartObservation(cause=LOST, now=1.0, history=hist))
    assert isinstance(d, Restart) and d.delay_s == 10.0


@pytest.mark.parametrize(
    "kw",
    [dict(backoff_base_s=-1.0), dict(backoff_max_s=0.5), dict(backoff_multiplier=0.5),
     dict(jitter=1.5), dict(window_s=-1.0)],
)
def test_invalid_policy_rejected(kw):
    """Nonsense parameters are refused at construction."""
    with pytest.raises(ValueError):
        policy(**kw)


def test_jitter_draw_validated():
    """A draw outside [0, 1) is a caller bug."""
    with pytest.raises(ValueError):
        RestartObservation(cause=LOST, now=0.0, jitter_draw=1.0)


def test_a_hot_spare_skips_the_first_backoff_but_not_the_budget_or_later_ones():
    p = policy()
    first = p.decide(RestartObservation(cause=StopCause.HOST_LOST, now=100.0, hot_spare=True))
    assert isinstance(first, Restart) and first.delay_s == 0.0
    again = p.decide(RestartObservation(cause=StopCause.HOST_LOST, now=101.0, hot_spare=True,
                                        history=history((StopCause.HOST_LOST, 100.0))))
    assert isinstance(again, Restart) and again.delay_s > 0
