"""Placement (form/shrink/wait/fail), grow at a checkpoint boundary, and the deadline decision."""

from __future__ import annotations

import pytest

from policies.preemption import (
    DeadlinePolicy,
    DrainKind,
    DrainObservation,
    GrowKind,
    GrowObservation,
    GrowPolicy,
    PlacementKind,
    PlacementObservation,
    PlacementPolicy,
)

# --- placement -------------------------------------------------------------------------------


def test_form_on_target_when_capacity_is_back():
    """Enough slices: form on exactly target_slices of them (sorted, deterministic)."""
    p = PlacementPolicy(max_wait_s=600.0, elastic=True)
    d = p.decide(PlacementObservation(now=0.0, available_slices=("c", "a", "b"), target_slices=2))
    assert (d.kind, d.slices) == (PlacementKind.FORM, ("a", "b"))


def test_not_elastic_waits_then_fails():
    """Without elasticity: wait up to max_wait_s for replacements, then fail with the setting."""
    p = PlacementPolicy(max_wait_s=600.0, elastic=False)
    d = p.decide(PlacementObservation(now=100.0, available_slices=("a",), target_slices=2,
                                      waiting_since=None))
    assert (d.kind, d.needed, d.until) == (PlacementKind.WAIT_FOR_REPLACEMENT, 1, 700.0)
    d = p.decide(PlacementObservation(now=699.0, available_slices=("a",), target_slices=2,
                                      waiting_since=100.0))
    assert d.kind is PlacementKind.WAIT_FOR_REPLACEMENT
    d = p.decide(PlacementObservation(now=700.0, available_slices=("a",), target_slices=2,
                                      waiting_since=100.0))
    assert d.kind is PlacementKind.FAIL
    assert "controller.max_wait_for_capacity_s" in d.reason and "elastic off" in d.reason


def test_elastic_shrinks_at_once_by_default():
    """Elastic with shrink_after_s=0: continue on the slices left (DCN axis shrinks)."""
    p = PlacementPolicy(max_wait_s=600.0, elastic=True, min_slices=1)
    d = p.decide(PlacementObservation(now=0.0, available_slices=("b",), target_slices=2))
    assert (d.kind, d.slices, d.needed) == (PlacementKind.SHRINK, ("b",), 1)


def test_elastic_waits_grace_period_before_shrinking():
    """shrink_after_s gives replacements a chance before paying for a smaller mesh."""
    p = PlacementPolicy(max_wait_s=600.0, elastic=True, min_slices=1, shrink_after_s=60.0)
    d = p.decide(PlacementObservation(now=10.0, available_slices=("b",), target_slices=2,
                                      waiting_since=0.0))
    assert (d.kind, d.until) == (PlacementKind.WAIT_FOR_REPLACEMENT, 60.0)
    d = p.decide(PlacementObservation(now=60.0, available_slices=("b",), target_slices=2,
                                      waiting_since=0.0))
    assert d.kind is PlacementKind.SHRINK


def test_elastic_below_min_slices_waits_then_fails():
    """Fewer slices than min_slices: wait (bounded) like the non-elastic case."""
    p = PlacementPolicy(max_wait_s=120.0, elastic=True, min_slices=2)
    d = p.decide(PlacementObservation(now=0.0, available_slices=("a",), target_slices=3))
    assert (d.kind, d.needed) == (PlacementKind.WAIT_FOR_REPLACEMENT, 2)
    d = p.decide(PlacementObservation(now=130.0, available_slices=("a",), target_slices=3,
                                      waiting_since=0.0))
    assert d.kind is PlacementKind.FAIL and "elastic min 2" in d.reason


def test_no_capacity_at_all():
    """Notice for every host at once: nothing left, so wait, never shrink to zero."""
    p = PlacementPolicy(max_wait_s=30.0, elastic=True, min_slices=1)
    d = p.decide(PlacementObservation(now=0.0, available_slices=(), target_slices=2))
    assert (d.kind, d.needed) == (PlacementKind.WAIT_FOR_REPLACEMENT, 2)


# --- grow ------------------------------------------------------------------------------------


def grow_obs(**kw) -> GrowObservation:
    args = dict(now=100.0, current_slices=("b",), spare_slices=("c",), target_slices=2,
                step=40, last_committed_step=30)
    args.update(kw)
    return GrowObservation(**args)


def test_grow_only_at_committed_checkpoint():
    """Between checkpoints the run holds; at a committed step it grows onto the spare slice."""
    p = GrowPolicy()
    d = p.decide(grow_obs())
    assert (d.kind, d.slices) == (GrowKind.HOLD, ("b", "c"))
    d = p.decide(grow_obs(step=40, last_committed_step=40))
    assert (d.kind, d.slices) == (GrowKind.GROW, ("b", "c"))


def test_grow_at_a_save_step_whose_async_save_is_in_flight():
    """A save that started at this boundary is the checkpoint the grow waits for (the grow's
    blocking save waits for it to commit); one started earlier is not."""
    p = GrowPolicy()
    assert p.decide(grow_obs(step=40, save_started_step=40)).kind is GrowKind.GROW
    assert p.decide(grow_obs(step=40, save_started_step=35)).kind is GrowKind.HOLD


def test_grow_can_force_a_save():
    """With wait_for_checkpoint off, the policy asks for a save and then grows."""
    d = GrowPolicy(wait_for_checkpoint=False).decide(grow_obs())
    assert d.kind is GrowKind.SAVE_THEN_GROW


