"""When a Ray group starts its standbys (``RayWorkerGroup._standby_due``): not inside
COMPILING, where their JAX imports skewed the MFU peak measured right after the compile; once,
with the first chunk; and never after a handover's ``warm_up`` started them with its hosts
(a later ``ensure_standby`` of the plan's standbys alone would kill the handover's). No Ray
call is made: the group has no actors and the pool is a recorder."""

from __future__ import annotations

from orchestrator.config import load_config
from orchestrator.controller.seam import GroupSpec
from orchestrator.raygroup.group import RayWorkerGroup
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import plan_mesh


class RecordingPool:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.preforms: list[list[str]] = []

    def ensure_standby(self, hosts) -> int:
        self.calls.append([h.instance for h in hosts])
        return len(hosts)

    def start_preform(self, specs, envs) -> bool:
        assert [s.host.index for s in specs] == list(range(len(specs)))  # the mesh's own order
        self.preforms.append([s.host.instance for s in specs])
        return True


def _host(i: int, slice_name: str) -> HostRef:
    return HostRef(index=i, slice_name=slice_name, worker_id=i % 2, node_id=f"n{i}",
                   node_ip="127.0.0.1", instance=f"vm-{i}", devices=2)


def _group(tmp_path, *overrides: str, slices: int = 1) -> tuple[RayWorkerGroup, RecordingPool]:
    cfg = load_config(None, [f"cluster.emulate.slices={slices}", *overrides])
    hosts = [_host(i, "ab"[i // 2]) for i in range(2 * slices)]
    plan = plan_mesh(cfg, hosts, platform="cpu", hosts_per_slice=2)
    spare = (_host(2 * slices, "z"), _host(2 * slices + 1, "z"))
    pool = RecordingPool()
    group = RayWorkerGroup(GroupSpec(plan=plan, cfg=cfg, incarnation=1, run_dir=str(tmp_path),
                                     standby=spare), pool=pool)  # type: ignore[arg-type]
    group._standby_due = True  # what compile() leaves behind
    return group, pool


def test_standbys_start_once_with_the_first_chunk(tmp_path):
    group, pool = _group(tmp_path)
    assert pool.calls == []
    group.start_chunk(10, chunk=1, save_steps=[])
    group.start_chunk(20, chunk=2, save_steps=[])
    assert pool.calls == [["vm-2", "vm-3"]]
    # the spare slice can hold the whole (one-slice) mesh: its standbys pre-form it, once
    assert pool.preforms == [["vm-2", "vm-3"]]


def test_no_preform_when_the_spares_cannot_hold_the_mesh_or_it_is_off(tmp_path):
    two, pool = _group(tmp_path / "two", slices=2)  # 2 slices, 1 spare slice
    two.start_chunk(10, chunk=1, save_steps=[])
    assert pool.calls == [["vm-4", "vm-5"]] and pool.preforms == []
    off, pool = _group(tmp_path / "off", "controller.warm.preform=false")
    off.start_chunk(10, chunk=1, save_steps=[])
    assert pool.calls == [["vm-2", "vm-3"]] and pool.preforms == []


def test_a_handover_before_the_first_chunk_keeps_its_standbys(tmp_path):
    group, pool = _group(tmp_path)
    group.warm_up([_host(4, "c")])
    group.start_chunk(10, chunk=1, save_steps=[])
    assert pool.calls == [["vm-2", "vm-3", "vm-4"]]  # no later call without vm-4
    assert pool.preforms == [["vm-2", "vm-3"]]  # the plan's spare slice, not the handover's
