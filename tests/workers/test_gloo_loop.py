"""Gloo's event loop goes to the idle class in a real two-process CPU group, and only it; other
platforms and single processes are left alone (``workers.host.gloo_loop``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from workers.host.gloo_loop import idle_gloo_loop, threads

ROOT = Path(__file__).resolve().parents[2]

_MEMBER = r"""
import json, os, sys
from jax.experimental import multihost_utils
import jax
from workers.host.gloo_loop import idle_gloo_loop, threads

pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=60)
idled = idle_gloo_loop(threads(), lambda: jax.devices()[0].platform, num_processes=2)
total = float(multihost_utils.process_allgather(jax.numpy.ones(())).sum())  # the loop carries it
idle = sorted(t for t in threads() if os.sched_getscheduler(t) == os.SCHED_IDLE)
print("RESULT " + json.dumps({"idled": idled, "sum": total, "idle": idle}), flush=True)
jax.distributed.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_two_process_cpu_group_idles_exactly_its_gloo_loop():
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs = [subprocess.Popen([sys.executable, "-c", _MEMBER, str(i), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    for out, _ in outs:
        (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
        got = json.loads(line.removeprefix("RESULT "))
        assert got["sum"] == 2.0  # the collective went through the idled loop
        assert len(got["idled"]) == 1, got  # the loop, not the runtime's client threads
        assert got["idle"] == got["idled"]  # no other thread of the process is in the class


@pytest.mark.parametrize(("platform", "processes"), [("tpu", 4), ("cpu", 1)])
def test_other_platforms_and_single_processes_are_left_alone(platform, processes):
    started: list[str] = []
    before = threads()
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)  # a new thread the helper must not touch
    extra.start()
    try:
        idled = idle_gloo_loop(before, lambda: started.append(platform) or platform,
                               num_processes=processes)
        policy = os.sched_getscheduler(extra.native_id)
    finally:
        stop.set()
        extra.join()
    assert started == [platform]  # the backend is started either way
    assert idled == []
    assert policy == os.SCHED_OTHER
