"""Goodput arithmetic over synthetic timelines: expected == actual, worked out by hand."""

from __future__ import annotations

import pytest

from orchestrator.metrics.goodput import CAUSES, compute_goodput, lost_step_records
from orchestrator.metrics.ledger import StepLedger
from tests.metrics.synthetic import T0, preempt_shrink_grow_run, step_record, transition


def _expected_badput(**nonzero: float) -> dict[str, float]:
    out = dict.fromkeys(CAUSES, 0.0)
    out.update(nonzero)
    return out


def test_preemption_shrink_grow_run_buckets_every_second():
    """Startup, compile, lost steps, drain, waiting, re-forms, restores, checkpoint, productive."""
    tl, steps, now = preempt_shrink_grow_run()
    g = compute_goodput(tl, steps, now=now, rolling_window_s=60.0)
    assert g.start == T0
    assert g.end == now
    assert g.wall_s == 160.0
    # RUNNING: 55 s (inc 0) - 1 s blocking save - 25 s lost (steps 51..100) + 15 s + 15 s
    assert g.productive_s == pytest.approx(59.0)
    assert g.badput_s == pytest.approx(_expected_badput(
        startup=10.0, compile=20.0, lost_steps=25.0, checkpoint=6.0, drain=3.0, release=2.0,
        waiting_for_capacity=20.0, reform=10.0, restore=5.0))
    assert g.productive_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
    assert g.goodput == pytest.approx(59.0 / 160.0)
    assert g.lost_steps == 50
    # rolling over [T0+100, T0+160]: RUNNING 115..130 and 145..160
    assert g.rolling_goodput == pytest.approx(30.0 / 60.0)


def test_per_slice_goodput_counts_membership_and_absence():
    """s1 leaves at the preemption, s2 joins at the grow; absent time is its own bucket."""
    tl, steps, now = preempt_shrink_grow_run()
    g = compute_goodput(tl, steps, now=now)
    assert set(g.per_slice) == {"s0", "s1", "s2"}
    s0, s1, s2 = g.per_slice["s0"], g.per_slice["s1"], g.per_slice["s2"]
    assert (s0.productive_s, s1.productive_s, s2.productive_s) == pytest.approx((59.0, 29.0, 15.0))
    assert (s0.badput_s["absent"], s1.badput_s["absent"], s2.badput_s["absent"]) == \
        pytest.approx((2.0, 82.0, 135.0))
    assert s1.badput_s["lost_steps"] == pytest.approx(25.0)
    assert s2.badput_s["reform"] == pytest.approx(5.0)
    assert s2.goodput == pytest.approx(15.0 / 160.0)
    for s in (s0, s1, s2):
        assert s.productive_s + sum(s.badput_s.values()) == pytest.approx(160.0)


def test_open_last_state_ends_at_now_and_terminal_state_at_once():
    """A run still going grows with the clock; a finished run does not."""
    tl, steps, now = preempt_shrink_grow_run()
    later = compute_goodput(tl, steps, now=now + 40)
    assert later.wall_s == 200.0
    assert later.productive_s == pytest.approx(99.0)
    done = [*tl, transition(16, "SUCCEEDED", "RUNNING", now, inc=2, slices=["s0", "s2"])]
    finished = compute_goodput(done, steps, now=now + 1000)
    assert finished.end == now
    assert finished.productive_s == pytest.approx(59.0)


def test_lost_steps_are_those_rolled_back_by_a_later_incarnation():
    """Steps 51..100 of incarnation 0 ran again after restoring step 50."""
    tl, steps, _ = preempt_shrink_grow_run()
    lost = lost_step_records(tl, steps)
    assert [(r.incarnation, r.step) for r in lost] == [(0, k) for k in range(51, 101)]


