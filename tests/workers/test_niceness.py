"""The durable writer lowers its own thread's priority and the RAM copy sender enters the idle
class for itself, never for the process."""

from __future__ import annotations

import os
import threading
import time

from workers.host.niceness import idle_this_thread, lower_this_thread


def _priority_in_thread(nice: int) -> tuple[int, int]:
    seen: dict[str, int] = {}

    def body() -> None:
        lower_this_thread(nice, what="a test thread")
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return seen["thread"], os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_calling_thread_is_lowered_and_the_others_are_not():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread, main = _priority_in_thread(min(19, before + 5))
    assert thread == min(19, before + 5)
    assert main == before


def test_a_higher_priority_is_never_asked_for():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread, _ = _priority_in_thread(before - 1)  # raising priority needs privilege: not tried
    assert thread == before


def test_the_idle_class_is_for_the_calling_thread_only():
    seen: dict[str, object] = {}

    def body() -> None:
        seen["entered"] = idle_this_thread(what="a test thread")
        seen["thread"] = os.sched_getscheduler(threading.get_native_id())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["entered"] is True
    assert seen["thread"] == os.SCHED_IDLE
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER


def test_the_holders_durable_writer_runs_in_the_idle_class(tmp_path):
    from tests.workers.ram_testing import holder

    durable = holder(keep=1, persist_dir=str(tmp_path / "copies"))._store.durable
    assert durable is not None
    durable.start()
    writer = durable.thread
    assert writer is not None
    deadline = time.monotonic() + 30
    while os.sched_getscheduler(writer.native_id) != os.SCHED_IDLE:
        assert time.monotonic() < deadline, "the writer never entered the idle class"
        time.sleep(0.01)
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
