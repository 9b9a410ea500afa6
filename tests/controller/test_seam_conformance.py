"""Every implementation of the controller's ``WorkerGroup`` seam has every method of the
protocol with the same keyword-only parameters: a method missing from one of them (the Ray
group, the simulator's, the tests' fake) would surface only as a warning or a crash at the first
run that reaches it."""

from __future__ import annotations

import inspect

import pytest

from orchestrator.controller.seam import WorkerGroup
from orchestrator.raygroup.group import RayWorkerGroup
from orchestrator.sim.group import SimGroup
from tests.controller.fakes import FakeGroup

METHODS = sorted(name for name, fn in vars(WorkerGroup).items()
                 if callable(fn) and not name.startswith("_"))


def _keywords(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("impl", [RayWorkerGroup, SimGroup, FakeGroup])
def test_every_protocol_method_is_implemented(impl):
    assert "compile_ahead" in METHODS and "poll" in METHODS  # the protocol was read
    missing = [m for m in METHODS if not callable(getattr(impl, m, None))]
    assert missing == [], f"{impl.__name__} lacks {missing}"
    for m in METHODS:
        wanted = _keywords(getattr(WorkerGroup, m))
        assert wanted <= _keywords(getattr(impl, m)), (impl.__name__, m)