def test_duplicate_reports_in_one_incarnation_are_not_lost_steps():
    """Re-reporting a step within an incarnation is not a rollback."""
    tl = [transition(0, "RUNNING", None, T0, slices=["s0"])]
    steps = [step_record(1, T0 + 1, inc=0, slices=1), step_record(1, T0 + 1, inc=0, slices=1)]
    g = compute_goodput(tl, steps, now=T0 + 10)
    assert g.lost_steps == 0
    assert g.goodput == 1.0


def test_restart_step_falls_back_to_first_reported_step():
    """Without a step on the RUNNING transition, the first step an incarnation reports counts."""
    tl = [transition(0, "RUNNING", None, T0, slices=["s0"]),
          transition(1, "FORMING", "RUNNING", T0 + 10, inc=1, slices=["s0"], reason="host_lost"),
          transition(2, "RUNNING", "FORMING", T0 + 12, inc=1, slices=["s0"])]
    for row in tl:
        del row["step"]
    steps = [step_record(k, T0 + k, inc=0, slices=1, step_time=1.0) for k in range(1, 10)]
    steps += [step_record(k, T0 + 12 + k - 5, inc=1, slices=1, step_time=1.0)
              for k in range(6, 10)]
    g = compute_goodput(tl, steps, now=T0 + 16)
    assert g.lost_steps == 4  # steps 6..9 of incarnation 0
    assert g.badput_s["lost_steps"] == pytest.approx(4.0)
    assert g.badput_s["reform"] == pytest.approx(2.0)
    assert g.productive_s == pytest.approx(16.0 - 2.0 - 4.0)


def test_first_record_prev_duration_counts_as_startup():
    """Time spent before the first logged transition is attributed to the previous state."""
    tl = [{**transition(0, "FORMING", "PLANNING", T0 + 3, slices=["s0"]), "prev_duration_s": 3.0},
          transition(1, "RUNNING", "FORMING", T0 + 5, slices=["s0"])]
    g = compute_goodput(tl, [], now=T0 + 10)
    assert g.start == T0
    assert g.badput_s["startup"] == pytest.approx(5.0)
    assert g.productive_s == pytest.approx(5.0)


def test_empty_timeline_gives_zero_goodput():
    """No transitions yet: nothing to account, no division by zero."""
    g = compute_goodput([], [], now=T0)
    assert (g.wall_s, g.productive_s, g.goodput) == (0.0, 0.0, 0.0)


def test_unknown_states_count_as_idle_and_garbage_rows_are_skipped():
    """A state we don't know is idle badput; rows without state/at are ignored."""
    tl = [transition(0, "RUNNING", None, T0, slices=["s0"]),
          transition(1, "PAUSED_BY_SOMEONE", "RUNNING", T0 + 4, slices=["s0"]),
          {"state": "RUNNING"}, {"at": "yesterday", "state": "X"}]
    g = compute_goodput(tl, [], now=T0 + 10)
    assert g.badput_s["idle"] == pytest.approx(6.0)
    assert g.productive_s == pytest.approx(4.0)


def test_cumulative_series_ends_at_the_overall_goodput():
    """The time series' last cumulative sample is the run's goodput."""
    tl, steps, now = preempt_shrink_grow_run()
    g = compute_goodput(tl, steps, now=now, samples=50)
    assert len(g.series) == 50
    assert g.series[0].t == T0 and g.series[-1].t == now
    assert g.series[-1].cumulative == pytest.approx(g.goodput)
    assert all(0.0 <= s.cumulative <= 1.0 and 0.0 <= s.rolling <= 1.0 for s in g.series)


def test_ledger_merging_keeps_goodput_exact_when_rollbacks_are_recent():
    """Merged old spans give the same numbers as full records when rollbacks are recent."""
    tl, steps, now = preempt_shrink_grow_run()
    ledger = StepLedger(exact=100, span=7)  # the 100 steps since the rollback point stay exact
    for rec in steps:
        ledger.add(rec)
    assert len(ledger) < len(steps)
    merged = compute_goodput(tl, ledger.items(), now=now)
    full = compute_goodput(tl, steps, now=now)
    assert merged.badput_s == pytest.approx(full.badput_s)
    assert merged.productive_s == pytest.approx(full.productive_s)
    assert merged.lost_steps == full.lost_steps


