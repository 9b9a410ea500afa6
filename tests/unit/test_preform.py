"""Pre-formed groups without a cluster (``orchestrator.raygroup.preform``, ``WarmPool``): which
mesh the standbys pre-form, and when a re-form adopts, drops or ignores them. The pre-form's
Ray calls are replaced by a finished (or failed) stand-in; the path on real JAX and Ray is
``tests/faults/test_group_faults.py``'s announced notice."""

from __future__ import annotations

import dataclasses

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller.seam import GroupSpec
from orchestrator.raygroup import preform, warm_pool
from orchestrator.raygroup.group import host_envs
from orchestrator.raygroup.warm_pool import WarmPool
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh


@pytest.fixture(autouse=True)
def killed(monkeypatch) -> list:
    """The pool's kills, recorded: ``ray.kill`` would start a local Ray in this process."""
    out: list = []
    monkeypatch.setattr(warm_pool, "_kill", out.append)
    before = ray.is_initialized()
    yield out
    assert ray.is_initialized() == before, "a test of pure logic started Ray"


def _host(i: int, slice_name: str) -> HostRef:
    return HostRef(index=i, slice_name=slice_name, worker_id=i % 2, node_id=f"n{i}",
                   node_ip="127.0.0.1", instance=f"vm-{i}", devices=2)


def _spec(slices: int, spare: list[HostRef]) -> GroupSpec:
    cfg = load_config(None, [f"cluster.emulate.slices={slices}"])
    plan = plan_mesh(cfg, [_host(i, "ab"[i // 2]) for i in range(2 * slices)], platform="cpu",
                     hosts_per_slice=2)
    return GroupSpec(plan=plan, cfg=cfg, incarnation=1, run_dir="/tmp/run", standby=tuple(spare))


def _specs(spec: GroupSpec) -> list[HostSpec]:
    return [HostSpec.for_host(spec.cfg, spec.plan, h, checkpoint_dir="/tmp/run/checkpoints")
            for h in spec.plan.hosts]


def test_the_spare_slice_of_a_one_slice_mesh_is_planned_as_that_mesh():
    spec = _spec(1, [_host(7, "z"), _host(6, "z"), _host(8, "y")])  # y is incomplete
    plan = preform.spare_plan(spec)
    assert plan is not None
    assert [(h.instance, h.index) for h in plan.hosts] == [("vm-6", 0), ("vm-7", 1)]
    assert plan.shape == spec.plan.shape and plan.slice_names == ("z",)


def test_no_plan_when_the_spares_cannot_hold_the_whole_mesh():
    assert preform.spare_plan(_spec(2, [_host(4, "z"), _host(5, "z")])) is None
    assert preform.spare_plan(_spec(1, [_host(4, "z")])) is None
    assert preform.spare_plan(_spec(1, [])) is None


class _Done(preform.Preformed):
    ok = True

    def done(self) -> bool:
        return True

    def succeeded(self, timeout_s: float) -> bool:
        return self.ok


def _pool_with_preform(ok: bool = True) -> tuple[WarmPool, list[HostSpec], list[dict]]:
    spec = _spec(1, [_host(2, "z"), _host(3, "z")])
    plan = preform.spare_plan(spec)
    specs, envs = _specs(dataclasses.replace(spec, plan=plan)), host_envs(plan)
    pool = WarmPool(start_standby=lambda h: f"standby-{h.instance}")
    pool.standby = {"n2": "p2", "n3": "p3", "n9": "p9"}
    pool.preformed = _Done(specs=specs, envs=envs, actors=["p2", "p3"], refs=[])
    pool.preformed.ok = ok
    return pool, specs, envs


def test_a_re_form_onto_exactly_that_mesh_adopts_the_processes(killed):
    pool, specs, envs = _pool_with_preform()
    pool.parked = {"n0": "p0"}  # a survivor of the old slice: it holds its node
    assert pool.adopt(specs, envs) == ["p2", "p3"]
    assert pool.preformed is None and pool.standby == {"n9": "p9"}  # taken, not killed
    assert pool.parked == {} and killed == ["p0"]  # as ``acquire`` does: a standby may start


def test_another_mesh_on_those_hosts_drops_the_pre_form_and_one_elsewhere_keeps_it(killed):
    pool, specs, envs = _pool_with_preform()
    other = [dataclasses.replace(s, seed=s.seed + 1) for s in specs]
    assert pool.adopt(other, envs) is None
    assert pool.preformed is None and pool.standby == {"n9": "p9"}
    assert killed == ["p2", "p3"]  # they hold a runtime: they cannot rejoin another
    killed.clear()
    pool, _, _ = _pool_with_preform()
    home = _spec(1, [])  # the mesh's own slice again (a failure re-formed there)
    assert pool.adopt(_specs(home), host_envs(home.plan)) is None
    assert pool.preformed is not None and killed == []  # kept for a later move onto its hosts


def test_a_failed_pre_form_is_dropped_and_the_group_starts_fresh_processes(killed):
    pool, specs, envs = _pool_with_preform(ok=False)
    assert pool.adopt(specs, envs) is None
    assert pool.preformed is None and "n2" not in pool.standby and killed == ["p2", "p3"]


def test_a_standby_no_longer_wanted_drops_the_pre_form_it_was_part_of(killed):
    pool, _, _ = _pool_with_preform()
    started = []

    class _Standby:  # ``warm.remote()`` answers like a Ray actor's method
        warm = type("_M", (), {"remote": staticmethod(lambda **kw: "warming")})()

    pool.start_standby = lambda h: started.append(h.node_id) or _Standby()
    assert pool.ensure_standby([_host(2, "z")]) == 1  # n3 is no spare any more
    assert pool.preformed is None and list(pool.standby) == ["n2"]
    assert sorted(killed) == ["p2", "p3", "p9"]  # the pre-form's (in a runtime), and n9's
    assert started == ["n2"]  # a plain standby again on the host still wanted
