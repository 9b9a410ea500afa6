"""Cost models: step time, checkpoint save/restore per tier, re-form phases, delays.

Pure arithmetic on the sim config plus a seeded ``random.Random`` for the spreads, so the same
seed gives the same run. Separate generators for costs and for the failure schedule keep the
schedule identical when only a cost or a policy changes (common random numbers in sweeps).
"""

from __future__ import annotations

import math
import random

from orchestrator.sim.config import Delay, SimConfig


def dcn_s(cfg: SimConfig, slices: int) -> float:
    """Exposed DCN all-reduce time per step on ``slices`` slices (ring all-reduce)."""
    s = cfg.step
    if slices <= 1 or (s.dcn_gb <= 0 and s.dcn_latency_s <= 0):
        return 0.0
    volume = 2.0 * (slices - 1) / slices * s.dcn_gb * 8.0 / s.dcn_gbps
    hops = s.dcn_latency_s * 2.0 * math.ceil(math.log2(slices))
    return (volume + hops) * (1.0 - s.overlap)


def step_s(cfg: SimConfig, slices: int, accum_steps: int = 1) -> float:
    """Seconds per optimizer step on a mesh of ``slices`` slices."""
    return cfg.step.compute_s * max(1, accum_steps) + dcn_s(cfg, slices)


def _share_gb(cfg: SimConfig, hosts: int) -> float:
    return cfg.checkpoint.state_gb / max(1, hosts)


def save_blocking_s(cfg: SimConfig, hosts: int) -> float:
    """Seconds the step loop is blocked per save: every host copies its share from the devices
    into host memory in parallel, so the copy grows with the share when the tier has a copy
    rate (fixed ``blocking_s`` without one)."""
    t = cfg.checkpoint.model
    if t.copy_gbps is None:
        return t.blocking_s
    return t.blocking_s + _share_gb(cfg, hosts) * 8.0 / t.copy_gbps


def save_commit_s(cfg: SimConfig, hosts: int) -> float:
    """Seconds from a save starting to it being committed (every host's share written)."""
    t = cfg.checkpoint.model
    return t.latency_s + _share_gb(cfg, hosts) * 8.0 / t.write_gbps


def drain_save_s(cfg: SimConfig, hosts: int) -> float:
    """A drain's save (the hand-over of the stopped step to the tier) with no save of that
    step in flight: the copy out of the devices, then the commit, both per host's share."""
    return save_blocking_s(cfg, hosts) + save_commit_s(cfg, hosts)


def restore_s(cfg: SimConfig, hosts: int) -> float:
    t = cfg.checkpoint.model
    return cfg.reform.restore_base_s + t.latency_s + _share_gb(cfg, hosts) * 8.0 / t.read_gbps


class Costs:
    """Phase costs with a seeded ±jitter spread."""

    def __init__(self, cfg: SimConfig, rng: random.Random) -> None:
        self.cfg, self.rng = cfg, rng
        self.compiled_sizes: set[int] = set()

    def _spread(self, seconds: float) -> float:
        j = self.cfg.reform.jitter
        return seconds * (1.0 + j * (2.0 * self.rng.random() - 1.0)) if j else seconds

    def forming(self) -> float:
        return self._spread(self.cfg.reform.forming_s)

    def restoring(self, hosts: int, *, fresh: bool) -> float:
        if fresh:
            r = self.cfg.reform
            return self._spread(r.restore_base_s if r.fresh_start_s is None else r.fresh_start_s)
        return self._spread(restore_s(self.cfg, hosts))

    def compiling(self, slices: int) -> float:
        r = self.cfg.reform
        cached = r.compile_cached_s is not None and slices in self.compiled_sizes
        self.compiled_sizes.add(slices)
        return self._spread(r.compile_cached_s if cached and r.compile_cached_s is not None
                            else r.compiling_s)


def draw_delay(d: Delay, rng: random.Random) -> float:
    """One draw from a delay distribution (seconds, >= 0)."""
    if d.mean_s <= 0:
        return 0.0
    if d.kind == "fixed":
        return d.mean_s
    if d.kind == "exponential":
        return rng.expovariate(1.0 / d.mean_s)
    if d.kind == "uniform":
        return d.mean_s * (1.0 + d.spread * (2.0 * rng.random() - 1.0))
    # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
    mu = math.log(d.mean_s) - d.sigma ** 2 / 2.0
    return rng.lognormvariate(mu, d.sigma)


def young_daly_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval sqrt(2·C·MTBF) (seconds)."""
    return math.sqrt(2.0 * max(0.0, save_cost_s) * max(0.0, mtbf_s))


def daly_s(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006), for C < 2·MTBF:
    sqrt(2CM)·(1 + sqrt(C/2M)/3 + (C/2M)/9) − C; M beyond that."""
    c, m = max(0.0, save_cost_s), max(0.0, mtbf_s)
    if m <= 0 or c >= 2 * m:
        return m
    r = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c
