"""The driver's memory estimate before anything starts (issue 30, item 3): the task check works
out the train state's bytes per device and per host from ``jax.eval_shape`` (parameters,
optimizer state, gradients, RAM-tier copies), the driver prints one line with them and the
bound it fits them into (``orchestrator/driver/memory_bound.py``), and a state that cannot fit
is refused (exit 2, one paragraph with the numbers and the fix) before any Ray cluster starts."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.driver.memory_bound import GIB, bounds_for, machine_ram_bytes, memory_line
from orchestrator.shared.errors import ConfigError
from tests.integration.cli import run_main
from tests.integration.test_main_cli import _message


def test_emulated_bound_is_the_machines_ram_over_its_hosts_and_devices():
    """Default topology (1 slice × 2 hosts × 2 devices) on a 24 GiB machine: 12 GiB per host,
    6 GiB per device, devices in host RAM; each setting overrides its part and says so."""
    b = bounds_for(load_config(None, []), ram_bytes=24 * GIB)
    assert (b.host_bytes, b.device_bytes, b.devices_per_host, b.shared) == (
        12 * GIB, 6 * GIB, 2, True)
    assert "this machine's 24.00 GiB of RAM shared by 2 emulated host(s)" in b.source
    b = bounds_for(load_config(None, ["cluster.host_memory_gib=16"]), ram_bytes=24 * GIB)
    assert (b.host_bytes, b.device_bytes) == (16 * GIB, 8 * GIB)
    assert "cluster.host_memory_gib set" in b.source
    b = bounds_for(load_config(None, ["cluster.device_memory_gib=1.5",
                                      "cluster.host_memory_gib=4"]), ram_bytes=24 * GIB)
    assert (b.host_bytes, b.device_bytes) == (4 * GIB, int(1.5 * GIB))
    assert b.source == "cluster.device_memory_gib and cluster.host_memory_gib"


def test_emulated_spare_slices_share_the_machines_ram_too():
    """A spare slice's hosts hold state as well (standbys' pre-formed copy, their holders'
    copies of their peers'): one spare slice of 2 hosts halves each host's share. A 1 GiB
    per-host state with the RAM tier ran this machine (23.5 GiB) out of memory when only the
    mesh's 2 hosts were counted."""
    b = bounds_for(load_config(None, ["cluster.emulate.spare_slices=1"]), ram_bytes=24 * GIB)
    assert (b.host_bytes, b.device_bytes) == (6 * GIB, 3 * GIB)
    assert "shared by 4 emulated host(s) (2 on spare slices)" in b.source


def test_tpu_bound_is_the_chips_hbm_or_unknown():
    """On TPU a device's bound is its chip's HBM (cluster.accelerator) or the setting; hosts
    (their RAM, devices per host) are not known before the cluster is seen: not checked."""
    b = bounds_for(load_config(None, ["cluster.mode=tpu", "cluster.accelerator=v5litepod-16"]))
    assert (b.device_bytes, b.host_bytes, b.devices_per_host) == (16 * GIB, None, None)
    assert b.source == "v5e HBM per chip"
    b = bounds_for(load_config(None, ["cluster.mode=tpu"]))
    assert b.device_bytes is None and "cluster.device_memory_gib" in b.source


def test_machine_ram_is_memtotal_or_a_lower_cgroup_limit():
    info = "MemTotal:       24731708 kB\nMemFree: 1 kB\n"
    assert machine_ram_bytes(info, ("max\n", None)) == 24731708 * 1024
    assert machine_ram_bytes(info, (None, "9223372036854771712\n")) == 24731708 * 1024
    assert machine_ram_bytes(info, ("4294967296\n",)) == 4 * GIB
    assert machine_ram_bytes("", ()) is None


@pytest.mark.parametrize("value", ["0", "-2", "true", "lots", ".inf"])
def test_a_bad_memory_setting_names_itself(value):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"cluster.device_memory_gib={value}"])
    assert info.value.setting == "cluster.device_memory_gib"
    assert "cluster.device_memory_gib" in info.value.fix


def test_the_line_names_every_part_and_the_bound():
    """Per host: parameters, optimizer state, gradients, the RAM-tier copies and the bound."""
    mem = {"mesh": {"data": 1, "fsdp": 4, "tensor": 1}, "devices_per_host": 2, "hosts": 2,
           "device": {"params": GIB, "opt_state": 2 * GIB, "grads": GIB, "other": 12},
           "device_total": 4 * GIB + 12, "ram_keep": 2, "holder_factor": 2,
           "copy_bytes": 3 * GIB, "ram_tier": 15 * GIB, "state_bytes": 12 * GIB,
           "refused": None}
    b = bounds_for(load_config(None, ["checkpoint.ram.enabled=true"]), ram_bytes=64 * GIB)
    line = memory_line(mem, b)
    assert "\n" not in line
    for words in ("Memory per host", "parameters 2.00 GiB", "optimizer state 4.00 GiB",
                  "gradients 2.00 GiB", "step and RNG 24 B", "8.00 GiB on 2 device(s)",
                  "RAM-tier copies 15.00 GiB in host RAM (2×2+1 copies of 3.00 GiB)",
                  "mesh data=1 fsdp=4 tensor=1 over 2 host(s)",
                  "Fits within 16.00 GiB per device and 32.00 GiB per host", "CPU emulation"):
        assert words in line, (words, line)
    assert "Does NOT fit within" in memory_line({**mem, "refused": {"component": "host"}}, b)


