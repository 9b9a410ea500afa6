"""``checkpoint.ram.every: auto``: the copy interval from copy cost, step time and failures."""

import pytest

from policies.ram_interval import IntervalObservation, RamIntervalPolicy


def obs(step_s, copy_s, current=1, failures=0, observed_s=0.0):
    return IntervalObservation(step_s=step_s, copy_s=copy_s, current=current,
                               failures=failures, observed_s=observed_s)


def test_not_measured_keeps_the_interval_in_force():
    got = RamIntervalPolicy().choose(obs(None, None, current=4))
    assert got.every == 4 and "not measured" in got.reason and got.overhead is None


def test_a_cheap_copy_is_made_every_step():
    got = RamIntervalPolicy().choose(obs(0.05, 0.0004))  # 0.8 % of a step
    assert got.every == 1
    assert got.overhead == pytest.approx(0.008)
    assert "0.80%" in got.reason and "budget 2%" in got.reason


@pytest.mark.parametrize(("copy_s", "every"), [(0.01, 1), (0.011, 2), (0.05, 8), (0.3, 32)])
def test_a_large_model_copies_every_k_steps_within_the_budget(copy_s, every):
    got = RamIntervalPolicy().choose(obs(0.5, copy_s))
    assert got.every == every
    assert got.overhead <= 0.02 + 1e-12
    if every > 1:  # the next more frequent interval would break the budget
        assert copy_s / (every // 2 * 0.5) > 0.02
        assert f"every {every // 2} would cost" in got.reason


def test_the_wait_for_the_previous_copy_counts_only_where_an_interval_leaves_it():
    """1 GiB per host here: a pack of 0.2 s in a 2.85 s step, and a copy delivered 3.2 s after
    its pack. Every step, each copy would also wait 0.35 s for the one before; every 4 steps
    none waits, and 0.2 s / 4 steps is within the budget. Priced as one blocking figure (the
    wait measured every step folded into the pack), the same copies asked for every 16."""
    got = RamIntervalPolicy().choose(IntervalObservation(step_s=2.85, copy_s=0.2, current=1,
                                                         deliver_s=3.2))
    assert got.every == 4 and got.overhead == pytest.approx(0.2 / (4 * 2.85))
    assert "waits for the one before it until 3200 ms" in got.reason
    assert "every 2 would cost" in got.reason
    folded = RamIntervalPolicy().choose(obs(2.85, 0.2 + 0.35))
    assert folded.every == 16
    slow = RamIntervalPolicy().choose(IntervalObservation(step_s=1.0, copy_s=0.01, current=1,
                                                          deliver_s=3.5))
    assert slow.every == 4  # every 2 waits 1.5 s of 2; every 4 none


def test_lowering_waits_for_a_margin_so_noise_does_not_flap():
    p = RamIntervalPolicy()
    # at every=2 the measured cost fits every=1 only just (1.9 %): kept
    assert p.choose(obs(0.5, 0.0095, current=2)).every == 2
    # well within (1 %): lowered
    assert p.choose(obs(0.5, 0.005, current=2)).every == 1
    # raising never waits
    assert p.choose(obs(0.5, 0.012, current=1)).every == 2


def test_a_known_rare_failure_rate_stretches_the_interval_young_daly():
    # 0.1 failures/h: MTBF 36,000 s; sqrt(2 * 0.004 * 36000) = 16.97 s = 33.9 steps of 0.5 s
    p = RamIntervalPolicy(failures_per_hour=0.1)
    got = p.choose(obs(0.5, 0.004))
    assert got.young_every == pytest.approx(33.94, abs=0.01)
    assert got.every == 32 and got.rate_source == "configured"
    assert "Young/Daly" in got.reason


def test_the_stretch_stops_at_the_durable_interval():
    got = RamIntervalPolicy(failures_per_hour=0.1, max_every=10).choose(obs(0.5, 0.004))
    assert got.every == 10


def test_frequent_failures_never_push_the_copies_past_the_budget():
    # one failure a minute: Young/Daly says every 2.2 steps, but the budget needs 8
    got = RamIntervalPolicy(failures_per_hour=60).choose(obs(0.5, 0.05))
    assert got.every == 8 and got.overhead <= 0.02


def test_an_observed_failure_counts_when_none_is_configured():
    p = RamIntervalPolicy()
    assert p.choose(obs(0.5, 0.004)).rate_source == "none"
    got = p.choose(obs(0.5, 0.004, failures=1, observed_s=3600.0))
    assert got.rate_source == "observed" and got.failures_per_hour == pytest.approx(1.0)
    # sqrt(2 * 0.004 * 3600) = 5.37 s = 10.7 steps: every 8
    assert got.every == 8


def test_bad_budget_is_refused():
    with pytest.raises(ValueError):
        RamIntervalPolicy(max_overhead=0)
