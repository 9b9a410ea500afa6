"""The ``auto`` protection settings: RAM tier on when a peer exists and the copies fit, standby
processes on every spare slice, each choice with its reason and its one-setting opt-out."""

import pytest

from orchestrator.config import load_config
from orchestrator.controller.config import WarmConfig
from orchestrator.driver import protection
from orchestrator.shared.errors import ConfigError

MIB = 1024**2


def mem(copy_bytes, **extra):
    return {"copy_bytes": copy_bytes, "state_bytes": copy_bytes * 2, **extra}


def test_the_defaults_are_auto():
    cfg = load_config(None, [])
    assert cfg.checkpoint.ram.enabled == "auto" and cfg.checkpoint.ram.every == "auto"
    assert cfg.controller.warm.standby_slices == "auto"


def test_auto_turns_the_tier_on_when_a_peer_exists_and_it_fits():
    cfg, rec = protection.resolve(load_config(None, []), mem(3 * MIB), hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.enabled is True
    assert rec["ram_tier"]["enabled"] is True and rec["ram_tier"]["setting"] == "auto"
    assert "12.0 MiB" in rec["ram_tier"]["reason"]  # 3 MiB x 2 kept x 2 hosts
    assert rec["ram_tier"]["every"] == "auto"
    assert "1 spare slice(s)" in rec["standby_slices"]["reason"]
    assert "Opt out: checkpoint.ram.enabled=false" in protection.line(rec)


GIB = 1024**3


def test_auto_cap_comes_from_the_hosts_ram_share_beside_its_devices():
    """768 MiB per host on this machine's share (11.77 GiB, the devices' state in the same
    RAM): the tier is on, the cap is 75 % of what the devices leave, and the line says so."""
    share = int(11.77 * GIB)
    m = mem(768 * MIB, host_bytes=share, shared=True, device_total=384 * MIB,
            devices_per_host=2)
    cfg, rec = protection.resolve(load_config(None, []), m, hosts=2, spare_slices=1)
    want = int((share - 768 * MIB) * 0.75)
    assert cfg.checkpoint.ram.enabled is True and cfg.checkpoint.ram.max_host_bytes == want
    assert rec["ram_tier"]["max_host_bytes"] == want
    assert "3.00 GiB within checkpoint.ram.max_host_bytes: auto, 8.26 GiB" in \
        rec["ram_tier"]["reason"]
    assert "of a host's RAM share 11.77 GiB less its devices' state 768.0 MiB" in \
        protection.line(rec)


def test_auto_cap_turns_the_tier_off_when_the_hosts_ram_cannot_hold_the_copies():
    """2 GiB per host on a 6 GiB share: 8 GiB of copies (own node and peer) do not fit 75 % of
    4 GiB, nor do 4 GiB on a peer only; the reason names the figures and the fix."""
    m = mem(2 * GIB, host_bytes=6 * GIB, shared=True, device_total=GIB, devices_per_host=2)
    cfg, rec = protection.resolve(load_config(None, []), m, hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.enabled is False
    why = rec["ram_tier"]["reason"]
    assert "4.00 GiB (on a peer only" in why
    assert "exceeds checkpoint.ram.max_host_bytes: auto, 3.00 GiB" in why
    assert "set checkpoint.ram.max_host_bytes to a number of bytes" in why


def test_auto_keeps_the_copies_on_a_peer_only_when_both_do_not_fit():
    """1 GiB per host on a 5.89 GiB share (this machine's, 4 emulated hosts): 4 GiB of copies
    on the own node and a peer exceed 75 % of what the devices leave (3.42 GiB), 2 GiB on a
    peer only fit: the tier stays on, the holders setting and the line say where."""
    share = int(5.89 * GIB)
    m = mem(GIB, host_bytes=share, shared=True, device_total=int(0.666 * GIB),
            devices_per_host=2)
    cfg, rec = protection.resolve(load_config(None, []), m, hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.enabled is True and cfg.checkpoint.ram.holders == "peer"
    assert cfg.checkpoint.ram.holder_sources == 1
    assert rec["ram_tier"]["holders"] == "peer"
    assert "2.00 GiB (on a peer only" in protection.line(rec)


def test_holders_both_keeps_the_own_nodes_copy_or_turns_the_tier_off():
    share = int(5.89 * GIB)
    m = mem(GIB, host_bytes=share, shared=True, device_total=int(0.666 * GIB),
            devices_per_host=2)
    cfg, rec = protection.resolve(load_config(None, ["checkpoint.ram.holders=both"]), m,
                                  hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.enabled is False
    assert "4.00 GiB exceeds" in rec["ram_tier"]["reason"]


def test_small_copies_are_kept_on_both():
    cfg, rec = protection.resolve(load_config(None, []), mem(3 * MIB, host_bytes=6 * GIB),
                                  hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.holders == "both" and rec["ram_tier"]["holders"] == "both"


def test_auto_cap_unknown_before_the_cluster_is_left_to_each_host():
    cfg, rec = protection.resolve(load_config(None, []), mem(3 * MIB), hosts=2, spare_slices=1)
    assert cfg.checkpoint.ram.max_host_bytes == "auto"
    assert cfg.checkpoint.ram.cap_bytes is None
    assert "decided by each host from its own RAM" in rec["ram_tier"]["reason"]


def test_auto_leaves_the_tier_off_without_a_peer():
    cfg, rec = protection.resolve(load_config(None, []), mem(MIB), hosts=1, spare_slices=0)
    assert cfg.checkpoint.ram.enabled is False
    assert "one host" in rec["ram_tier"]["reason"]
    assert protection.line(rec).startswith("Protection: RAM tier off")


def test_auto_leaves_the_tier_off_when_the_copies_exceed_the_cap():
    cfg = load_config(None, ["checkpoint.ram.max_host_bytes=1000000"])
    cfg, rec = protection.resolve(cfg, mem(MIB), hosts=4, spare_slices=0)
    assert cfg.checkpoint.ram.enabled is False
    assert "exceeds checkpoint.ram.max_host_bytes=1000000" in rec["ram_tier"]["reason"]


def test_auto_follows_the_checks_verdict_on_host_ram():
    cfg, rec = protection.resolve(load_config(None, []),
                                  mem(MIB, ram_auto_off="On each host ... host memory"),
                                  hosts=2, spare_slices=0)
    assert cfg.checkpoint.ram.enabled is False and "do not fit" in rec["ram_tier"]["reason"]


def test_sizes_from_the_whole_state_when_the_mesh_is_not_known_yet():
    # TPU before the cluster is seen: only the whole state's bytes; its share per host
    cfg = load_config(None, ["checkpoint.ram.max_host_bytes=1000000"])
    _, rec = protection.resolve(cfg, {"state_bytes": 2_000_000, "device": None}, hosts=2,
                                spare_slices=None)
    assert rec["ram_tier"]["enabled"] is False  # 1 MB per host x 2 x 2 > 1 MB


@pytest.mark.parametrize("setting", ["true", "false"])
def test_a_set_value_is_kept_as_set(setting):
    cfg = load_config(None, [f"checkpoint.ram.enabled={setting}",
                             "controller.warm.standby_slices=0"])
    cfg, rec = protection.resolve(cfg, mem(10**12), hosts=1, spare_slices=3)
    assert cfg.checkpoint.ram.enabled is (setting == "true")
    assert rec["ram_tier"]["setting"] == setting
    assert rec["standby_slices"]["reason"] == "controller.warm.standby_slices=0"


def test_standby_count_auto_is_every_spare_and_a_number_caps_it():
    assert WarmConfig().standby_count(3) == 3
    assert WarmConfig(standby_slices=1).standby_count(3) == 1
    assert WarmConfig(standby_slices=0).standby_count(3) == 0


@pytest.mark.parametrize(("override", "says"), [
    ("checkpoint.ram.enabled=maybe", "auto or true or false"),
    ("checkpoint.ram.every=often", "auto or a whole number"),
    ("checkpoint.ram.holders=nearby", "one of ['auto', 'both', 'peer']"),
    ("checkpoint.ram.every=0", "checkpoint.ram.every=auto or a number"),
    ("checkpoint.ram.max_overhead=2", "share of step time"),
    ("checkpoint.ram.failures_per_hour=-1", "failures per hour"),
    ("controller.warm.standby_slices=-1", "auto"),
])
def test_bad_values_name_the_choices(override, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert says in str(err.value)
