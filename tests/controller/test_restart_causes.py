"""Every PLANNING the controller enters says why in its payload (``Planning``): the stop cause
of a re-form (after a drain at once, after a failure once its backoff is over), ``grow``, or
nothing (capacity returned, a wait ended: no restart). The live sinks count restarts from that
payload; they agree with the summary's restarts, counted from the ledger."""

from __future__ import annotations

from collections import Counter

from orchestrator.lifecycle import Planning
from policies.causes import StopCause
from tests.controller.fakes import lost
from tests.controller.harness import lose_slice_then_add_one, make


def _plannings(sim) -> list[tuple[str, Planning]]:
    return [(t.prev.value, t.payload) for t in sim.controller.lifecycle.timeline
            if t.state.value == "PLANNING" and t.prev is not None]


def _restarts(sim) -> dict[str, int]:
    return dict(Counter(c for t in sim.controller.lifecycle.timeline
                        if (c := t.restart_cause) is not None))


def test_a_drained_notice_re_forms_with_its_cause(tmp_path):
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0"))
    summary = sim.run()
    assert _plannings(sim) == [("RELEASING", Planning(cause=StopCause.SPOT_PREEMPTION))]
    assert _restarts(sim) == summary.restarts == {"spot_preemption": 1}


def test_a_failure_re_forms_after_its_backoff_with_its_cause(tmp_path):
    """Unannounced: RELEASING -> BACKOFF -> PLANNING, whose payload carries the cause the
    budget counted (not a word of the "backoff over" reason)."""
    sim = make(tmp_path)
    sim.fleet.on_step(7, lambda g: lost())
    summary = sim.run()
    assert _plannings(sim) == [("BACKOFF", Planning(cause=StopCause.HOST_LOST))]
    assert _restarts(sim) == summary.restarts == {"host_lost": 1}


def test_a_wait_for_capacity_is_no_restart_and_a_grow_is_labelled_grow(tmp_path):
    sim = make(tmp_path, "cluster.emulate.slices=2", "run.total_steps=60",
               "controller.elastic.min_resize_interval_s=0", "controller.elastic.shrink_after_s=2",
               slices=("s0", "s1"))
    lose_slice_then_add_one(sim)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    plannings = _plannings(sim)
    assert ("BACKOFF", Planning(cause=StopCause.HOST_LOST)) in plannings
    assert ("WAITING_FOR_CAPACITY", Planning()) in plannings
    assert plannings[-1] == ("RELEASING", Planning(grow=True))
    assert _restarts(sim) == {"host_lost": 1, "grow": 1} and summary.restarts == {"host_lost": 1}
