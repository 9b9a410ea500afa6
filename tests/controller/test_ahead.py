"""Compile ahead: a group of several slices with no spare is asked to compile the step of the
mesh an elastic shrink forms, with exactly the spec PLANNING later builds for that shrink (so
it loads), and never where no such shrink exists or a spare would take the doomed slice's place
(a compile in flight is waited for when the group leaves: wasted on a same-size re-form)."""

from __future__ import annotations

import pytest

from orchestrator.controller.seam import GroupSpec
from tests.controller.fakes import FakeGroup, executable_key
from tests.controller.harness import make

TWO = ("cluster.emulate.slices=2", "run.total_steps=30")


def _compiles(sim) -> list[tuple[int, str]]:
    compiles = sim.controller.run_state.ledger.compiles
    return [(g.spec.plan.num_slices, c["source"])
            for g, c in zip(sim.fleet.groups, compiles, strict=False)]


@pytest.mark.parametrize("mode", ["keep", "scale"])
@pytest.mark.parametrize("doomed", ["vm-s1-0", "vm-s0-0"])
def test_a_shrink_loads_the_step_compiled_ahead(tmp_path, mode, doomed):
    """Whichever slice goes, and whether the shrink keeps the global batch (accumulating) or
    scales it (and the LR), the shrunk group's key is the one compiled ahead."""
    sim = make(tmp_path, *TWO, f"controller.batch_on_resize={mode}", slices=("s0", "s1"))
    sim.fleet.on_step(7, lambda g: sim.notice(host=doomed))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.step == 30
    assert _compiles(sim) == [(2, "compiled"), (1, "loaded")]
    (spec,) = sim.fleet.ahead  # asked once: by the 2-slice group (a 1-slice group has no shrink)
    first, shrunk = sim.fleet.groups
    assert spec.plan.hosts == first.spec.plan.hosts[:2], "a prefix of the running group's hosts"
    assert executable_key(spec) == executable_key(shrunk.spec)
    survivor = "s1" if doomed == "vm-s0-0" else "s0"
    assert shrunk.spec.plan.slice_names == (survivor,)
    if mode == "keep":
        assert shrunk.spec.accum_steps == 2 and spec.accum_steps == 2
    else:
        assert shrunk.spec.cfg.train.global_batch == spec.cfg.train.global_batch < \
            first.spec.cfg.train.global_batch


@pytest.mark.parametrize("overrides", [
    ("cluster.emulate.slices=1",),
    (*TWO, "controller.elastic.enabled=false"),
    (*TWO, "controller.elastic.min_slices=2"),
    (*TWO, "compile.ahead=false"),
    (*TWO, "compile.cache=off"),
])
def test_no_compile_ahead_where_no_shrink_can_use_it(tmp_path, overrides):
    slices = ("s0", "s1") if "cluster.emulate.slices=2" in overrides else ("s0",)
    sim = make(tmp_path, *overrides, slices=slices)
    assert sim.run().state == "SUCCEEDED"
    assert sim.fleet.ahead == []


def test_a_failing_compile_ahead_never_stops_the_run_and_is_tried_once(tmp_path, monkeypatch):
    calls: list[int] = []

    def broken(self, spec: GroupSpec) -> bool:
        calls.append(self.step)
        raise RuntimeError("the seam broke")

    monkeypatch.setattr(FakeGroup, "compile_ahead", broken)
    sim = make(tmp_path, *TWO, "run.total_steps=300", slices=("s0", "s1"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.step == 300
    assert calls == [0], "once per group (30 s of steps: 2 re-checks would have retried)"


def test_no_compile_ahead_while_a_spare_slice_exists_then_asked_when_it_goes(tmp_path):
    """With a spare the next mesh has the same size; once the spare is gone, RUNNING notices
    within ``RECHECK_S`` and asks."""
    sim = make(tmp_path, *TWO, "run.total_steps=400", slices=("s0", "s1"), spare=("s2",))
    sim.fleet.on_step(50, lambda g: sim.cluster.remove("s2-h0"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    (asked_at,) = sim.fleet.ahead_steps
    # 0.1 s steps: the re-check comes within RECHECK_S (100 steps) and a chunk of the loss
    assert 50 <= asked_at <= 50 + 100 + 20, asked_at
