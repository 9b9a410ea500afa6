"""The lifecycle table walked exhaustively, the timeline file and logging (listeners are the
controller's: tests/controller/test_listeners.py)."""

from __future__ import annotations

import itertools
import json
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from orchestrator.lifecycle import (
    OPTIONAL_PAYLOAD,
    REQUIRED_PAYLOAD,
    TIMELINE_FILE,
    TRANSITIONS,
    Backoff,
    Checkpointing,
    Compiling,
    Draining,
    Failed,
    HandingOver,
    IllegalTransition,
    Lifecycle,
    LifecycleError,
    Planning,
    Releasing,
    Restoring,
    RunState,
    Stopped,
    Transition,
    WaitingForCapacity,
)
from orchestrator.shared.errors import OrchestratorError
from policies.causes import StopCause

S = RunState
CONTRACT_KEYS = {
    "seq", "state", "prev", "at", "prev_duration_s", "reason", "incarnation", "slices", "hosts",
    "step", "payload",
}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def payload_for(state: RunState):
    return {
        S.PLANNING: Planning(cause=StopCause.HOST_LOST),
        S.FAILED: Failed(reason="budget exhausted", cause=StopCause.HOST_LOST),
        S.STOPPED: Stopped(reason="stopped by SIGTERM after saving step 0", by="SIGTERM"),
        S.WAITING_FOR_CAPACITY: WaitingForCapacity(deadline=2000.0, needed_slices=1),
        S.HANDING_OVER: HandingOver(event_id="ev-1", hosts=("vm-2",), until=1020.0),
        S.DRAINING: Draining(event_id="ev-1", deadline=1030.0, doomed_hosts=("h1",)),
        S.BACKOFF: Backoff(until=1010.0, cause=StopCause.HOST_LOST),
    }.get(state)


def go(lc: Lifecycle, to: RunState, **kw) -> Transition:
    args = dict(reason=f"to {to}", step=0, incarnation=0, slices=("s0",), hosts=2,
                payload=payload_for(to))
    args.update(kw)
    return lc.transition(to, **args)


def path_to(target: RunState) -> list[RunState]:
    """Shortest allowed path PLANNING -> target (BFS over the table)."""
    prev: dict[RunState, RunState | None] = {S.PLANNING: None}
    queue = deque([S.PLANNING])
    while queue:
        cur = queue.popleft()
        for nxt in sorted(TRANSITIONS[cur]):
            if nxt not in prev:
                prev[nxt] = cur
                queue.append(nxt)
    assert target in prev, f"{target} unreachable"
    path: list[RunState] = []
    node: RunState | None = target
    while node is not None and node is not S.PLANNING:
        path.append(node)
        node = prev[node]
    return path[::-1]


def lifecycle_in(state: RunState, **kw) -> Lifecycle:
    lc = Lifecycle(clock=FakeClock(), **kw)
    for s in path_to(state):
        go(lc, s)
    assert lc.state is state
    return lc


def test_table_covers_every_state():
    """Every state has a row, and rows only name states."""
    assert set(TRANSITIONS) == set(RunState)
    for dsts in TRANSITIONS.values():
        assert dsts <= set(RunState)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(RunState, RunState)))
def test_every_pair(src, dst):
    """Allowed pairs succeed; every other pair raises naming both states and changes nothing."""
    lc = lifecycle_in(src)
    before = len(lc.timeline)
    if dst in TRANSITIONS[src]:
        t = go(lc, dst)
        assert (lc.state, t.prev, t.state) == (dst, src, dst)
        assert len(lc.timeline) == before + 1
    else:
        with pytest.raises(IllegalTransition) as info:
            go(lc, dst)
        assert f"{src} -> {dst}" in str(info.value)
        assert isinstance(info.value, OrchestratorError)
        assert (lc.state, len(lc.timeline)) == (src, before)


def test_terminal_states_have_no_exits():
    """SUCCEEDED, FAILED and STOPPED are terminal and nothing leaves them."""
    assert {s for s in RunState if s.terminal} == {S.SUCCEEDED, S.FAILED, S.STOPPED}
    assert all(TRANSITIONS[s] == frozenset() for s in (S.SUCCEEDED, S.FAILED, S.STOPPED))


