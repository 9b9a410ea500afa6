"""The run's group factory: what every ``RayWorkerGroup`` of one driver shares (the notice
queue, the RAM tier, the warm processes)."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.controller.seam import GroupSpec
from orchestrator.raygroup.cluster_view import RayClusterView, spawn
from orchestrator.raygroup.group import RayWorkerGroup
from orchestrator.raygroup.ram_holders import RamTier
from orchestrator.raygroup.warm_pool import WarmPool
from orchestrator.shared.host_env import device_env
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.task import task_ref


class RayGroups:
    """The run's group factory: groups share one driver-owned notice queue (created only when
    the hosts' metadata watchers can run), so a notice outlives the host that sent it, the
    run's RAM tier (``RamTier.for_config``; None: off) and one ``WarmPool`` (processes kept
    warm between groups, per ``controller.warm``). ``close`` when the run is over."""

    def __init__(self, cfg: Any, cluster: RayClusterView, *,
                 group_cls: type[RayWorkerGroup] | None = None,
                 ram: RamTier | None = None) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.group_cls = group_cls or RayWorkerGroup
        self.ram = ram
        self.settings = dataclasses.asdict(cfg.events.metadata)
        self.queue: Any = None
        warm = cfg.controller.warm
        self.pool: WarmPool | None = None
        if warm.reuse_processes != "off" or warm.standby_slices != 0:
            self.pool = WarmPool(start_standby=self._start_standby, warm_kwargs={
                "task": task_ref(cfg), "train": cfg.train, "total_steps": cfg.run.total_steps,
                "seed": cfg.run.seed})

    def __call__(self, spec: GroupSpec) -> RayWorkerGroup:
        mode = self.cfg.events.metadata.enabled
        watch = mode == "on" or (mode == "auto" and spec.plan.platform == "tpu")
        if watch and self.queue is None:
            from ray.util.queue import Queue

            self.queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
        return self.group_cls(spec, metadata_settings=self.settings if watch else None,
                              notice_queue=self.queue, unreachable=self.cluster.unreachable,
                              ram=self.ram, pool=self.pool,
                              reuse=self.cfg.controller.warm.reuse(spec.plan.platform))

    def _start_standby(self, h: HostRef) -> Any:
        env = device_env(platform=self.cluster.platform(), devices_per_host=h.devices)
        if self.ram is not None:  # its holder too, so a re-form there starts no holder either
            self.ram.holder(h.node_id)  # served at attach, once it proves it is the run's
        return spawn(self.group_cls.actor_cls, h, env, None)

    def close(self) -> None:
        """Kill the processes kept warm (the run is over; groups kill their own)."""
        if self.pool is not None:
            self.pool.close()


def ray_group_factory(cfg: Any, cluster: RayClusterView, *,
                      group_cls: type[RayWorkerGroup] | None = None,
                      ram: RamTier | None = None) -> RayGroups:
    """The run's ``RayGroups`` (kept as a function: callers and tests build factories so)."""
    return RayGroups(cfg, cluster, group_cls=group_cls, ram=ram)