def test_ledger_error_is_at_most_one_span_for_an_old_rollback():
    """A rollback reaching into merged spans misses at most the straddling span's time."""
    tl, steps, now = preempt_shrink_grow_run()
    ledger = StepLedger(exact=60, span=7)
    for rec in steps:
        ledger.add(rec)
    merged = compute_goodput(tl, ledger.items(), now=now)
    full = compute_goodput(tl, steps, now=now)
    assert 0.0 <= full.badput_s["lost_steps"] - merged.badput_s["lost_steps"] <= 7 * 0.5
    assert merged.productive_s + sum(merged.badput_s.values()) == pytest.approx(merged.wall_s)


PLANNING_AFTER = {"state": "PLANNING", "prev": "RELEASING",
                  "reason": "re-forming after spot_preemption: preemption_notice for ['abc']"}


@pytest.mark.parametrize(("t", "cause"), [
    ({**PLANNING_AFTER, "payload": {"type": "Planning", "cause": "host_lost", "grow": False}},
     "host_lost"),  # the payload, not the reason
    ({**PLANNING_AFTER, "payload": {"type": "Planning", "cause": None, "grow": True}}, "grow"),
    ({"state": "PLANNING", "prev": "WAITING_FOR_CAPACITY", "reason": "capacity returned",
      "payload": {"type": "Planning", "cause": None, "grow": False}}, None),
    ({"state": "FORMING", "prev": "PLANNING", "reason": "1 healthy slices"}, None),
    ({"state": "PLANNING", "prev": None, "reason": "run started"}, None),
    ({"state": "RUNNING", "prev": "COMPILING", "reason": "step compiled"}, None),
    # LEGACY: files written before issue 27 (no Planning payload): the reason's word
    ({**PLANNING_AFTER, "payload": None}, "spot_preemption"),
    ({"state": "FORMING", "prev": "WAITING_FOR_CAPACITY", "reason": "preempted: host 1"},
     "preempted"),
    ({"state": "FORMING", "prev": "BACKOFF", "reason": "!!!"}, "unknown"),
])
def test_a_timeline_line_gives_its_restart_cause(t, cause):
    """The report reads the typed payload; old files' lines fall back to the reason text."""
    from orchestrator.metrics.plots import restart_cause_of_line

    assert restart_cause_of_line(t) == cause


def test_a_hand_over_is_productive_time_and_its_lost_steps_are_counted():
    """HANDING_OVER: steps go on while a drain's copy reaches the replacement, so its time is
    productive, not idle; a step in it later rolled back is lost time like one in RUNNING."""
    s = ["s0"]
    tl = [transition(0, "PLANNING", None, T0, slices=s),
          transition(1, "RUNNING", "PLANNING", T0 + 10, slices=s),
          transition(2, "HANDING_OVER", "RUNNING", T0 + 30, slices=s, step=40),
          transition(3, "DRAINING", "HANDING_OVER", T0 + 50, slices=s, step=80),
          transition(4, "PLANNING", "DRAINING", T0 + 52, slices=s, step=78),
          transition(5, "RUNNING", "PLANNING", T0 + 60, inc=1, slices=s, step=78)]
    steps = [step_record(k, T0 + 10 + 0.5 * k, inc=0, slices=1) for k in range(1, 81)]
    g = compute_goodput(tl, steps, now=T0 + 70)
    # RUNNING 20 s + HANDING_OVER 20 s - steps 79, 80 (rolled back: inc 1 resumed at 78) + 10 s
    assert g.badput_s["idle"] == 0.0
    assert g.badput_s["lost_steps"] == pytest.approx(1.0)
    assert g.productive_s == pytest.approx(20.0 + 20.0 - 1.0 + 10.0)
    assert g.productive_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