def test_grow_never_past_target_and_not_when_disabled():
    """Grows only up to the target; holds when disabled, full, or no spare capacity."""
    d = GrowPolicy().decide(grow_obs(current_slices=("a",), spare_slices=("d", "c", "e"),
                                     target_slices=3, last_committed_step=40))
    assert d.slices == ("a", "c", "d")
    assert GrowPolicy(enabled=False).decide(grow_obs(last_committed_step=40)).kind is GrowKind.HOLD
    assert GrowPolicy().decide(grow_obs(spare_slices=())).kind is GrowKind.HOLD
    assert GrowPolicy().decide(grow_obs(current_slices=("a", "b"))).kind is GrowKind.HOLD


def test_grow_respects_min_resize_interval():
    """Capacity that flaps does not make the run resize again right after a resize."""
    p = GrowPolicy(min_interval_s=300.0)
    d = p.decide(grow_obs(last_committed_step=40, last_resize_at=0.0, now=100.0))
    assert d.kind is GrowKind.HOLD and "last resize" in d.reason
    d = p.decide(grow_obs(last_committed_step=40, last_resize_at=0.0, now=300.0))
    assert d.kind is GrowKind.GROW


# --- deadline --------------------------------------------------------------------------------


def drain_obs(**kw) -> DrainObservation:
    args = dict(now=0.0, deadline=30.0, expected_save_s=2.0, expected_step_s=0.5, step=120,
                last_committed_step=100)
    args.update(kw)
    return DrainObservation(**args)


def test_enough_time_saves_with_zero_loss():
    """30 s left vs 0.5 + 2 x 1.5 = 3.5 s needed: save, nothing lost, restore at this step."""
    d = DeadlinePolicy().decide(drain_obs())
    assert (d.kind, d.lost_steps, d.restore_step) == (DrainKind.SAVE, 0, 120)
    assert d.needed_s == pytest.approx(3.5) and d.time_left_s == 30.0


def test_short_deadline_falls_back_and_counts_lost_steps():
    """Deadline too short: fall back to the last checkpoint, losing step - committed steps."""
    d = DeadlinePolicy(on_short_deadline="fallback").decide(drain_obs(deadline=3.0))
    assert (d.kind, d.lost_steps, d.restore_step) == (
        DrainKind.FALL_BACK_TO_LAST_CHECKPOINT, 20, 100)
    assert "losing 20 step(s)" in d.reason


def test_short_deadline_save_anyway_reports_risk():
    """save_anyway gambles: nothing lost if it finishes, 20 steps at risk otherwise."""
    d = DeadlinePolicy(on_short_deadline="save_anyway").decide(drain_obs(deadline=3.0))
    assert (d.kind, d.lost_steps, d.steps_at_risk, d.restore_step) == (
        DrainKind.SAVE_ANYWAY, 0, 20, 120)


def test_past_deadline_always_falls_back():
    """A late notice (deadline passed) never tries to save, even with save_anyway."""
    d = DeadlinePolicy(on_short_deadline="save_anyway").decide(drain_obs(now=31.0))
    assert d.kind is DrainKind.FALL_BACK_TO_LAST_CHECKPOINT and "deadline passed" in d.reason


def test_no_checkpoint_yet_loses_everything_on_fallback():
    """Without any committed checkpoint, falling back restarts from step 0."""
    d = DeadlinePolicy().decide(drain_obs(deadline=1.0, last_committed_step=None))
    assert (d.lost_steps, d.restore_step) == (120, None)


def test_already_committed_needs_no_save():
    """If the current step is committed (e.g. a save just finished), nothing to save."""
    d = DeadlinePolicy().decide(drain_obs(deadline=0.1, last_committed_step=120))
    assert (d.kind, d.lost_steps, d.restore_step) == (DrainKind.NOTHING_TO_SAVE, 0, 120)


def test_safety_factor_moves_the_line():
    """A larger factor demands more headroom for the same deadline."""
    obs = drain_obs(deadline=5.0)
    assert DeadlinePolicy(save_if_time_left_factor=1.5).decide(obs).kind is DrainKind.SAVE
    assert DeadlinePolicy(save_if_time_left_factor=3.0).decide(obs).kind \
        is DrainKind.FALL_BACK_TO_LAST_CHECKPOINT


@pytest.mark.parametrize("kw", [dict(on_short_deadline="pray"), dict(save_if_time_left_factor=0)])
def test_invalid_deadline_policy(kw):
    """Unknown modes and non-positive factors are refused."""
    with pytest.raises(ValueError):
        DeadlinePolicy(**kw)


def test_short_deadline_with_the_ram_tier_copies_to_ram_only():
    """Too short for a durable save (3 s needed), long enough to copy to the peers' RAM."""
    obs = DrainObservation(now=0.0, deadline=1.0, expected_save_s=2.0, expected_step_s=0.0,
                           step=120, last_committed_step=100, expected_copy_s=0.05)
    d = DeadlinePolicy(save_if_time_left_factor=1.5).decide(obs)
    assert (d.kind, d.lost_steps, d.restore_step) == (DrainKind.RAM_COPY_ONLY, 0, 120)
    assert "RAM only" in d.reason and "no durable copy" in d.reason
    assert d.steps_at_risk == 20
    enough = DrainObservation(now=0.0, deadline=10.0, expected_save_s=2.0, expected_step_s=0.0,
                              step=120, last_committed_step=100, expected_copy_s=0.05)
    assert DeadlinePolicy().decide(enough).kind is DrainKind.SAVE, "time enough: durable"
    passed = DrainObservation(now=5.0, deadline=1.0, expected_save_s=2.0, expected_step_s=0.0,
                              step=120, last_committed_step=100, expected_copy_s=0.05)
    assert DeadlinePolicy().decide(passed).kind is DrainKind.FALL_BACK_TO_LAST_CHECKPOINT