def test_a_stop_asked_for_ends_stopped_where_no_group_runs():
    """STOPPED (needing a Stopped payload) is entered only from the states that take a stop
    with no group running; a running group drains first."""
    assert {s for s in RunState if S.STOPPED in TRANSITIONS[s]} == {
        S.PLANNING, S.RELEASING, S.WAITING_FOR_CAPACITY, S.BACKOFF}
    assert REQUIRED_PAYLOAD[S.STOPPED] is Stopped
    from orchestrator.metrics.goodput import TERMINAL_STATES

    assert {"SUCCEEDED", "FAILED", "STOPPED"} == TERMINAL_STATES  # what the sinks end at


def test_every_state_reachable_and_can_end():
    """Every state is reachable from PLANNING, can reach a terminal state, and may fail."""
    for state in RunState:
        path_to(state)
    for state in RunState:
        if state.terminal:
            continue
        assert S.FAILED in TRANSITIONS[state]
        seen, stack = {state}, [state]
        while stack:
            for nxt in TRANSITIONS[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        assert S.SUCCEEDED in seen


@pytest.mark.parametrize(
    "path",
    [
        # first start (fresh or restored), final save
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.CHECKPOINTING, S.SUCCEEDED],
        # announced drain -> save -> release -> re-plan on replacements
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.DRAINING, S.CHECKPOINTING,
         S.RELEASING, S.PLANNING, S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING],
        # short deadline: drain without a save
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.DRAINING, S.RELEASING, S.PLANNING],
        # unannounced failure -> backoff -> planning
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.RELEASING, S.BACKOFF, S.PLANNING,
         S.FORMING],
        # bounded wait for capacity that runs out
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.DRAINING, S.CHECKPOINTING,
         S.RELEASING, S.PLANNING, S.WAITING_FOR_CAPACITY, S.PLANNING, S.FAILED],
        # operator stop or SIGTERM: save, release, end
        [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.DRAINING, S.CHECKPOINTING,
         S.RELEASING, S.STOPPED],
        # hang in distributed init -> released and retried
        [S.FORMING, S.RELEASING, S.BACKOFF, S.PLANNING, S.FORMING],
    ],
)
def test_named_paths(path):
    """The paths the controller takes are all allowed."""
    lc = Lifecycle(clock=FakeClock())
    for state in path:
        go(lc, state)
    assert lc.state is path[-1]


def test_required_payloads():
    """FAILED, WAITING_FOR_CAPACITY, DRAINING and BACKOFF refuse to be entered without payload."""
    for state, kind in REQUIRED_PAYLOAD.items():
        src = next(s for s in RunState if state in TRANSITIONS[s])
        lc = lifecycle_in(src)
        with pytest.raises(LifecycleError, match=kind.__name__):
            go(lc, state, payload=None)
        assert lc.state is src


def test_wrong_payload_type_raises():
    """A payload of another state's type is refused; a payload on a payload-less state too."""
    lc = lifecycle_in(S.RUNNING)
    with pytest.raises(LifecycleError, match="Draining"):
        go(lc, S.DRAINING, payload=Backoff(until=1.0, cause=StopCause.TIMEOUT))
    lc = lifecycle_in(S.RESTORING)
    with pytest.raises(LifecycleError, match="COMPILING takes Compiling, got Restoring"):
        go(lc, S.COMPILING, payload=Restoring(step=3))
    assert lc.state is S.RESTORING
    lc = lifecycle_in(S.COMPILING)
    with pytest.raises(LifecycleError, match="no payload"):
        go(lc, S.RUNNING, payload=Restoring(step=3))
    assert lc.state is S.COMPILING


def test_optional_payloads_accepted():
    """CHECKPOINTING, RELEASING, RESTORING and COMPILING take their own payload types."""
    assert set(OPTIONAL_PAYLOAD) == {S.CHECKPOINTING, S.RELEASING, S.RESTORING, S.COMPILING}
    lc = lifecycle_in(S.FORMING)
    go(lc, S.RESTORING, payload=Restoring(step=40))
    t = go(lc, S.COMPILING, payload=Compiling(tier="ram", restored_step=40, restore_s=0.02))
    assert t.to_json()["payload"]["tier"] == "ram"
    go(lc, S.RUNNING)
    go(lc, S.CHECKPOINTING, payload=Checkpointing(purpose="final"))
    t = go(lc, S.RELEASING, payload=Releasing(cause=None, lost_steps=0))
    assert lc.payload == t.payload == Releasing(cause=None, lost_steps=0)


