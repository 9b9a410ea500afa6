"""Every Ray head the manifests define gives a SIGTERM drain its time (issue 28, item 4): the
preStop hook signals the drivers and waits less than the pod's grace period, and `ray job stop`
waits (RAY_JOB_STOP_WAIT_TIME_S) longer than Ray's 3 s default, within the same bound."""

from __future__ import annotations

import pytest

from orchestrator.driver import prestop
from tests.deploy.test_deploy import KUBERAY, head_group, yaml_docs

MIN_DRAIN_S = 60  # one step + one durable save of a v6e-16 model on GCS FUSE, with margin


def _heads() -> list[tuple[str, dict]]:
    return [(f"{p.name}:{d['metadata']['name']}", head_group(d)["template"]["spec"])
            for p in sorted(KUBERAY.glob("*.yaml")) for d in yaml_docs(p)
            if d.get("kind") in ("RayCluster", "RayJob")]


@pytest.mark.parametrize(("where", "pod"), _heads(), ids=[w for w, _ in _heads()])
def test_the_head_drains_its_drivers_before_kubernetes_kills_them(where, pod):
    grace = pod["terminationGracePeriodSeconds"]
    [head] = [c for c in pod["containers"] if c["name"] == "ray-head"]
    command = head["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", prestop.__name__], where
    wait_s = float(command[command.index("--wait-s") + 1])
    env = {e["name"]: e.get("value") for e in head["env"]}
    stop_wait_s = float(env["RAY_JOB_STOP_WAIT_TIME_S"])
    assert MIN_DRAIN_S <= wait_s < grace, where
    assert MIN_DRAIN_S <= stop_wait_s < grace, where
