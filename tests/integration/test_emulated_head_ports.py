"""The emulated cluster's head takes free ports, not Ray's fixed defaults: with another Ray's
dashboard on 8265 (a second run, a test worker, a user's own Ray) a run's piped stderr carried
Ray's "Failed to bind to 127.0.0.1:8265" among its own records (seen in issue 53's walk)."""

from __future__ import annotations

import socket

import pytest

from orchestrator.raygroup.topology import LOOPBACK, head_args

pytestmark = pytest.mark.cluster


def test_a_taken_dashboard_port_is_not_ours_to_complain_about(capfd):
    from ray.cluster_utils import Cluster

    taken = socket.socket()
    try:
        taken.bind((LOOPBACK, 8265))
        taken.listen()
    except OSError:
        pass  # another Ray holds it already: the same situation
    cluster = Cluster(initialize_head=True, head_node_args={**head_args(), "num_cpus": 1})
    try:
        assert cluster.address
    finally:
        cluster.shutdown()
        taken.close()
    out, err = capfd.readouterr()
    assert "Failed to bind" not in out + err, err[-2000:]
