"""Gloo's event loop goes to the idle class in a real two-process CPU group, and only it; other
platforms, single processes and an ambiguous start are left alone (``workers.host.gloo_loop``)."""

from __future__ import annotations

import json
import os
import platform
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.host.gloo_loop import idle_gloo_loop, threads

ROOT = Path(__file__).resolve().parents[2]

_MEMBER = r"""
import json, os, sys, time
from jax.experimental import multihost_utils
import jax
from workers.host.gloo_loop import idle_after_join, threads

pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=60)
idled = idle_after_join(2)
total = float(multihost_utils.process_allgather(jax.numpy.ones(())).sum())  # the loop carries it
idle = sorted(t for t in threads() if os.sched_getscheduler(t) == os.SCHED_IDLE)
waits = []  # the idled thread's epoll_wait arguments: gloo's Loop::run waits for 64 events, 10 ms
for _ in range(200):
    fields = open(f"/proc/self/task/{idled[0]}/syscall").read().split() if idled else []
    if fields[:1] == ["232"]:
        waits = fields[3:5]
        break
    time.sleep(0.005)
print("RESULT " + json.dumps({"idled": idled, "sum": total, "idle": idle, "waits": waits}),
      flush=True)
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
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    for out, _ in outs:
        (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
        got = json.loads(line.removeprefix("RESULT "))
        assert got["sum"] == 2.0  # the collective went through the idled loop
        assert len(got["idled"]) == 1, got  # the loop, not the runtime's client threads
        assert got["idle"] == got["idled"]  # no other thread of the process is in the class
        if platform.machine() == "x86_64":  # it is gloo's loop: epoll_wait(fd, ev, 64, 10 ms)
            assert got["waits"] == ["0x40", "0xa"], got


def _in_epoll(stop: threading.Event) -> None:
    """A thread blocked in epoll_wait, as gloo's loop is."""
    with select.epoll() as ep:
        while not stop.is_set():
            ep.poll(0.05)


def _started(target, stop: threading.Event) -> threading.Thread:
    t = threading.Thread(target=target, args=(stop,))
    t.start()
    time.sleep(0.1)  # let it block
    return t


@pytest.mark.parametrize(("platform_name", "processes", "idled"),
                         [("tpu", 4, 0), ("cpu", 1, 0), ("cpu", 2, 1)])
def test_only_a_cpu_group_with_peers_idles_the_new_epoll_thread(platform_name, processes,
                                                                idled):
    """The backend's start is stood in for by starting one thread in epoll and one in a futex
    wait: only on the CPU platform with peers is the first idled, never the second."""
    before = threads()
    stop = threading.Event()
    started: list[threading.Thread] = []

    def start_backend() -> str:
        started.extend([_started(_in_epoll, stop), _started(lambda s: s.wait(), stop)])
        return platform_name

    try:
        got = idle_gloo_loop(before, start_backend, num_processes=processes)
        policies = [os.sched_getscheduler(t.native_id) for t in started]
    finally:
        stop.set()
        for t in started:
            t.join()
    assert got == [started[0].native_id][:idled]
    assert policies == [os.SCHED_IDLE if idled else os.SCHED_OTHER, os.SCHED_OTHER]


def test_two_candidates_are_one_too_many_and_neither_is_idled():
    before = threads()
    stop = threading.Event()
    started: list[threading.Thread] = []

    def start_backend() -> str:
        started.extend([_started(_in_epoll, stop), _started(_in_epoll, stop)])
        return "cpu"

    try:
        got = idle_gloo_loop(before, start_backend, num_processes=2)
        policies = {os.sched_getscheduler(t.native_id) for t in started}
    finally:
        stop.set()
        for t in started:
            t.join()
    assert got == []
    assert policies == {os.SCHED_OTHER}
