"""The host's step loop strikes a ``kill_in_save`` fault on a save step however the save is
written: from the devices (Orbax) or by the RAM holders (``checkpoint.ram.durable_from_ram``).
The second was never struck (issue 51, found by the soak: the default RAM tier made the fault
kind a no-op)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.host.steps import StepLoop
from workers.host.where import Position


class Chaos:
    def __init__(self) -> None:
        self.saves: list[int] = []

    def before_step(self, step, *, settle_saves) -> None:
        pass

    def in_save(self, step: int) -> None:
        self.saves.append(step)


class Copies:
    def __init__(self, persist: bool) -> None:
        self.persist = persist

    def after_step(self, step, trainer, *, persist=False) -> float:
        return 0.01

    def can_persist(self) -> bool:
        return self.persist

    def last_wait_s(self) -> float:
        return 0.0

    def newest_durable(self, orbax_step):
        return orbax_step


class Trainer:
    def __init__(self) -> None:
        self.step = 0
        self.ckpt = SimpleNamespace(wait=lambda: None, committed_step=lambda: None)
        self.task = SimpleNamespace(tokens_per_example=None)

    def train_step(self):
        self.step += 1
        return SimpleNamespace(step=self.step, loss=1.0, grad_norm=1.0, step_time_s=0.01,
                               lr=0.1, extra={})

    def save(self, *, wait=False):
        return SimpleNamespace(started=True, blocking_s=0.0)

    def evaluate(self):
        return None


@pytest.mark.parametrize("from_ram", [False, True])
def test_a_save_step_is_where_kill_in_save_strikes(from_ram):
    chaos = Chaos()
    loop = StepLoop(Position(), chaos=chaos, copies=Copies(persist=from_ram))
    out = loop.run(Trainer(), 6, save_steps=[3, 6])
    assert out["step"] == 6 and chaos.saves == [3, 6]
