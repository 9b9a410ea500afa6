"""Global batch semantics across a resize: keep (gradient accumulation) or scale."""

from __future__ import annotations

import pytest

from policies.resize import (
    BatchMode,
    BatchPlan,
    ResizeInfeasible,
    ResizeObservation,
    ResizePolicy,
)

KEEP = ResizePolicy(mode=BatchMode.KEEP)


def test_keep_shrink_uses_accumulation():
    """2 slices -> 1: same global batch 16, micro-batch 8 per replica, 2 accumulation steps."""
    d = KEEP.decide(ResizeObservation(base_global_batch=16, base_dp=2, new_dp=1, processes=2))
    assert isinstance(d, BatchPlan)
    assert (d.global_batch, d.micro_batch_per_replica, d.accum_steps, d.lr_scale) == (16, 8, 2, 1.0)
    assert d.micro_global_batch * d.accum_steps == 16


def test_keep_same_size_is_identity():
    """No resize: no accumulation, unchanged batch and learning rate."""
    d = KEEP.decide(ResizeObservation(base_global_batch=16, base_dp=4, new_dp=4))
    assert (d.global_batch, d.micro_batch_per_replica, d.accum_steps) == (16, 4, 1)


def test_keep_grow_past_base_splits_batch():
    """Growing beyond the base size: each replica takes a smaller share of the same batch."""
    d = KEEP.decide(ResizeObservation(base_global_batch=16, base_dp=2, new_dp=4))
    assert (d.global_batch, d.micro_batch_per_replica, d.accum_steps) == (16, 4, 1)


def test_keep_indivisible_names_the_fix():
    """4 -> 3 replicas cannot keep the batch: a decision value naming the setting to change."""
    d = KEEP.decide(ResizeObservation(base_global_batch=16, base_dp=4, new_dp=3))
    assert isinstance(d, ResizeInfeasible)
    assert "controller.batch_on_resize=scale" in d.fix


@pytest.mark.parametrize(("lr", "expected"), [("linear", 0.5), ("sqrt", 0.5 ** 0.5),
                                              ("none", 1.0)])
def test_scale_shrinks_global_batch_and_lr(lr, expected):
    """SCALE: global batch follows dp (16 -> 8), lr scaled per the documented rule."""
    d = ResizePolicy(mode=BatchMode.SCALE, lr_scaling=lr).decide(
        ResizeObservation(base_global_batch=16, base_dp=2, new_dp=1))
    assert (d.global_batch, d.micro_batch_per_replica, d.accum_steps) == (8, 8, 1)
    assert d.lr_scale == pytest.approx(expected)


def test_scale_handles_any_size():
    """SCALE works for sizes KEEP cannot (4 -> 3)."""
    d = ResizePolicy(mode=BatchMode.SCALE).decide(
        ResizeObservation(base_global_batch=16, base_dp=4, new_dp=3))
    assert (d.global_batch, d.lr_scale) == (12, pytest.approx(0.75))


def test_process_divisibility():
    """The per-micro-step batch must divide by the process count of the new group."""
    d = KEEP.decide(ResizeObservation(base_global_batch=6, base_dp=2, new_dp=1, processes=2))
    assert isinstance(d, ResizeInfeasible) and "2 processes" in d.reason


def test_base_batch_must_divide_by_base_dp():
    """A configured batch that does not divide by dp is reported, not crashed on."""
    d = KEEP.decide(ResizeObservation(base_global_batch=10, base_dp=4, new_dp=2))
    assert isinstance(d, ResizeInfeasible) and "train.global_batch" in d.fix


def test_nonpositive_sizes_reported():
    """Zero replicas is infeasible, not a ZeroDivisionError."""
    assert isinstance(KEEP.decide(ResizeObservation(base_global_batch=16, base_dp=2, new_dp=0)),
                      ResizeInfeasible)


def test_invalid_lr_scaling():
    """Unknown lr scaling rules are refused."""
    with pytest.raises(ValueError):
        ResizePolicy(lr_scaling="cubic")
