"""Fault-matrix rows checked without a cluster: what only a TPU mesh would show.

A re-form after a slice loss on TPU hands each host process the new mesh's env; a process
reused from the old group (parked, or a standby whose node env names another mesh) must not
keep the old ``MEGASCALE_*`` (libtpu would wait for slices that are gone). The emulated CPU
cluster never sets them, so the check runs the driver's and the host's own code on a TPU plan.
"""

from __future__ import annotations

import os

from orchestrator.config import load_config
from orchestrator.raygroup.group import host_envs
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MEGASCALE_KEYS, MeshPlan, plan_mesh


def _plan(cfg, layout: dict[str, int]) -> MeshPlan:
    hosts = [HostRef(index=-1, slice_name=s, worker_id=w, node_id=f"node-{s}-{w}",
                     node_ip=f"10.0.{i}.{w}", instance=f"{s}-w{w}", devices=4)
             for i, (s, n) in enumerate(layout.items()) for w in range(n)]
    return plan_mesh(cfg, hosts, platform="tpu")


def megascale_after_slice_loss() -> list[str]:
    """Hosts of a 1-slice mesh (after a 2-slice one lost a slice) whose process still holds a
    MEGASCALE_* key, as "<origin> <node>"; [] when none does."""
    from workers.host.actor import HostActor

    cfg = load_config(None, ["train.global_batch=48"])
    before, after = _plan(cfg, {"s0": 2, "s1": 2}), _plan(cfg, {"s0": 2})
    saved = {k: os.environ.get(k) for k in MEGASCALE_KEYS}
    stale: list[str] = []
    try:
        for origin in ("fresh", "parked", "standby"):
            for h, env in zip(after.hosts, host_envs(after), strict=True):
                spec = HostSpec.for_host(cfg, after, h, checkpoint_dir="/nonexistent")
                old = dict(zip(before.hosts, host_envs(before), strict=True))
                old_env = next(e for o, e in old.items() if o.node_id == h.node_id)
                os.environ.update(old_env)  # the old mesh's, or the node's own
                if origin == "parked":
                    old_spec = HostSpec.for_host(cfg, before, next(
                        o for o in before.hosts if o.node_id == h.node_id),
                        checkpoint_dir="/nonexistent")
                    HostActor(old_spec, old_env).rejoin(spec, env)
                elif origin == "standby":
                    HostActor(None, {}).rejoin(spec, env)
                else:
                    HostActor(spec, env)
                if [k for k in MEGASCALE_KEYS if k in os.environ]:
                    stale.append(f"{origin} {h.node_id}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return stale
