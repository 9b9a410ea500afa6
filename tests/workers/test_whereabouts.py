"""A host says where it is while a long call runs on another thread (issue 28, item 11): the
last step done, whether it entered the next one, and the call it is in. Without JAX: a stand-in
trainer blocks where the real one would wait for a peer."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from workers.host.actor import HostActor


class _Trainer:
    """Steps and saves that block until ``go`` is set, as a collective waiting for a peer."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.go = threading.Event()
        self.ckpt = SimpleNamespace(committed_step=lambda: None)
        self.data_resumed = None

    def restore(self, skip_steps: list[int]) -> SimpleNamespace:
        return SimpleNamespace(step=self.step, skipped=[])

    def train_step(self) -> SimpleNamespace:
        self.go.wait(30)
        self.step += 1
        return SimpleNamespace(step=self.step)

    def save(self, wait: bool) -> SimpleNamespace:
        self.go.wait(30)
        return SimpleNamespace(step=self.step)


def _host(step: int) -> tuple[HostActor, _Trainer]:
    actor = HostActor(None, {})
    actor.trainer = trainer = _Trainer(step)
    assert actor.restore()["step"] == step  # the host's mirrored step, as a restore sets it
    return actor, trainer


def _when(actor: HostActor, want: dict, timeout_s: float = 10.0) -> dict:
    """The host's answer once it equals ``want`` (or the last one after ``timeout_s``)."""
    until = time.monotonic() + timeout_s
    got = actor.whereabouts()
    while got != want and time.monotonic() < until:
        time.sleep(0.02)
        got = actor.whereabouts()
    return got


def _in_thread(fn, *args, **kwargs) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, kwargs=kwargs, daemon=True)
    t.start()
    return t


def test_a_host_inside_a_step_has_entered_it():
    actor, trainer = _host(7)
    assert actor.whereabouts() == {"step": 7, "entered": 7, "calls": []}
    t = _in_thread(actor.run_steps, 8)
    inside = {"step": 7, "entered": 8, "calls": ["run_steps"]}
    assert _when(actor, inside) == inside
    trainer.go.set()
    t.join(10)
    assert actor.whereabouts() == {"step": 8, "entered": 8, "calls": []}


def test_a_host_hung_before_the_step_has_not_entered_it():
    """The chaos ``hang``: the host stops before its next step, its peers wait inside it."""
    actor, trainer = _host(7)
    trainer.go.set()
    actor.inject_fault({"at_step": 7, "kind": "hang", "seconds": 1.0})
    t = _in_thread(actor.run_steps, 8)
    hung = {"step": 7, "entered": 7, "calls": ["run_steps"]}
    assert _when(actor, hung, timeout_s=0.5) == hung
    t.join(10)
    assert actor.whereabouts()["step"] == 8


def test_a_host_in_a_save_says_so():
    actor, trainer = _host(10)
    t = _in_thread(actor.save, wait=True)
    saving = {"step": 10, "entered": 10, "calls": ["save"]}
    assert _when(actor, saving) == saving
    trainer.go.set()
    t.join(10)
    assert actor.whereabouts()["calls"] == []
