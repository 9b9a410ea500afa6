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


def test_a_noticed_host_that_crashes_inside_its_window_is_the_preemption(tmp_path):
    """SIGSEGV of host 1 one step after its 30 s preemption notice: the announced recovery
    (spot_preemption budget, no backoff), not a host_lost failure."""
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1", deadline_in=30.0, id="n1"))
    sim.fleet.on_step(8, lambda g: lost(hosts=(1,)))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    releasing = sim.payloads("RELEASING")[0]
    assert releasing.cause.value == "spot_preemption"
    assert "BACKOFF" not in sim.states()
    assert set(summary.restarts) == {"spot_preemption"}
    actions = [e for e in sim.events() if e.get("event_id") == "n1" and e.get("action")]
    assert any("inside their notice window" in str(e) for e in actions), actions


def test_a_noticed_host_seen_dead_just_after_its_deadline_is_the_preemption(tmp_path):
    """No step boundary came inside a 0.05 s window (steps of 0.1 s): the cloud took host 1 at
    the deadline and the failed step shows it 0.05 s later. The preemption, not a host loss."""
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1", deadline_in=0.05, id="n1"))
    sim.fleet.on_step(8, lambda g: lost(hosts=(1,)))
    summary = sim.run()
    assert sim.payloads("RELEASING")[0].cause.value == "spot_preemption"
    assert set(summary.restarts) == {"spot_preemption"}


def test_a_noticed_host_dead_long_after_its_deadline_stays_a_host_loss(tmp_path):
    """Steps of 100 s: host 1 dies 70 s after its notice's deadline (more than the 60 s a death
    takes to show), so it is not the preemption."""
    from orchestrator.controller.recovering import DEATH_SEEN_AFTER_DEADLINE_S

    sim = make(tmp_path, "timeouts.step_s=300", spare=("s1",), step_s=100.0)
    deadline_in = 100.0 - DEATH_SEEN_AFTER_DEADLINE_S - 10.0
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1", deadline_in=deadline_in, id="n1"))
    sim.fleet.on_step(8, lambda g: lost(hosts=(1,)))
    summary = sim.run()
    assert sim.payloads("RELEASING")[0].cause.value == "host_lost"
    assert "host_lost" in summary.restarts
    actions = [e for e in sim.events() if e.get("event_id") == "n1" and e.get("action")]
    assert any("failed before the drain" in str(e) for e in actions), actions  # it was live


def test_a_crash_of_a_host_without_notice_stays_a_host_loss(tmp_path):
    """The other host of the slice dies after host 1's notice: not the preemption."""
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1", deadline_in=30.0, id="n1"))
    sim.fleet.on_step(8, lambda g: lost(hosts=(0,)))
    summary = sim.run()
    assert sim.payloads("RELEASING")[0].cause.value == "host_lost"
    assert "host_lost" in summary.restarts


def test_the_crash_in_notice_chaos_kind_sends_the_notice_then_crashes_the_host(tmp_path):
    """``crash_in_notice`` at step 7: a preemption notice for host 1 through the driver, and a
    crash armed in host 1 (SIGSEGV ``CRASH_IN_NOTICE_AFTER_S`` later); the death that follows
    is the preemption."""
    from policies.chaos import CRASH_IN_NOTICE_AFTER_S

    sim = make(tmp_path, "controller.warm.standby_slices=0",
               "controller.chaos=[{at_step: 7, host: 1, kind: crash_in_notice, "
                         "deadline_s: 30}]", spare=("s1",))
    crash = (1, {"at_step": 7, "kind": "crash", "after_s": CRASH_IN_NOTICE_AFTER_S})
    sim.fleet.on_step(8, lambda g: lost(hosts=(1,)) if crash in g.injected else None)
    summary = sim.run()
    assert crash in sim.fleet.groups[0].injected
    lines = [e for e in sim.events()
             if str(e.get("event_id")).startswith("chaos-7-1-preemption_notice-d")]
    assert any("inside their notice window" in str(e) for e in lines if e.get("action")), lines
    assert summary.state == "SUCCEEDED" and set(summary.restarts) == {"spot_preemption"}
    assert sim.payloads("RELEASING")[0].cause.value == "spot_preemption"
    assert "BACKOFF" not in sim.states()


def test_a_later_driver_meeting_a_chaos_notice_again_sends_a_new_event():
    """Issue 51 (the soak, seed 1): a notice's id was the same in every driver of a run, so
    after a rollback the next driver's notice fell in the persisted dedupe window and was
    dropped. The driver's start is in the id now."""
    from types import SimpleNamespace

    from orchestrator.controller.plugins import ChaosPlugin
    from policies.chaos import Fault, FaultKind

    def sent(started_at: float) -> str:
        got = []
        run = SimpleNamespace(
            plan=SimpleNamespace(hosts=[SimpleNamespace(instance="vm-0"),
                                        SimpleNamespace(instance="vm-1")]),
            cfg=SimpleNamespace(run=SimpleNamespace(name="job")), now=lambda: 5.0,
            started_at=started_at,
            reactions=SimpleNamespace(submit=lambda payload, source: got.append(payload)))
        ChaosPlugin._notice(run, Fault(at_step=7, host=1, kind=FaultKind.PREEMPT,
                                       deadline_s=30.0))
        return got[0]["id"]

    first, again = sent(1000.0), sent(1060.5)
    assert first.startswith("chaos-7-1-preemption_notice-") and first != again
    assert sent(1000.0) == first  # one driver: the same id (it fires once anyway)
