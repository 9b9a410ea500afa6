"""A tiny, exactly computable world: 1 slice x 2 hosts, 1 s steps, no jitter, no failures."""

from __future__ import annotations

from orchestrator.sim.config import SimConfig, load_sim_config

FORM, RESTORE, COMPILE = 4.0, 1.0, 6.0
STARTUP = FORM + RESTORE + COMPILE  # a fresh start restores nothing: restore_base_s only


def tiny(*overrides: str) -> SimConfig:
    return load_sim_config(None, [
        "topology.slices=1", "topology.hosts_per_slice=2", "topology.devices_per_host=2",
        "step.compute_s=1.0", "checkpoint.state_gb=0",
        "checkpoint.tiers.gcs.latency_s=0", "checkpoint.tiers.gcs.blocking_s=0",
        f"reform.forming_s={FORM}", f"reform.restore_base_s={RESTORE}",
        f"reform.compiling_s={COMPILE}", "reform.detect_s=1", "reform.jitter=0",
        "controller.checkpoint_interval.every_steps=10", "controller.backoff.base_s=2",
        "controller.backoff.max_s=2", "capacity.host_repair.kind=fixed",
        "capacity.host_repair.mean_s=0", "horizon_h=1", *overrides])
