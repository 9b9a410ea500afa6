"""The host side of compile ahead, without JAX: when a compile ahead may start, and how leaving
the runtime treats one in flight (waited for within a bound; past it the process refuses its
release, since clearing the backend under a running compile is not safe)."""

from __future__ import annotations

import threading

import pytest

from orchestrator.config import load_config
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh
from workers.host.actor import HostActor


def _spec(*, store: str | None = "/r/executables") -> HostSpec:
    cfg = load_config(None, [])
    hosts = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip="10.0.0.1",
                     instance=f"vm-{i}", devices=2) for i in range(2)]
    plan = plan_mesh(cfg, hosts, platform="cpu")
    return HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/r/checkpoints",
                             executables_dir=store)


def _busy(actor: HostActor, seconds: float) -> threading.Event:
    """Stand a thread in for a compile ahead that runs until the returned event is set."""
    done = threading.Event()
    actor._ahead = threading.Thread(target=done.wait, args=(seconds,), daemon=True)
    actor._ahead.start()
    return done


def test_compile_ahead_refuses_what_it_cannot_do():
    actor = HostActor(None, {})
    with pytest.raises(TypeError, match="HostSpec"):
        actor.compile_ahead({"plan": "not a spec"})
    assert actor.compile_ahead(_spec()) is False, "no trainer: nothing to compile beside"
    actor.trainer = object()
    assert actor.compile_ahead(_spec(store=None)) is False, "compile.cache=off"
    done = _busy(actor, 30)
    assert actor.compile_ahead(_spec()) is False, "one runs already"
    done.set()
    actor._ahead.join(5)
    actor._leaving = True
    assert actor.compile_ahead(_spec()) is False, "quiesce began: release would follow"
    assert actor.ahead_results == []


def test_leaving_waits_for_a_compile_ahead_then_refuses_the_release():
    actor = HostActor(None, {})
    done = _busy(actor, 30)
    with pytest.raises(RuntimeError, match="still running"):
        actor.wait_ahead(0.05)
    actor.quiesce(ahead_wait_s=0.05)  # logs, never raises: the others go on leaving
    assert actor._leaving and actor.ahead_running()
    with pytest.raises(RuntimeError, match="compile ahead is still running"):
        actor.release()
    done.set()
    assert actor.wait_ahead(5) == [] and not actor.ahead_running()


def test_a_finished_compile_ahead_is_waited_for_at_once():
    actor = HostActor(None, {})
    done = _busy(actor, 30)
    threading.Timer(0.2, done.set).start()
    actor.quiesce(ahead_wait_s=30)
    assert done.is_set() and not actor.ahead_running(), "quiesce waited for it to end"
