"""Every implementation of the controller's ``WorkerGroup`` seam has every method of the core
protocol with the same keyword-only parameters, and exactly the optional capabilities it is
meant to have, in full: a method missing from one of them (the Ray group, the simulator's, the
tests' fake) would surface only as a warning or a crash at the first run that reaches it, and a
capability half implemented would be skipped by the controller's ``isinstance`` check."""

from __future__ import annotations

import inspect

import pytest

from orchestrator.controller.seam import (
    CAPABILITIES,
    CompilesAhead,
    InjectsFaults,
    RamCopies,
    WarmStandby,
    WorkerGroup,
)
from orchestrator.raygroup.group import RayWorkerGroup
from orchestrator.sim.group import SimGroup
from tests.controller.fakes import FakeGroup


def _methods(proto: type) -> list[str]:
    return sorted(name for name, fn in vars(proto).items()
                  if callable(fn) and not name.startswith("_"))


CORE = _methods(WorkerGroup)
ALL = {WarmStandby, RamCopies, CompilesAhead, InjectsFaults}
EXPECTED = {RayWorkerGroup: ALL, FakeGroup: ALL, SimGroup: set()}
"""The simulator models none of them: it does not implement them (no stubs)."""


def _keywords(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _conforms(impl: type, proto: type) -> list[str]:
    """The protocol's methods ``impl`` lacks or declares without its keyword-only parameters."""
    bad = []
    for m in _methods(proto):
        fn = getattr(impl, m, None)
        if not callable(fn) or not _keywords(getattr(proto, m)) <= _keywords(fn):
            bad.append(m)
    return bad


@pytest.mark.parametrize("impl", sorted(EXPECTED, key=lambda c: c.__name__))
def test_every_core_method_is_implemented(impl):
    assert "poll" in CORE and "compile_ahead" not in CORE  # the protocol was read
    assert _conforms(impl, WorkerGroup) == [], impl.__name__


@pytest.mark.parametrize("impl", sorted(EXPECTED, key=lambda c: c.__name__))
def test_capabilities_are_whole_and_as_expected(impl):
    assert set(CAPABILITIES) == ALL
    for cap in CAPABILITIES:
        methods = _methods(cap)
        present = [m for m in methods if hasattr(impl, m)]
        if cap in EXPECTED[impl]:
            assert _conforms(impl, cap) == [], (impl.__name__, cap.__name__)
        else:
            assert present == [], f"{impl.__name__} stubs {cap.__name__}: {present}"


def test_the_controller_sees_capabilities_on_instances():
    """``isinstance`` on the runtime-checkable protocols is what the controller asks."""
    sim = object.__new__(SimGroup)
    fake = object.__new__(FakeGroup)
    assert not any(isinstance(sim, cap) for cap in CAPABILITIES)
    assert all(isinstance(fake, cap) for cap in CAPABILITIES)
