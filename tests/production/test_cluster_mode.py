"""cluster.mode misuse is refused before anything starts, with the fix (issue 16, item 2)."""

from __future__ import annotations

import pytest

from orchestrator.main import explain
from orchestrator.raygroup.topology import JOB_CONFIG_ENV, check_cluster_mode
from orchestrator.shared.errors import ConfigError

IN_JOB = {JOB_CONFIG_ENV: "{}", "RAY_ADDRESS": "127.0.0.1:6379"}


def test_emulate_inside_a_ray_job_is_refused_with_the_fix():
    """The RuntimeEnvSetupError case becomes one paragraph naming cluster.mode=auto."""
    with pytest.raises(ConfigError) as err:
        check_cluster_mode("emulate", None, IN_JOB)
    text = " ".join(explain(err.value).split())  # one paragraph, wrapped
    assert err.value.setting == "cluster.mode"
    assert "inside a Ray job" in text and "cluster.mode=auto" in text
    assert "python -m orchestrator.cluster up" in text


def test_emulate_with_an_address_is_refused():
    """An address emulate would ignore is a mistake, not a silent default."""
    with pytest.raises(ConfigError, match=r"cluster\.address"):
        check_cluster_mode("emulate", "ray://10.0.0.1:10001", {})


def test_tpu_without_any_cluster_is_refused():
    """mode=tpu, no address, no RAY_ADDRESS: there can be no TPU hosts."""
    with pytest.raises(ConfigError, match="no Ray cluster is named"):
        check_cluster_mode("tpu", None, {})


@pytest.mark.parametrize("mode,address,env", [
    ("emulate", None, {}),                      # make run
    ("auto", None, {}),                         # make run, default mode
    ("auto", None, IN_JOB),                     # ray job submit, the documented way
    ("tpu", None, IN_JOB),
    ("tpu", "10.0.0.1:6379", {}),
    ("emulate", None, {"RAY_ADDRESS": "http://127.0.0.1:8265"}),  # a shell with cluster env
])
def test_fitting_modes_pass(mode, address, env):
    """Every documented way to run is accepted."""
    check_cluster_mode(mode, address, env)
