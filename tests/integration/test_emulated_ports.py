"""Two emulated clusters on one machine do not share a port.

Ray gives every node's dashboard agent one fixed port (52365) unless told otherwise. With a
second cluster up (two runs at once, or the suite's two xdist workers), the new head's agent
failed to bind, retried for ~5 s and went on without its server; on a loaded machine the head
then missed Ray's start-up window ("The current node timed out during startup").
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.ray_cluster import emulated_cluster

pytestmark = pytest.mark.cluster

RAY_DEFAULT_AGENT_PORT = 52365


def test_every_node_agent_listens_on_a_port_of_its_own_while_rays_default_is_taken() -> None:
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", RAY_DEFAULT_AGENT_PORT))
        held.listen()
    except OSError:  # another process has it already: the case under test all the same
        pass
    try:
        with emulated_cluster(layout=[1], devices_per_host=1) as running:
            session = Path(running.emulated.cluster.head_node.get_session_dir_path())
            ports = [int(p.read_text()) for p in session.glob("dashboard_agent_listen_port_*")]
    finally:
        held.close()
    assert len(ports) == 2, ports  # the head and the host
    assert all(p > 0 and p != RAY_DEFAULT_AGENT_PORT for p in ports), ports
    assert len(set(ports)) == 2, ports
