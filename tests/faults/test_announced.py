"""Announced faults on a shared emulated cluster of two 2-host slices (one in use, one spare).

Notices come from the deterministic chaos schedule (keyed by (host, step)) or, for duplicate and
late notices, through a real EventIntake. Each test asserts the steps reached and what was lost.
"""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.controller_config import ChaosFaultConfig
from tests.faults.harness import fault_config, print_recovery, run_controller
from tests.support.ray_cluster import cluster_fixture

pytestmark = pytest.mark.cluster

cluster = cluster_fixture(scope="module", slices=2, hosts_per_slice=2, devices_per_host=2)


def test_notice_for_one_host_reforms_on_spare_with_bit_identical_params(cluster, tmp_path):
    """Preempt 1 host of a 2-host slice: 0 lost steps, params equal an uninterrupted run's."""
    plain = run_controller(fault_config(tmp_path / "plain"), collect_params=True)
    assert plain.summary.state == "SUCCEEDED"
    assert plain.summary.step == 20

    chaos = [ChaosFaultConfig(at_step=8, host=1, kind="preempt", deadline_s=60)]
    hit = run_controller(fault_config(tmp_path / "hit", chaos=chaos), collect_params=True)
    print_recovery("announced", hit)

    s = hit.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    assert s.restarts == {"spot_preemption": 1}
    assert "DRAINING" in hit.states and "CHECKPOINTING" in hit.states
    assert [r["restored_step"] for r in hit.controller.restores] == [None, 8]
    slices = {tuple(t["slices"]) for t in hit.timeline if t["state"] == "RUNNING"}
    assert len(slices) == 2, "the second incarnation must run on the spare slice"
    assert plain.final_params is not None and hit.final_params is not None
    assert plain.final_params.keys() == hit.final_params.keys()
    for k, v in plain.final_params.items():
        np.testing.assert_array_equal(v, hit.final_params[k], err_msg=k)
