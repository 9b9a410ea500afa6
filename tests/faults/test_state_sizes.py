"""Protection holds at the sizes real runs have, with the defaults: ``python -m
orchestrator.main`` on the default topology plus one spare slice, the built-in ``llama`` task
shaped to 256 MiB of train state per host (``bench.sizes.model_for``), nothing protective set.
The RAM tier decides itself on (its cap comes from the host's RAM, not a fixed 2 GiB) and a
kill -9 of a host loses at most one step. The host is given 1.4 GiB of RAM
(``cluster.host_memory_gib``, the emulation's setting): too little for the copies on the own
node and a peer (1.58 GiB with the devices' state), enough for a peer's only (1.08 GiB), the
path a 1 GiB state takes on this machine (``checkpoint.ram.holders: auto``). Functional: no
timing is asserted (the sweep's figures, and the copy interval a longer run settles on, are
``python -m bench.sizes``)."""

from __future__ import annotations

import json

import pytest

from bench import sizes
from tests.integration.cli import run_main

pytestmark = pytest.mark.cluster


def test_256_mib_per_host_kill_9_with_the_defaults_keeps_the_tier_on_and_loses_at_most_a_step(
        tmp_path):
    """On a host whose RAM holds its copies only on a peer: the tier stays on, the restore
    reads the peer's holder (the pieces each host's shards need) and loses at most a step."""
    run_dir = tmp_path / "run"
    # the kill comes before `every: auto` has weighed its copies (it leaves a group's first 4
    # out and needs 5 more), so the copies are of every step: what this test asks is that the
    # tier turns itself on at this size and its restore works; the interval it chooses after,
    # and what that costs, is bench.sizes' (bench/RESULTS.md figure 15)
    args = [f"run.run_dir={run_dir}", *sizes.overrides(256, "kill", at_step=6, total_steps=8),
            "cluster.host_memory_gib=1.4"]
    out = run_main(args, timeout_s=600)
    assert out.code == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not out.leftovers, out.leftovers
    summary = json.loads((run_dir / "summary.json").read_text())
    tier = summary["protection"]["ram_tier"]
    assert tier["enabled"] is True and tier["setting"] == "auto", tier
    assert tier["holders"] == "peer" and "on a peer only" in tier["reason"], tier
    assert tier["copy_bytes"] >= 256 * 1024**2 - 1024**2, tier
    assert "max_host_bytes: auto" in tier["reason"], tier["reason"]
    assert "Protection: RAM tier on" in out.stdout
    (recovery,) = summary["recoveries"]
    assert recovery["cause"] == "host_lost", recovery
    restore = summary["restores"][-1]
    assert restore["tier"] == "ram", restore
    assert recovery["lost_steps"] <= 1, (recovery, summary["protection"].get("ram_every"))
    assert (summary["state"], summary["step"]) == ("SUCCEEDED", 8)