def test_timeline_file_contents(tmp_path):
    """Each transition appends one JSON line in the contract's shape with exact durations."""
    clock = FakeClock(1000.0)
    lc = Lifecycle(run_dir=tmp_path, clock=clock, incarnation=0)
    clock.advance(2.5)
    go(lc, S.FORMING, step=0, slices=("slice-a", "slice-b"), hosts=4, reason="plan ok")
    clock.advance(7.0)
    go(lc, S.RESTORING, step=0, slices=("slice-a", "slice-b"), hosts=4)
    clock.advance(1.25)
    go(lc, S.COMPILING, step=0, slices=("slice-a", "slice-b"), hosts=4)
    clock.advance(30.0)
    go(lc, S.RUNNING, step=0, slices=("slice-a", "slice-b"), hosts=4)
    clock.advance(0.5)
    go(lc, S.DRAINING, step=120, slices=("slice-a", "slice-b"), hosts=4,
       payload=Draining(event_id="ev-9", deadline=1070.0, doomed_hosts=("vm-3",),
                        cause=StopCause.SPOT_PREEMPTION))
    lines = [json.loads(x) for x in (tmp_path / TIMELINE_FILE).read_text().splitlines()]
    lines = lines[:1] + lines[2:]  # read the rest as before, without the RESTORING line
    assert [x["seq"] for x in lines] == [0, 2, 3, 4, 5]
    assert [x["state"] for x in lines] == ["PLANNING", "RESTORING", "COMPILING", "RUNNING",
                                           "DRAINING"]
    assert [x["prev"] for x in lines] == [None, "FORMING", "RESTORING", "COMPILING",
                                          "RUNNING"]
    assert [x["prev_duration_s"] for x in lines] == [0.0, 7.0, 1.25, 30.0, 0.5]
    assert [x["at"] for x in lines] == [1000.0, 1009.5, 1010.75, 1040.75, 1041.25]
    for line in lines:
        assert set(line) == CONTRACT_KEYS
    assert json.loads((tmp_path / TIMELINE_FILE).read_text().splitlines()[1])["reason"] == \
        "plan ok"
    assert lines[4]["slices"] == ["slice-a", "slice-b"]
    assert (lines[4]["hosts"], lines[4]["step"], lines[4]["incarnation"]) == (4, 120, 0)
    assert lines[4]["payload"] == {
        "type": "Draining", "event_id": "ev-9", "deadline": 1070.0, "doomed_hosts": ["vm-3"],
        "cause": "spot_preemption",
    }
    assert [t.to_json() for t in lc.timeline][2:] == lines[1:]


def test_seq_continues_across_incarnations(tmp_path):
    """A restarted driver appends after the previous incarnation's lines, torn line ignored."""
    lc = Lifecycle(run_dir=tmp_path, clock=FakeClock())
    go(lc, S.FORMING)
    with (tmp_path / TIMELINE_FILE).open("a") as fh:
        fh.write('{"seq": 7, "sta')  # a driver killed mid-write
    lc2 = Lifecycle(run_dir=tmp_path, clock=FakeClock(), incarnation=1)
    assert lc2.timeline[0].seq == 2
    assert go(lc2, S.FORMING, incarnation=1).seq == 3


def test_transition_is_logged_with_duration():
    """Each transition is a structlog event 'transition' with from, to, duration and reason."""
    clock = FakeClock()
    lc = Lifecycle(clock=clock)
    clock.advance(4.0)
    with capture_logs() as logs:
        go(lc, S.FORMING, reason="3 slices healthy")
    [entry] = [e for e in logs if e["event"] == "transition"]
    assert (entry["from"], entry["to"], entry["duration_s"], entry["reason"]) == (
        "PLANNING", "FORMING", 4.0, "3 slices healthy")
    assert entry["log_level"] == "info"


