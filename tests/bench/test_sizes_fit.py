"""bench.sizes' calibration of the simulator on synthetic sweep results (no cluster): each
movement's line seconds = latency + bytes per host / rate, and the sim settings it prints
reproduce those lines in the simulator's own cost model."""

from __future__ import annotations

import json

import pytest
import yaml

from bench import sizes
from orchestrator.sim import models
from orchestrator.sim.config import load_sim_config

MIB = 2**20
PACK, HAND, RESTORE, SAVE = (0.01, 3.0), (0.05, 0.6), (0.3, 0.5), (1.0, 0.4)
"""(latency s, GB/s) of each synthetic movement."""


def _s(line: tuple[float, float], size_mib: int) -> float:
    return line[0] + size_mib * MIB / (line[1] * 1e9)


def _run(size_mib: int, system: str, *, tier: bool = True) -> dict:
    m: dict = {}
    if system == "notice":
        m["phases"] = {"CHECKPOINTING": _s(HAND if tier else SAVE, size_mib), "FORMING": 0.1}
    if tier and system != "off":
        m["pack"] = {"s": _s(PACK, size_mib), "GBps": 9.9}  # GBps: not what the fit reads
        m["restore"] = {"s": _s(RESTORE, size_mib), "GBps": 9.9, "tier": "ram"}
    return {"size_mib": size_mib, "system": system, "tier": tier, "movements": m}


def _sweep(sizes_mib=(64, 256, 1024)) -> dict:
    runs = [_run(s, sys_) for s in sizes_mib for sys_ in ("kill", "notice", "off")]
    return {"validity": {"valid": True}, "runs": runs}


def _cfg(fitted: dict, size_mib: int):
    """The simulator with the printed settings, 1 slice x 2 hosts of ``size_mib`` each."""
    sim = yaml.safe_load(fitted["yaml"])
    ram, reform = sim["checkpoint"]["tiers"]["ram"], sim["reform"]
    return load_sim_config(None, [
        "topology.slices=1", "topology.hosts_per_slice=2", "checkpoint.tier=ram",
        f"checkpoint.state_gb={2 * size_mib * MIB / 1e9}",
        *(f"checkpoint.tiers.ram.{k}={v}" for k, v in ram.items()),
        *(f"reform.{k}={v}" for k, v in reform.items())])


def test_each_movement_gets_its_latency_and_rate_over_the_sizes():
    fitted = sizes.fit(_sweep())
    assert fitted["sizes_mib"] == [64, 256, 1024]
    for name, (latency, rate) in (("pack", PACK), ("handover", HAND), ("restore", RESTORE)):
        line = fitted["lines"][name]
        assert line["latency_s"] == pytest.approx(latency, abs=1e-4), name
        assert line["GBps"] == pytest.approx(rate, rel=1e-3), name
        assert line["points"] == 3 if name == "handover" else 6
    assert "save" not in fitted["lines"]  # the tier was on: the drain handed over from RAM


def test_the_printed_sim_settings_reproduce_the_fitted_lines():
    fitted = sizes.fit(_sweep())
    for size in (64, 256, 1024, 4096):  # 4096: the line carries on beyond the sweep
        cfg = _cfg(fitted, size)
        assert models.save_blocking_s(cfg, 2) == pytest.approx(_s(PACK, size), rel=2e-3)
        assert models.drain_save_s(cfg, 2) == pytest.approx(_s(HAND, size), rel=2e-3)
        assert models.restore_s(cfg, 2) == pytest.approx(_s(RESTORE, size), rel=2e-3)


def test_one_size_gives_latency_zero_and_the_rate():
    fitted = sizes.fit(_sweep((256,)))
    pack = fitted["lines"]["pack"]
    assert pack["latency_s"] == 0.0
    assert pack["GBps"] == pytest.approx(256 * MIB / _s(PACK, 256) / 1e9, rel=1e-3)
    ram = yaml.safe_load(fitted["yaml"])["checkpoint"]["tiers"]["ram"]
    assert ram["blocking_s"] == 0.0
    assert ram["copy_gbps"] == pytest.approx(8 * pack["GBps"], rel=1e-3)


def test_a_drain_with_the_tier_off_is_a_save_and_noise_gives_no_negative_latency():
    result = {"runs": [_run(s, "notice", tier=False) for s in (64, 1024)]
              + [{"size_mib": 64, "system": "kill", "tier": True,
                  "movements": {"pack": {"s": 0.001}}},
                 {"size_mib": 1024, "system": "kill", "tier": True,
                  "movements": {"pack": {"s": 0.5}}}]}
    fitted = sizes.fit(result)
    assert fitted["lines"]["save"]["GBps"] == pytest.approx(SAVE[1], rel=1e-3)
    assert "handover" not in fitted["lines"]
    pack = fitted["lines"]["pack"]  # least squares gives a negative latency: through 0
    assert pack["latency_s"] == 0.0 and pack["GBps"] > 0
    assert any("write_gbps" in n for n in fitted["notes"])


def test_the_cli_prints_the_lines_and_the_yaml(tmp_path, capsys):
    path = tmp_path / "sizes-x.json"
    path.write_text(json.dumps(_sweep()))
    assert sizes.main(["--fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| pack | 0.01 | 3.0 |" in out and "copy_gbps" in out and "restore_base_s" in out


def test_the_cli_refuses_a_file_it_cannot_fit(tmp_path, capsys):
    assert sizes.main(["--fit", str(tmp_path / "missing.json")]) == 2
    assert "bench/results/sizes-" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"runs": [_run(64, "off")]}))
    assert sizes.main(["--fit", str(empty)]) == 2
    assert "kill or notice" in capsys.readouterr().err
