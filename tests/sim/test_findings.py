"""What the simulator finds in the controller, as reproducers (docs/sim.md, "What the simulator
found"). A finding not fixed yet is a strict xfail: the day it is fixed, the test passes, fails
as XPASS, and the marker comes off."""

from __future__ import annotations

from orchestrator.sim.processes import Happening
from orchestrator.sim.runner import simulate
from tests.sim.helpers import STARTUP, tiny

MAINTENANCE = Happening(t=STARTUP + 20.5, kind="maintenance", slice_index=0, lead_s=7200.0,
                        duration_s=600.0)
FAILURE = Happening(t=STARTUP + 300.5, kind="host_failure", slice_index=1, worker=0)


def _run(tmp_path, *extra: Happening):
    # 2 slices in the mesh + 1 spare; the maintenance is for slice 0, the failure in slice 1
    return simulate(tiny("horizon_h=3", "topology.slices=2", "topology.spare_slices=1",
                         "controller.budgets.host_lost=100"), run_dir=tmp_path,
                    extra=list(extra))


def test_a_maintenance_window_announced_ahead_is_drained_before_it_starts(tmp_path):
    r = _run(tmp_path, MAINTENANCE)
    assert r.recoveries["announced:maintenance"]["count"] == 1
    assert r.lost_steps == 0 and "unannounced:host_lost" not in r.recoveries


def test_the_maintenance_drain_survives_an_unrelated_failure_before_the_window(tmp_path):
    r = _run(tmp_path, MAINTENANCE, FAILURE)
    assert r.recoveries["unannounced:host_lost"]["count"] == 1  # the failure itself
    assert r.recoveries.get("announced:maintenance", {}).get("count") == 1