def test_llama_8b_on_the_tiny_emulated_topology_is_refused_before_ray(tmp_path):
    """``python -m orchestrator.main`` with task.kind=llama task.preset=8b on the default
    emulated topology (4 devices, fsdp=4), hosts bounded to 16 GiB (so the verdict does not
    depend on this machine's RAM): exit 2 with the numbers (29.92 GiB per device against 8 GiB)
    and the fix, the estimate printed first, no traceback, no cluster, no checkpoint."""
    run_dir = tmp_path / "run"
    res = run_main([f"run.run_dir={run_dir}", "task.kind=llama", "task.preset=8b",
                    "cluster.host_memory_gib=16"], timeout_s=240, grace_s=5)
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    msg = _message(res.stderr, "Does not fit in memory")
    for words in ("needs 29.92 GiB per device but a device has 8.00 GiB", "fsdp × tensor = 4 now",
                  "about 16 needed", "mesh.ici.fsdp", "task.preset=1b", "param_dtype=bfloat16",
                  "cluster.host_memory_gib set", "Fix:"):
        assert words in msg, (words, msg)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("Memory per host")]
    assert len(line) == 1, res.stdout[-2000:]
    for words in ("parameters 14.96 GiB", "optimizer state 29.92 GiB", "gradients 14.96 GiB",
                  "RAM tier off", "Does NOT fit within 8.00 GiB per device"):
        assert words in line[0], (words, line[0])
    record = _log_record(res.stderr, "memory_estimate")
    assert record["fits"] is False and record["refused"] == "device"
    assert record["device_total"] > 29 * GIB and record["device_bound_bytes"] == 8 * GIB
    assert "emulated_cluster_started" not in res.stderr
    assert not (run_dir / "checkpoints").exists()
    assert res.leftovers == ()


def test_the_tiny_default_prints_its_estimate(tmp_path):
    """The default task passes and its estimate is printed before the driver reaches for Ray
    (an address nobody listens on: exit 2 there, with no cluster started by this test)."""
    res = run_main([f"run.run_dir={tmp_path / 'run'}", "cluster.address=127.0.0.1:1",
                    "cluster.connect_timeout_s=3"], timeout_s=180, grace_s=5)
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    _message(res.stderr, "Ray cluster unreachable")
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("Memory per host")]
    assert len(line) == 1, res.stdout[-2000:]
    assert "on 2 device(s)" in line[0] and "Fits within" in line[0], line[0]
    record = _log_record(res.stderr, "memory_estimate")
    assert record["fits"] is True and record["hosts"] == 2
    assert 0 < record["device_total"] < 2**20  # the tiny LM: well under a MiB per device
    assert res.leftovers == ()


def _log_record(stderr: str, event: str) -> dict:
    found = []
    for ln in stderr.splitlines():
        if ln.startswith("{"):
            try:
                rec = json.loads(ln)
            except ValueError:
                continue
            if rec.get("message") == event:
                found.append(rec)
    assert len(found) == 1, stderr[-3000:]
    return found[0]


def test_auto_turns_a_ram_tier_that_does_not_fit_off_where_true_refuses_the_run(check_here):
    """``checkpoint.ram.enabled``: ``auto`` (the default) estimates the run with the tier and,
    when its copies exceed ``max_host_bytes``, turns it off (the check says why and the driver's
    protection choice follows); ``true`` refuses the run with the numbers and the fix."""
    from orchestrator.driver import protection
    from orchestrator.driver.task_check import run_check

    cap = ["checkpoint.ram.max_host_bytes=100000"]  # the default LM's copies are ~2.5 MB
    auto = run_check(load_config(None, cap)).memory
    assert auto["refused"] is None and auto["ram_keep"] == 0
    assert "exceeds checkpoint.ram.max_host_bytes=100000" in auto["ram_auto_off"]
    assert "RAM tier off" in memory_line(auto)
    cfg, rec = protection.resolve(load_config(None, cap), auto, hosts=2, spare_slices=0)
    assert cfg.checkpoint.ram.enabled is False and "do not fit" in rec["ram_tier"]["reason"]

    forced = run_check(load_config(None, [*cap, "checkpoint.ram.enabled=true"])).memory
    assert forced["refused"]["component"] == "ram_tier" and forced["ram_auto_off"] is None

    fits = run_check(load_config(None, [])).memory
    assert fits["refused"] is None and fits["ram_keep"] == 2 and fits["ram_auto_off"] is None


def test_auto_keeps_the_copies_on_a_peer_only_when_the_own_nodes_do_not_fit(check_here):
    """``checkpoint.ram.holders: auto``: a host RAM too small for copies on the own node and a
    peer (keep × 2 + 1 copies beside the devices) but large enough for a peer's only (keep + 1)
    keeps the tier on with the copies on the peer; ``both`` turns the tier off instead."""
    from orchestrator.driver import protection
    from orchestrator.driver.task_check import run_check

    full = run_check(load_config(None, [])).memory
    devices, copy = full["device_total"] * full["devices_per_host"], full["copy_bytes"]
    assert full["ram_holders"] == "both" and full["ram_tier"] == copy * 5
    gib = (devices + copy * 4) / GIB  # between keep + 1 (3) and keep × 2 + 1 (5) copies
    tight = [f"cluster.host_memory_gib={gib:.9f}"]
    auto = run_check(load_config(None, tight)).memory
    assert auto["refused"] is None and auto["ram_auto_off"] is None
    assert auto["ram_holders"] == "peer" and auto["ram_tier"] == copy * 3
    assert "on a peer only" in memory_line(auto)
    cfg, _ = protection.resolve(load_config(None, tight), auto, hosts=2, spare_slices=0)
    assert cfg.checkpoint.ram.enabled is True and cfg.checkpoint.ram.holders == "peer"

    both = run_check(load_config(None, [*tight, "checkpoint.ram.holders=both"])).memory
    assert both["ram_keep"] == 0 and "host memory" in both["ram_auto_off"]
