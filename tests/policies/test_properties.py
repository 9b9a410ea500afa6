"""Invariants of the policies over generated observations (hypothesis, small and fast)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.causes import StopCause
from policies.preemption import (
    DeadlinePolicy,
    DrainKind,
    DrainObservation,
    PlacementKind,
    PlacementObservation,
    PlacementPolicy,
)
from policies.resize import BatchMode, BatchPlan, ResizeObservation, ResizePolicy
from policies.restart_budget import (
    GiveUp,
    Restart,
    RestartBudgetPolicy,
    RestartObservation,
    RestartRecord,
)

FAST = settings(max_examples=150, deadline=None)
causes = st.sampled_from(list(StopCause))
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@FAST
@given(cause=causes, hist=st.lists(st.tuples(causes, times), max_size=30), now=times,
       draw=st.floats(min_value=0, max_value=0.999), limit=st.integers(0, 10),
       jitter=st.floats(0, 1), window=st.sampled_from([0.0, 60.0, 3600.0]))
def test_budget_invariants(cause, hist, now, draw, limit, jitter, window):
    """Restart iff fewer than `limit` counted earlier stops; delay within [0, max_s]."""
    p = RestartBudgetPolicy(limits={c: limit for c in StopCause}, backoff_base_s=1.0,
                            backoff_max_s=30.0, jitter=jitter, window_s=window)
    history = tuple(RestartRecord(cause=c, at=t) for c, t in hist)
    d = p.decide(RestartObservation(cause=cause, now=now, history=history, jitter_draw=draw))
    used = p.count(cause, now, history)
    if used < limit:
        assert isinstance(d, Restart) and d.attempt == used + 1
        assert 0.0 <= d.delay_s <= 30.0 and d.until == now + d.delay_s
        assert (d.delay_s == 0.0) or not cause.announced
    else:
        assert isinstance(d, GiveUp) and d.setting.endswith(cause.value)


@FAST
@given(avail=st.sets(st.sampled_from("abcdefgh"), max_size=8), target=st.integers(1, 6),
       elastic=st.booleans(), min_slices=st.integers(1, 4), now=st.floats(0, 1000),
       since=st.one_of(st.none(), st.floats(0, 1000)), grace=st.sampled_from([0.0, 30.0]))
def test_placement_invariants(avail, target, elastic, min_slices, now, since, grace):
    """Never forms on a slice it was not offered, never above target, never below min."""
    since = None if since is None else min(since, now)
    p = PlacementPolicy(max_wait_s=300.0, elastic=elastic, min_slices=min_slices,
                        shrink_after_s=grace)
    d = p.decide(PlacementObservation(now=now, available_slices=tuple(sorted(avail)),
                                      target_slices=target, waiting_since=since))
    if d.kind is PlacementKind.FORM:
        assert len(d.slices) == target and set(d.slices) <= avail
    elif d.kind is PlacementKind.SHRINK:
        assert elastic and min_slices <= len(d.slices) < target and set(d.slices) == avail
    elif d.kind is PlacementKind.WAIT_FOR_REPLACEMENT:
        assert d.until is not None and d.until > now and d.needed == target - len(avail)
    else:
        assert len(avail) < target and "controller." in d.reason


@FAST
@given(now=st.floats(0, 100), left=st.floats(-10, 100), save=st.floats(0, 20),
       step_s=st.floats(0, 5), step=st.integers(0, 1000), committed=st.one_of(
           st.none(), st.integers(0, 1000)), mode=st.sampled_from(["fallback", "save_anyway"]))
def test_deadline_invariants(now, left, save, step_s, step, committed, mode):
    """Lost steps are never negative, SAVE only with enough time, fallback restores committed."""
    committed = None if committed is None else min(committed, step)
    d = DeadlinePolicy(on_short_deadline=mode).decide(DrainObservation(
        now=now, deadline=now + left, expected_save_s=save, expected_step_s=step_s, step=step,
        last_committed_step=committed))
    assert d.lost_steps >= 0 and d.steps_at_risk >= 0
    if d.kind is DrainKind.SAVE:
        assert d.time_left_s >= d.needed_s and d.lost_steps == 0
    if d.kind is DrainKind.FALL_BACK_TO_LAST_CHECKPOINT:
        assert d.restore_step == committed
        assert d.lost_steps == step - (committed or 0)
    if d.kind is DrainKind.SAVE_ANYWAY:
        assert mode == "save_anyway" and d.time_left_s > 0


@FAST
@given(micro=st.integers(1, 64), base_dp=st.integers(1, 16), new_dp=st.integers(1, 16))
def test_keep_preserves_global_batch(micro, base_dp, new_dp):
    """KEEP never changes the global batch or the learning rate when it finds a plan."""
    base = micro * base_dp
    d = ResizePolicy(mode=BatchMode.KEEP).decide(
        ResizeObservation(base_global_batch=base, base_dp=base_dp, new_dp=new_dp))
    if isinstance(d, BatchPlan):
        assert d.global_batch == base == d.micro_global_batch * d.accum_steps
        assert d.lr_scale == 1.0 and d.dp == new_dp
    else:
        assert base_dp % new_dp != 0
