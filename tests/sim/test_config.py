"""Bad sim config -> ConfigError naming the setting and the fix; the CLI exits 2 with it."""

from __future__ import annotations

import pytest

from orchestrator.shared.errors import ConfigError
from orchestrator.sim.cli import main
from orchestrator.sim.config import load_sim_config


@pytest.mark.parametrize(("override", "setting", "fix"), [
    ("failures.host_per_hour=-1", "failures.host_per_hour", "0 or more"),
    ("topology.slicez=3", "topology.slicez", "topology.slices"),
    ("checkpoint.tier=tape", "checkpoint.tier", "one of"),
    ("step.overlap=2", "step.overlap", "fraction"),
    ("topology.hosts_per_slice=0", "topology.hosts_per_slice", ">= 1"),
    ("capacity.slice_return.kind=gamma", "capacity.slice_return.kind", "one of"),
    ("checkpoint.tiers.ram.write_gbps=0", "checkpoint.tiers.ram.write_gbps", "positive"),
    ("checkpoint.tiers.ram.copy_gbps=0", "checkpoint.tiers.ram.copy_gbps", "or null"),
    ("checkpoint.tiers.gcs.copy_gbps=-8", "checkpoint.tiers.gcs.copy_gbps", "Gbit/s"),
    ("horizon_h=0", "horizon_h", "168"),
    ("trace.path=/nonexistent/trace.jsonl", "trace.path", "JSONL"),
    ("controller.budgets.host_lost=-3", "controller.budgets.host_lost", "positive count"),
    ("controller.chaos=[{at_step: 3, host: 0, kind: kill}]", "controller.chaos",
     "failures.*"),
])
def test_a_bad_setting_is_named_with_its_fix(override, setting, fix):
    with pytest.raises(ConfigError) as err:
        load_sim_config(None, [override])
    assert err.value.setting == setting
    assert fix in err.value.fix


def test_a_tier_keeps_its_own_defaults_when_one_key_is_given():
    cfg = load_sim_config(None, ["checkpoint.tiers.ram.latency_s=0.5"])
    assert cfg.checkpoint.tiers.ram.latency_s == 0.5
    assert cfg.checkpoint.tiers.ram.write_gbps == 100.0  # the ram preset, not the gcs default


def test_the_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "failures.host_per_hour=-1"]) == 2
    err = capsys.readouterr().err
    assert "failures.host_per_hour" in err and "Fix:" in err
    assert not (tmp_path / "result.json").exists()


def test_the_cli_runs_and_prints_the_result_not_the_projects_targets(tmp_path, capsys):
    """A user sees the result; the project's targets for the simulator (five "not measured"
    lines after a plain run) only with --targets, and always in targets.json (issue 53)."""
    assert main(["--out", str(tmp_path), "horizon_h=1", "topology.slices=2"]) == 0
    out = capsys.readouterr().out
    assert "goodput" in out and "targets" not in out and "not measured" not in out
    assert (tmp_path / "result.json").exists() and (tmp_path / "run" / "timeline.jsonl").exists()
    assert (tmp_path / "targets.json").exists()
    assert main(["--out", str(tmp_path), "horizon_h=1", "topology.slices=2", "--targets"]) == 0
    assert "targets:" in capsys.readouterr().out
