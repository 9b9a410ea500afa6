"""Fixed and Young/Daly save intervals, save-on-request, and their combination."""

from __future__ import annotations

import math

import pytest

from policies.checkpoint_interval import (
    AnyOf,
    EverySeconds,
    FixedInterval,
    SaveObservation,
    YoungDaly,
    any_of,
    every_seconds,
    every_steps,
)


def saves(policy, steps: range, **kw) -> list[int]:
    """Steps at which the policy saves, feeding back its own saves."""
    last: int | None = None
    out = []
    for step in steps:
        if policy.decide(SaveObservation(step=step, last_save_step=last, **kw)).save:
            out.append(step)
            last = step
    return out


def test_fixed_interval_saves_on_multiples():
    """every_steps=5 saves at 5, 10, 15, 20 and never at step 0."""
    assert saves(FixedInterval(every_steps=5), range(0, 21)) == [5, 10, 15, 20]


def test_fixed_interval_after_fallback_restore():
    """Restored at 7 after a fall-back, it saves again at the next multiple (10)."""
    p = FixedInterval(every_steps=5)
    assert not p.decide(SaveObservation(step=7, last_save_step=5)).save
    assert p.decide(SaveObservation(step=10, last_save_step=5)).save


def test_fixed_interval_never_twice_at_one_step():
    """A step that is already saved is not saved again."""
    assert not FixedInterval(every_steps=5).decide(SaveObservation(step=10, last_save_step=10)).save


def test_young_daly_formula():
    """interval = sqrt(2 * C * M) seconds / step time, with M from prior + observations."""
    p = YoungDaly(initial_every_steps=50, min_steps=1, max_steps=100_000, prior_mtbi_s=3600.0,
                  prior_weight=1.0)
    # no interruptions yet, one hour observed: M = (3600 + 3600) / 1 = 7200
    obs = SaveObservation(step=1, last_save_step=0, step_time_s=0.5, save_cost_s=2.0,
                          interruptions=0, observed_s=3600.0)
    assert p.mtbi_s(0, 3600.0) == 7200.0
    assert p.interval_steps(obs) == round(math.sqrt(2 * 2.0 * 7200.0) / 0.5)  # 339
    # three interruptions in that hour: M = 7200 / 4 = 1800 -> shorter interval
    obs3 = SaveObservation(step=1, last_save_step=0, step_time_s=0.5, save_cost_s=2.0,
                           interruptions=3, observed_s=3600.0)
    assert p.interval_steps(obs3) == round(math.sqrt(2 * 2.0 * 1800.0) / 0.5)  # 170
    assert p.interval_steps(obs3) < p.interval_steps(obs)


def test_young_daly_clamps_and_initial():
    """Unmeasured -> initial; measured results are clamped to [min_steps, max_steps]."""
    p = YoungDaly(initial_every_steps=50, min_steps=10, max_steps=200)
    assert p.interval_steps(SaveObservation(step=1, last_save_step=0)) == 50
    tiny = SaveObservation(step=1, last_save_step=0, step_time_s=10.0, save_cost_s=0.001)
    huge = SaveObservation(step=1, last_save_step=0, step_time_s=0.001, save_cost_s=100.0)
    assert p.interval_steps(tiny) == 10
    assert p.interval_steps(huge) == 200


def test_young_daly_decides_on_its_interval():
    """It saves once steps since the last save reach the computed interval."""
    p = YoungDaly(initial_every_steps=20, min_steps=5, max_steps=100)
    kw = dict(step_time_s=1.0, save_cost_s=0.5, interruptions=9, observed_s=100.0)
    # M = (3600 + 100) / 10 = 370 -> sqrt(2*0.5*370) = 19.2 s -> 19 steps
    assert saves(p, range(0, 60), **kw) == [19, 38, 57]


@pytest.mark.parametrize(
    "kw",
    [dict(initial_every_steps=5, min_steps=10, max_steps=100),
     dict(initial_every_steps=50, min_steps=10, max_steps=20),
     dict(initial_every_steps=50, min_steps=10, max_steps=100, prior_mtbi_s=0.0)],
)
def test_young_daly_invalid(kw):
    """Misordered bounds or a non-positive prior are refused."""
    with pytest.raises(ValueError):
        YoungDaly(**kw)


def test_every_seconds_follows_the_measured_step_time():
    """60 s at 0.5 s per step is every 120 steps; before a step time, no interval at all."""
    p = every_seconds(60.0)
    assert p.decide(SaveObservation(step=5, last_save_step=None)).interval_steps is None
    assert saves(p, range(0, 250), step_time_s=0.5) == [120, 240]
    with pytest.raises(ValueError):
        EverySeconds(seconds=0)


def test_any_of_saves_when_either_rule_is_due_at_the_shorter_interval():
    """Steps every 100 or 10 s (20 steps at 0.5 s): the time rule wins; without a step time
    the step rule alone decides."""
    p = any_of(every_steps(100), every_seconds(10.0))
    assert isinstance(p, AnyOf)
    d = p.decide(SaveObservation(step=20, last_save_step=0, step_time_s=0.5))
    assert d.save and d.interval_steps == 20 and d.reason == "every 10s (20 steps)"
    d = p.decide(SaveObservation(step=20, last_save_step=0))
    assert not d.save and d.interval_steps == 100 and d.reason == "not due"
    assert saves(p, range(0, 101)) == [100]
    with pytest.raises(ValueError):
        any_of()


def test_any_of_is_open_to_rules_it_does_not_know():
    """The protocol is open: any object with ``decide`` combines."""

    class OnlyAt7:
        def decide(self, observation):
            return FixedInterval(every_steps=7).decide(observation)

    assert saves(any_of(OnlyAt7(), YoungDaly(initial_every_steps=50, min_steps=1,
                                             max_steps=100)), range(0, 22)) == [7, 14, 21]
