"""bench/ab_blocks.py: the ``ram-ab`` system's wrapper. Its hook makes a host's replicator copy
only in alternate blocks of steps, and its driver adds the hook to the Ray job. Pure: no Ray."""

from __future__ import annotations

from bench import ab_blocks
from policies import ram_tier
from workers.ram import replicator
from workers.ram.replicator import Replicator


def _due(every: int = 1) -> list[int]:
    r = Replicator([], token="t", writer="n0", incarnation=1, source=0, sources=2,
                   every=every, keep=2, max_host_bytes=1 << 20)
    return [s for s in range(1, 31) if r.periodic_due(s)]


def test_hook_copies_in_the_first_block_of_each_pair(monkeypatch):
    for module in (ram_tier, replicator):  # restored after the test
        monkeypatch.setattr(module, "copy_due", module.copy_due)
    assert _due() == list(range(1, 31))
    ab_blocks.install(block=5)
    ab_blocks.install(block=7)  # a second call changes nothing
    assert _due() == [*range(1, 6), *range(11, 16), *range(21, 26)]
    assert _due(every=2) == [2, 4, 12, 14, 22, 24]
    assert [s for s in range(1, 41) if ab_blocks.on_block(s)] == [*range(1, 11), *range(21, 31)]


def test_driver_adds_the_hook_to_the_job_keeping_its_runtime_env():
    calls = []
    init = ab_blocks.with_hook(lambda *a, **kw: calls.append((a, kw)))
    init(address="auto", runtime_env={"env_vars": {"A": "1"}}, log_to_driver=True)
    init(address=None)
    (a1, kw1), (_, kw2) = calls
    assert a1 == () and kw1["address"] == "auto" and kw1["log_to_driver"] is True
    assert kw1["runtime_env"] == {"env_vars": {"A": "1"},
                                  "worker_process_setup_hook": "bench.ab_blocks.install"}
    assert kw2["runtime_env"] == {"worker_process_setup_hook": ab_blocks.HOOK}
    assert f"{ab_blocks.__name__}.{ab_blocks.install.__name__}" == ab_blocks.HOOK
