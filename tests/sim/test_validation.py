"""The bench validation code (bench/sim_validation.py) on a run directory the simulator wrote:
calibrating from a run's own records and replaying its events.jsonl reproduces its goodput.
(The real validation, against a measured bench run on the local Ray cluster, is not run here.)"""

from __future__ import annotations

import pytest

from bench.sim_validation import calibrate, compare
from orchestrator.shared.errors import OrchestratorError
from orchestrator.sim.processes import Happening
from orchestrator.sim.runner import simulate
from tests.sim.helpers import COMPILE, FORM, RESTORE, STARTUP, tiny


def test_a_run_is_reproduced_from_its_own_records(tmp_path):
    simulate(tiny("horizon_h=0.2", "topology.spare_slices=1",
                  "checkpoint.tiers.gcs.blocking_s=0.5", "checkpoint.tiers.gcs.latency_s=2"),
             run_dir=tmp_path / "measured",
             extra=[Happening(t=STARTUP + 100.5, kind="preemption", slice_index=0, lead_s=30.0,
                              back_s=3600.0)])
    data = calibrate(tmp_path / "measured")
    assert data["reform"]["forming_s"] == pytest.approx(FORM)
    assert data["reform"]["compiling_s"] == pytest.approx(COMPILE)
    # the restore after the drain read the checkpoint: base + the tier's 2 s latency
    restore = data["reform"]["restore_base_s"] + data["checkpoint"]["tiers"]["gcs"]["latency_s"]
    assert restore == pytest.approx(RESTORE + 2.0)
    assert data["topology"]["spare_slices"] == 1
    assert data["trace"]["start_offset_s"] == pytest.approx(STARTUP + 100.5)
    out = compare(tmp_path / "measured", work=tmp_path / "replayed")
    assert out["within_target"], out
    assert out["simulated_badput_s"].keys() == out["measured_badput_s"].keys()


def test_a_directory_that_is_not_a_run_is_refused_with_the_fix(tmp_path):
    with pytest.raises(OrchestratorError, match=r"config\.yaml is missing"):
        calibrate(tmp_path)


def test_a_cold_first_formation_is_calibrated_apart_from_the_warm_re_forms(tmp_path):
    """A real run's first formation compiles and initializes cold (~18 s here); its re-forms
    load the stored executable. Medians over all formations would keep only the warm costs
    and overstate a short run's goodput (measured 0.674, simulated 0.837 before)."""
    cold = tiny("horizon_h=0.2", "reform.fresh_start_s=5", "reform.compiling_s=12",
                "reform.compile_cached_s=0.3")
    simulate(cold, run_dir=tmp_path / "measured",
             extra=[Happening(t=5 + FORM + 12 + 100.5, kind="preemption",
                              slice_index=0, lead_s=30.0, back_s=0.0)])
    data = calibrate(tmp_path / "measured")
    assert data["reform"]["fresh_start_s"] == pytest.approx(5.0)
    assert data["reform"]["compiling_s"] == pytest.approx(12.0)
    assert data["reform"]["compile_cached_s"] == pytest.approx(0.3)
    out = compare(tmp_path / "measured", work=tmp_path / "replayed")
    assert abs(out["difference"]) <= 0.01, out
