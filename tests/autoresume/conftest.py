"""One Pub/Sub emulator and one Ray cluster for the package's tests that need them.

The cluster is a real `ray start --head` with token auth on and one emulated TPU slice (2 hosts
x 1 CPU device: the state still sharded over both, each collective on 2 gloo ranks, not 4, as
in ``tests/faults/harness.py``) joined to it, like a TPU cluster; each of the two costs 10-30 s
to start on 2 cores, so they are started once, on first use, and always stopped at the end of
the package.
Tests keep apart by unique run ids, submission ids, topics and subscriptions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.autoresume.ray_server import RayCluster, TpuSlices, ray_cluster
from tests.support.pubsub_emulator import emulator_fixture

TPU = TpuSlices(slices=1, hosts_per_slice=2, devices_per_host=1)

pubsub_emulator_host = emulator_fixture(scope="package")


@pytest.fixture(scope="package")
def tpu_cluster() -> Iterator[RayCluster]:
    mp = pytest.MonkeyPatch()
    mp.delenv("RAY_ADDRESS", raising=False)
    try:
        with ray_cluster(tpu=TPU) as cluster:
            yield cluster
    finally:
        mp.undo()
