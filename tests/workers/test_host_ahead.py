"""The host side of compile ahead, without JAX (a slow stand-in compiles): when a compile ahead
may start, and how leaving the runtime treats one in flight (waited for within a bound; past it
the process refuses its release, since clearing the backend under a running compile is not
safe)."""

from __future__ import annotations

import threading

import pytest

from orchestrator.config import load_config
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh
from workers.host import ahead
from workers.host.actor import HostActor
from workers.host.ahead import CompileAhead


def _spec(*, store: str | None = "/r/executables") -> HostSpec:
    cfg = load_config(None, [])
    hosts = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip="10.0.0.1",
                     instance=f"vm-{i}", devices=2) for i in range(2)]
    plan = plan_mesh(cfg, hosts, platform="cpu")
    return HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/r/checkpoints",
                             executables_dir=store)


class _Slow:
    """Stands in for the compile (``CompileAhead(compile=...)``): runs until ``done`` is set."""

    def __init__(self, seconds: float = 30) -> None:
        self.done = threading.Event()
        self.seconds = seconds
        self.specs: list[HostSpec] = []

    def __call__(self, spec: HostSpec) -> dict:
        self.specs.append(spec)
        self.done.wait(self.seconds)
        return {"source": "compiled", "key": "k", "reason": "test"}


def _busy(monkeypatch: pytest.MonkeyPatch) -> tuple[HostActor, _Slow]:
    """An actor whose compile ahead is running (started beside a trainer, as after ``build``),
    its trainer gone again so that leaving closes nothing."""
    slow = _Slow()
    monkeypatch.setattr(ahead, "compile_step", slow)
    actor = HostActor(None, {})
    actor.trainer = object()
    assert actor.compile_ahead(_spec()) is True
    actor.trainer = None
    assert actor.ahead_running()
    return actor, slow


def test_compile_ahead_refuses_what_it_cannot_do():
    slow = _Slow()
    runs = CompileAhead(compile=slow)
    with pytest.raises(TypeError, match="HostSpec"):
        runs.start({"plan": "not a spec"}, beside_trainer=True)
    assert runs.start(_spec(), beside_trainer=False) is False, "no trainer: nothing beside"
    assert runs.start(_spec(store=None), beside_trainer=True) is False, "compile.cache=off"
    assert runs.start(_spec(), beside_trainer=True) is True
    assert runs.start(_spec(), beside_trainer=True) is False, "one runs already"
    slow.done.set()
    assert runs.wait(5) == [{"processes": 2, "slices": 1, "source": "compiled", "key": "k",
                             "reason": "test", "seconds": runs.results[0]["seconds"]}]
    runs.leave(0.0)
    assert runs.start(_spec(), beside_trainer=True) is False, "quiesce began: release would follow"
    runs.rejoin()
    assert runs.start(_spec(), beside_trainer=True) is True, "a new group: it may start again"
    assert runs.wait(5)[-1]["source"] == "compiled" and len(slow.specs) == 2


def test_the_actor_refuses_a_compile_ahead_without_a_step_built(monkeypatch):
    slow = _Slow()
    monkeypatch.setattr(ahead, "compile_step", slow)
    actor = HostActor(None, {})
    with pytest.raises(TypeError, match="HostSpec"):
        actor.compile_ahead({"plan": "not a spec"})
    assert actor.compile_ahead(_spec()) is False, "no trainer: nothing to compile beside"
    assert slow.specs == [] and actor.wait_ahead(1) == []


def test_a_failed_compile_ahead_is_reported_never_raised():
    def broken(spec: HostSpec) -> dict:
        raise ValueError("process 3 is not among the first 2")

    runs = CompileAhead(compile=broken)
    assert runs.start(_spec(), beside_trainer=True)
    (out,) = runs.wait(5)
    assert out["source"] == "failed" and "ValueError: process 3" in out["reason"]


def test_leaving_waits_for_a_compile_ahead_then_refuses_the_release(monkeypatch):
    actor, slow = _busy(monkeypatch)
    with pytest.raises(RuntimeError, match="still running"):
        actor.wait_ahead(0.05)
    actor.quiesce(ahead_wait_s=0.05)  # logs, never raises: the others go on leaving
    assert actor.ahead_running()
    actor.trainer = object()
    assert actor.compile_ahead(_spec()) is False, "quiesce began: no other one starts"
    actor.trainer = None
    with pytest.raises(RuntimeError, match="compile ahead is still running"):
        actor.release()
    slow.done.set()
    assert [r["source"] for r in actor.wait_ahead(5)] == ["compiled"]
    assert not actor.ahead_running()


def test_a_finished_compile_ahead_is_waited_for_at_once(monkeypatch):
    actor, slow = _busy(monkeypatch)
    threading.Timer(0.2, slow.done.set).start()
    actor.quiesce(ahead_wait_s=30)
    assert slow.done.is_set() and not actor.ahead_running(), "quiesce waited for it to end"
