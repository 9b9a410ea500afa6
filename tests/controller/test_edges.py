"""Every edge of the lifecycle's transition table is taken by some scenario on the fake seam,
and the controller takes no other (the lifecycle would refuse it)."""

from __future__ import annotations

import pytest

from orchestrator.controller import core
from orchestrator.controller.seam import GroupFailed, Hung
from orchestrator.driver.signals import StopRequest
from orchestrator.lifecycle import TRANSITIONS, RunState
from tests.controller.fakes import lost
from tests.controller.harness import Sim, make

S = RunState


def happy(tmp) -> Sim:
    return make(tmp)


COLD_SPARE = "controller.warm.standby_slices=0"
"""No standby on the spare: the replacement warms up during the notice (HANDING_OVER)."""


def announced(tmp) -> Sim:
    sim = make(tmp, COLD_SPARE, spare=("s1",))
    sim.fleet.on_step(6, lambda g: sim.notice(host="vm-s0-0"))
    return sim


def handover_interrupted(tmp) -> Sim:
    """A notice starts a handover that never gets warm; a host dies meanwhile."""
    sim = make(tmp, COLD_SPARE, spare=("s1",))
    sim.fleet.warm_after_polls = 10**9
    sim.fleet.on_step(6, lambda g: sim.notice(host="vm-s0-0"))
    sim.fleet.on_step(9, lambda g: lost())
    return sim


def handover_to_the_end(tmp) -> Sim:
    """The target is reached while the replacement still warms: the final save wins."""
    sim = make(tmp, COLD_SPARE, spare=("s1",))
    sim.fleet.warm_after_polls = 10**9
    sim.fleet.on_step(17, lambda g: sim.notice(host="vm-s0-0"))
    return sim


def short_deadline(tmp) -> Sim:
    sim = make(tmp, COLD_SPARE, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0", deadline_in=0.05))
    return sim


def phase_failures(tmp) -> Sim:
    """Failures in forming, compiling, restoring and running, each released and retried."""
    sim = make(tmp, "controller.backoff.base_s=0")
    sim.fleet.form_failures.append(GroupFailed(Hung(phase="init", hosts=(1,), seconds=5)))
    sim.fleet.compile_failures.append(GroupFailed(lost()))
    sim.fleet.disk.committed, sim.fleet.disk.corrupt = [5], {5}
    sim.fleet.disk.corrupt_raises = True
    sim.fleet.on_step(3, lambda g: lost())
    return sim


def capacity_wait(tmp) -> Sim:
    sim = make(tmp, "controller.elastic.enabled=false")

    def lose(g):
        sim.cluster.remove("s0-h1")
        return lost(nodes=frozenset({"s0-h1"}))

    sim.fleet.on_step(4, lose)
    return sim


def stop_in_backoff(tmp) -> Sim:
    sim = make(tmp)

    def stop(g):
        sim.notice("operator_stop", deadline_in=None)
        return lost()

    sim.fleet.on_step(4, stop)
    return sim


def stop_in_wait(tmp) -> Sim:
    sim = make(tmp, "controller.elastic.enabled=false", "controller.backoff.base_s=0")

    def stop(g):
        sim.cluster.remove("s0-h1")
        sim.notice("operator_stop", deadline_in=None)
        return lost(nodes=frozenset({"s0-h1"}))

    sim.fleet.on_step(4, stop)
    return sim


def stop_while_running(tmp) -> Sim:
    """An operator stop mid-run: drain, save, release, STOPPED."""
    sim = make(tmp)
    sim.fleet.on_step(6, lambda g: sim.notice("operator_stop", deadline_in=None))
    return sim


def sigterm_after_a_loss(tmp) -> Sim:
    """SIGTERM as a host dies, no backoff: the re-plan takes the stop (PLANNING -> STOPPED)."""
    sim = make(tmp, "controller.backoff.base_s=0")
    signals: list[StopRequest] = []
    sim.controller.run_state.stop_request = lambda: signals[0] if signals else None

    def term_and_lose(g):
        signals.append(StopRequest(signal="SIGTERM", at=0.0))
        return lost()

    sim.fleet.on_step(4, term_and_lose)
    return sim


def budget_spent(tmp) -> Sim:
    sim = make(tmp, "controller.budgets.host_lost=0")
    sim.fleet.on_step(4, lambda g: lost())
    return sim


SCENARIOS = [happy, announced, handover_interrupted, handover_to_the_end, short_deadline,
             phase_failures, capacity_wait, stop_in_backoff, stop_in_wait, stop_while_running,
             sigterm_after_a_loss, budget_spent]


def _interrupted(tmp, state: RunState, monkeypatch) -> Sim:
    """A run whose handler for ``state`` is interrupted (Ctrl-C) the first time it runs."""
    real = core.HANDLERS[state]
    calls = {"n": 0}

    def boom(run):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(run)

    monkeypatch.setitem(core.HANDLERS, state, boom)
    builder = {S.DRAINING: announced, S.HANDING_OVER: announced, S.CHECKPOINTING: happy,
               S.RELEASING: budget_spent,
               S.WAITING_FOR_CAPACITY: capacity_wait, S.BACKOFF: stop_in_backoff}.get(state, happy)
    sim = builder(tmp)
    sim.run()
    monkeypatch.setitem(core.HANDLERS, state, real)
    return sim


def test_every_table_edge_is_taken_and_no_other(tmp_path, monkeypatch):
    seen: set[tuple[str, str]] = set()
    for i, scenario in enumerate(SCENARIOS):
        sim = scenario(tmp_path / f"s{i}")
        sim.run()
        seen |= sim.edges()
    for state in RunState:
        if not state.terminal:
            sim = _interrupted(tmp_path / f"i-{state.value}", state, monkeypatch)
            seen |= sim.edges()
    table = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert seen == table, f"never taken: {sorted(table - seen)}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_every_scenario_ends_with_a_summary(tmp_path, scenario):
    sim = scenario(tmp_path)
    summary = sim.run()
    assert summary.state in ("SUCCEEDED", "FAILED", "STOPPED")
    assert (sim.run_dir / "summary.json").exists()
    assert all(g.shutdowns for g in sim.fleet.groups), "a group was left running"


def test_a_corrupt_checkpoint_spends_its_own_budget_not_host_lost(tmp_path):
    """Issue 51: the restore's fall-back past an unreadable checkpoint was charged to
    host_lost, so a bad disk could end a run whose hosts never failed (and the other way)."""
    sim = make(tmp_path, "controller.backoff.base_s=0", "controller.budgets.host_lost=0")
    sim.fleet.disk.committed, sim.fleet.disk.corrupt = [5], {5}
    sim.fleet.disk.corrupt_raises = True
    summary = sim.run()
    assert summary.state == "SUCCEEDED", summary.reason
    assert summary.restarts == {"checkpoint_corrupt": 1}
