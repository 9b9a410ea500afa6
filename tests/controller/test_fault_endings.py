"""Faults that used to end a run badly (issue 28), on the fake seam."""

from __future__ import annotations

from orchestrator.controller.seam import GroupFailed
from tests.controller.fakes import lost
from tests.controller.harness import make


def test_a_host_lost_in_the_final_save_is_recovered_and_the_save_done_again(tmp_path):
    """kill -9 of a host during "reached step N: final save": re-form, restore, finish the
    save; never FAILED with a spare slice and budget left."""
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.save_failures.append(GroupFailed(lost()))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.step == 20
    states = sim.states()
    first_final = states.index("CHECKPOINTING")
    assert states[first_final:first_final + 2] == ["CHECKPOINTING", "RELEASING"]
    assert states[-2:] == ["CHECKPOINTING", "SUCCEEDED"]
    assert 20 in sim.fleet.disk.committed and len(sim.fleet.groups) == 2
