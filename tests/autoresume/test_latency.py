"""bench/autoresume_latency.py's measurement runs against today's autoresume (token auth, the
allowed entrypoint), on the package's shared cluster and emulator."""

from __future__ import annotations

import pytest

from bench.autoresume_latency import measure

pytestmark = [pytest.mark.cluster, pytest.mark.emulator]


def test_one_repeat_measures_publish_to_running(tmp_path, pubsub_emulator_host, tpu_cluster):
    """One repeat: the dead run is resubmitted once and seen RUNNING; both times measured."""
    lines: list[str] = []
    to_submit, running = measure(tpu_cluster, 1, tmp_path, progress=lines.append)
    assert len(to_submit) == len(running) == 1
    assert 0 < to_submit[0] < running[0] + 1.0, (to_submit, running)
    assert lines and lines[0].startswith("repeat 0: alert publish -> job RUNNING")
