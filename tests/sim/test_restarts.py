"""The side-by-side at TPU scale (bench/sim_restarts.py): three systems on the same failure
draws, differing only in their recovery costs and whether a notice is used."""

from __future__ import annotations

import json

from bench import sim_restarts

# a small job with many failures, so every kind of recovery happens in a few simulated hours
SMALL = ["topology.slices=4", "topology.hosts_per_slice=2", "topology.spare_slices=1",
         "checkpoint.state_gb=16", "failures.host_per_hour=0.01",
         "failures.preemption_per_slice_hour=0.2", "failures.slice_loss_per_hour=0",
         "failures.maintenance_per_slice_hour=0.05", "failures.maintenance_lead_h=0.5",
         "failures.maintenance_duration_s=600", "capacity.slice_return.mean_s=600",
         "capacity.host_repair.mean_s=600"]


def test_the_three_systems_differ_only_where_their_recoveries_do():
    got = sim_restarts.run(hours=12, seeds=1, extra=SMALL)
    rows = got["systems"]
    assert list(rows) == ["orchestrator", "whole_group", "full_restart"]
    # notices: drained by the orchestrator and by Ray Train's preemption path, unused by a
    # full restart (its preemptions arrive as lost hosts)
    assert rows["orchestrator"]["restarts"].get("spot_preemption", 0) > 0
    assert rows["whole_group"]["restarts"].get("spot_preemption", 0) > 0
    for cause in ("spot_preemption", "maintenance"):
        assert rows["full_restart"]["restarts"].get(cause, 0) == 0, cause
    assert rows["full_restart"]["restarts"].get("host_lost", 0) > \
        rows["orchestrator"]["restarts"].get("host_lost", 0)
    # restores from persistent storage (30 min published) against in-cluster copies (< 1 min)
    assert rows["orchestrator"]["badput_fraction"].get("restore", 0.0) < \
        rows["whole_group"]["badput_fraction"].get("restore", 0.0)
    g = {name: row["goodput"] for name, row in rows.items()}
    assert g["orchestrator"] > g["whole_group"] > g["full_restart"], g
    # every published figure is named with its source, and the result carries them
    for key, fig in sim_restarts.PUBLISHED.items():
        assert "https://" in fig.source or fig.source.startswith("the same"), key
        assert got["published"][key]["seconds"] == fig.seconds


def test_the_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    assert sim_restarts.main(["--hours", "4", "--out", str(tmp_path),
                              *[a for o in SMALL for a in ("--set", o)]]) == 0
    out = capsys.readouterr().out
    assert "| goodput |" in out and "full_restart" in out
    (result,) = tmp_path.glob("sim-restarts-*/result.json")
    assert set(json.loads(result.read_text())["systems"]) == {
        "orchestrator", "whole_group", "full_restart"}


def test_bad_settings_exit_2_naming_the_setting(capsys):
    assert sim_restarts.main(["--hours", "1", "--set", "topology.slices=-1"]) == 2
    assert "topology.slices" in capsys.readouterr().err
    assert sim_restarts.main(["--hours", "0"]) == 2