def test_time_in_state_and_durations():
    """time_in_state counts from entry; durations sum per state including the current one."""
    clock = FakeClock(0.0)
    lc = Lifecycle(clock=clock)
    clock.advance(1.0)
    go(lc, S.FORMING)
    clock.advance(2.0)
    go(lc, S.RESTORING)
    clock.advance(3.0)
    go(lc, S.COMPILING)
    clock.advance(10.0)
    go(lc, S.RELEASING)
    clock.advance(0.5)
    go(lc, S.PLANNING)
    clock.advance(1.5)
    assert lc.time_in_state() == 1.5
    assert lc.time_in_state(now=clock.t + 1.0) == 2.5
    assert lc.durations() == {S.PLANNING: 2.5, S.FORMING: 2.0, S.RESTORING: 3.0,
                              S.COMPILING: 10.0, S.RELEASING: 0.5}


def test_terminal_durations_stop_counting():
    """After a terminal transition the last state accrues no more time."""
    clock = FakeClock(0.0)
    lc = lifecycle_in(S.RUNNING)
    lc.clock = clock
    go(lc, S.FAILED)
    clock.advance(100.0)
    assert lc.terminal and S.FAILED not in lc.durations()


def test_unwritable_run_dir_does_not_stop_the_run(tmp_path):
    """If the timeline cannot be written, the error is logged and the lifecycle goes on."""
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run dir should be")
    with capture_logs() as logs:
        lc = Lifecycle(run_dir=blocker, clock=FakeClock())
        go(lc, S.FORMING)
    assert lc.state is S.FORMING
    assert any(e["event"] == "timeline_write_failed" for e in logs)


def test_string_states_are_accepted():
    """transition() accepts the state's string value (as read from a timeline or a CLI)."""
    lc = Lifecycle(clock=FakeClock())
    go(lc, "FORMING")
    assert lc.state is S.FORMING
    with pytest.raises(ValueError):
        go(lc, "EXPLODING")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(RunState)), st.floats(0, 100)), max_size=40))
def test_random_walks_keep_invariants(moves):
    """Any sequence of requests: state follows the table, seq is gapless, durations add up."""
    clock = FakeClock(0.0)
    lc = Lifecycle(clock=clock)
    for to, dt in moves:
        clock.advance(dt)
        if to in TRANSITIONS[lc.state]:
            go(lc, to)
        else:
            with pytest.raises(IllegalTransition):
                go(lc, to)
    assert [t.seq for t in lc.timeline] == list(range(len(lc.timeline)))
    for a, b in itertools.pairwise(lc.timeline):
        assert b.prev is a.state and b.state in TRANSITIONS[a.state]
        assert b.prev_duration_s == pytest.approx(b.at - a.at)
    assert sum(lc.durations(now=clock.t).values()) == pytest.approx(
        (clock.t if not lc.terminal else lc.timeline[-1].at) - lc.timeline[0].at)


def test_planning_carries_the_restart_cause_typed():
    """Every PLANNING after the first line names why: the stop cause of a re-form, ``grow``,
    or nothing (no restart); sinks read ``Transition.restart_cause``, never the reason."""
    lc = Lifecycle(clock=FakeClock())
    assert lc.timeline[0].payload is None and lc.timeline[0].restart_cause is None
    path = [S.FORMING, S.RESTORING, S.COMPILING, S.RUNNING, S.RELEASING]
    for state in path:
        go(lc, state)
    with pytest.raises(LifecycleError, match="needs a Planning payload"):
        go(lc, S.PLANNING, payload=None)
    t = go(lc, S.PLANNING, payload=Planning(cause=StopCause.SPOT_PREEMPTION),
           reason="re-forming after spot_preemption: host 10.0.0.7 lost at 12:01")
    assert t.restart_cause == "spot_preemption"
    assert t.to_json()["payload"] == {"type": "Planning", "cause": "spot_preemption",
                                      "grow": False}
    assert Planning(grow=True).restart_cause == "grow" and Planning().restart_cause is None


def test_a_restore_tier_is_read_from_the_compiling_payload():
    lc = Lifecycle(clock=FakeClock())
    for state in (S.FORMING, S.RESTORING):
        go(lc, state)
    ram = go(lc, S.COMPILING, payload=Compiling(tier="ram", restored_step=7))
    assert ram.restore_tier == "ram"
    assert Transition(seq=0, state=S.COMPILING, prev=S.RESTORING, at=0.0, prev_duration_s=0.0,
                      reason="", incarnation=0, slices=(), hosts=0, step=0,
                      payload=Compiling(tier="seed", restored_step=None)).restore_tier is None
