"""An emulated cluster's shutdown leaves no process behind, not even one Ray would leave.

A worker whose raylet died notices it by itself, seconds later (on a loaded CI machine one
outlived the driver by more than 30 s); a grandchild of a worker Ray does not stop at all. Both
are processes of an emulated machine, and the machine is gone.
"""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from tests.support.ray_cluster import emulated_cluster

pytestmark = pytest.mark.cluster


def test_shutdown_kills_every_process_an_emulated_host_started() -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with emulated_cluster(slices=1, hosts_per_slice=1, devices_per_host=1) as running:
        (host,) = running.hosts()

        @ray.remote(num_cpus=0, resources={"TPU": 1})
        class Spawner:
            def spawn(self) -> tuple[int, int]:
                import os

                # a grandchild in its own session: Ray stops a worker's direct children only
                shell = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"],
                                         stdout=subprocess.PIPE, start_new_session=True, text=True)
                return os.getpid(), int(shell.stdout.readline())

        on_host = NodeAffinitySchedulingStrategy(node_id=host.node_id, soft=False)
        actor = Spawner.options(lifetime="detached", scheduling_strategy=on_host).remote()
        worker_pid, child_pid = ray.get(actor.spawn.remote(), timeout=120)
        before = [psutil.Process(worker_pid), psutil.Process(child_pid)]
    # ray.shutdown, then the machines (the driver's order): a detached actor outlives the job,
    # as an actor the job's end has not reached yet does
    deadline = time.monotonic() + 10.0
    alive = [p for p in before if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in before if _running(p)]
    for p in alive:
        p.kill()
    assert alive == [], f"outlived the emulated cluster: {[p.pid for p in alive]}"


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
