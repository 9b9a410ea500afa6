"""The CLI's sweeps write their figures (CSV, JSON, text plot, PNG) and the targets."""

from __future__ import annotations

import json

from orchestrator.sim.cli import main

TINY = ["topology.slices=2", "topology.hosts_per_slice=2", "reform.jitter=0",
        "failures.host_per_hour=2", "capacity.host_repair.kind=fixed",
        "capacity.host_repair.mean_s=0", "controller.budgets.host_lost=100000",
        "checkpoint.tiers.gcs.blocking_s=5", "checkpoint.tiers.gcs.latency_s=0"]


def test_checkpoint_and_spares_sweeps_write_their_figures(tmp_path, capsys):
    code = main(["--out", str(tmp_path), "--no-run", "--sweep", "checkpoint", "--sweep",
                 "spares", "--seeds", "1", "--spares", "0,1", "horizon_h=3", *TINY])
    assert code == 0
    out = capsys.readouterr().out
    assert "Young/Daly sqrt(2*C*MTBF)" in out and "goodput vs spare slices" in out
    for name in ("checkpoint_sweep", "spares_sweep"):
        for ext in ("csv", "json", "txt", "png"):
            assert (tmp_path / f"{name}.{ext}").stat().st_size > 0, (name, ext)
    ck = json.loads((tmp_path / "checkpoint_sweep.json").read_text())
    assert len(ck["rows"]) >= 8 and ck["young_daly_steps"] > 0
    targets = json.loads((tmp_path / "targets.json").read_text())
    assert targets["checkpoint_optimum_vs_young_daly"]["measured"] == ck["fit_vs_young_daly"]
    assert targets["week_256_slices_wall_s"]["measured"] is None  # not a week of 256 slices


def test_the_scale_sweep_reports_growth_per_controller_step(tmp_path, capsys):
    code = main(["--out", str(tmp_path), "--no-run", "--sweep", "scale",
                 "--scale-horizon-h", "0.05", *TINY])
    assert code == 0
    res = json.loads((tmp_path / "scale_sweep.json").read_text())
    assert [r["hosts"] for r in res["rows"]] == [4, 16, 64, 256, 1024, 4096]
    assert all(r["decisions"] > 0 for r in res["rows"])
    assert "growth per controller step" in capsys.readouterr().out
