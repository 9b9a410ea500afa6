"""MFU arithmetic, the chip table and the peak's labelled source."""

from __future__ import annotations

import pytest

from orchestrator.metrics.mfu import (
    PEAK_BF16_FLOPS_PER_CHIP,
    analytic_train_flops,
    flops_agree,
    mfu,
    normalize_accelerator,
    resolve_peak,
)
from orchestrator.shared.errors import ConfigError


def test_mfu_is_flops_over_time_devices_and_peak():
    """MFU = flops / (step time x devices x peak)."""
    assert mfu(4e12, 0.5, 4, 4e12) == 0.5
    assert mfu(197e12 * 8 * 0.25, 1.0, 8, PEAK_BF16_FLOPS_PER_CHIP["v5e"]) == pytest.approx(0.25)


@pytest.mark.parametrize("args", [(1e9, 0.0, 1, 1e12), (1e9, 1.0, 0, 1e12), (1e9, 1.0, 1, 0.0),
                                  (0.0, 1.0, 1, 1e12), (1e9, -1.0, 1, 1e12)])
def test_mfu_of_a_bad_sample_is_zero_not_an_error(args):
    """A bad sample reports 0 instead of raising into the training loop."""
    assert mfu(*args) == 0.0


def test_analytic_flops_matches_palm_formula_by_hand():
    """6 (N + V D) T + 12 L D S T, computed by hand for small numbers."""
    got = analytic_train_flops(n_params_non_embedding=1000, vocab_size=100, d_model=16,
                               num_layers=2, seq_len=32, tokens=64)
    assert got == 6 * 2600 * 64 + 12 * 2 * 16 * 32 * 64 == 1_784_832


def test_analytic_flops_rejects_negative_sizes():
    """Negative sizes are a programming error, named in the message."""
    with pytest.raises(ValueError, match="tokens"):
        analytic_train_flops(n_params_non_embedding=1, vocab_size=1, d_model=1, num_layers=1,
                             seq_len=1, tokens=-1)


def test_flops_cross_check_uses_relative_tolerance():
    """XLA's 393 MFLOP vs analytic 415 MFLOP (the default model's step) agree; a per-device
    count does not."""
    assert flops_agree(393e6, 415e6)
    assert not flops_agree(393e6 / 8, 415e6)
    assert not flops_agree(0.0, 415e6)


@pytest.mark.parametrize(("name", "key"), [("v5litepod-16", "v5e"), ("TPU-V6E", "v6e"),
                                           ("v4-8", "v4"), ("v5p-128", "v5p"), ("v3-8", None),
                                           ("cpu", None)])
def test_accelerator_names_map_to_table_keys(name, key):
    """Pod type labels and chip names map onto the peak table."""
    assert normalize_accelerator(name) == key


def test_peak_resolution_order_and_source_labels():
    """Configured beats table beats measured; the source says which."""
    assert resolve_peak("v5e", 1e9, 2e9) == (1e9, "configured")
    assert resolve_peak("v5litepod-8", None, 2e9) == (197e12, "table:v5e")
    assert resolve_peak(None, None, 2e9) == (2e9, "measured:cpu-matmul")
    assert resolve_peak("cpu", None, 3e9) == (3e9, "measured:cpu-matmul")


def test_peak_resolution_without_any_source_names_the_fix():
    """No table entry and no measurement: a ConfigError naming the settings to set."""
    with pytest.raises(ConfigError) as err:
        resolve_peak("v2", None, None)
    assert err.value.setting == "cluster.accelerator"
    assert "metrics.cpu_peak_flops_per_device" in str(err.value)
    with pytest.raises(ConfigError):
        resolve_peak(None, -5.0, None)


def test_cpu_peak_measurement_is_positive_and_usable_as_a_peak():
    """The measured CPU matmul rate feeds resolve_peak with its source label."""
    from orchestrator.metrics.peak import measure_cpu_matmul_flops

    flops = measure_cpu_matmul_flops(n=128, repeats=2)
    assert flops > 1e6
    assert resolve_peak(None, None, flops) == (flops, "measured:cpu-matmul")


def test_step_record_build_computes_mfu_with_the_peak_source():
    """StepRecord.build fills mfu, peak value and source from resolve_peak's answer."""
    from orchestrator.metrics.records import StepRecord

    rec = StepRecord.build(step=3, loss=2.0, step_time_s=0.5, tokens=1024, flops=4e12,
                           grad_norm=1.0, wall_time=1.0, devices=8,
                           peak=resolve_peak("v5e", None, None), incarnation=0, slices=2)
    assert rec.peak_source == "table:v5e"
    assert rec.mfu == pytest.approx(4e12 / (0.5 * 8 * 197e12))
    assert rec.tokens_per_second == 2048.0
