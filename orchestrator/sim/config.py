"""The simulator's configuration: nested keyword-only dataclasses, validated with the fix named.

A sim config describes the *world* (topology, step time, checkpoint and re-form costs, failure
processes, capacity coming back, a trace to replay); the ``controller`` section is the real
``ControllerConfig`` the run would use, so budgets, elasticity, the save policy and the
deadline policy are the production ones. Defaults for the re-form phases come from our own
bench's cold re-forms (bench/RESULTS.md, bench/HISTORY.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator.controller.config import ControllerConfig
from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError


def _need(ok: bool, setting: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(setting, problem, fix)


def _nonneg(setting: str, value: float, example: str = "0") -> None:
    _need(math.isfinite(value) and value >= 0, setting, f"{value} is not a number >= 0",
          f"set `{setting}` to 0 or more, e.g. {example}")


def _pos(setting: str, value: float, example: str = "1") -> None:
    _need(math.isfinite(value) and value > 0, setting, f"{value} is not a number > 0",
          f"set `{setting}` to a positive number, e.g. {example}")


@dataclass(frozen=True, kw_only=True)
class TopologySim:
    """``slices`` the job trains on (its DCN size), each of ``hosts_per_slice`` hosts; plus
    ``spare_slices`` idle in the cluster as replacement capacity."""

    slices: int = 4
    hosts_per_slice: int = 4
    devices_per_host: int = 4
    spare_slices: int = 0

    def __post_init__(self) -> None:
        for name in ("slices", "hosts_per_slice", "devices_per_host"):
            _need(getattr(self, name) >= 1, f"topology.{name}", f"{getattr(self, name)} < 1",
                  f"set `topology.{name}` to a whole number >= 1")
        _need(self.spare_slices >= 0, "topology.spare_slices", f"{self.spare_slices} < 0",
              "set `topology.spare_slices` to 0 or more")

    @property
    def hosts(self) -> int:
        return self.slices * self.hosts_per_slice


@dataclass(frozen=True, kw_only=True)
class StepModel:
    """Step time = ``compute_s`` × accumulation steps + the DCN gradient all-reduce across
    slices (ring: 2·(n−1)/n · ``dcn_gb`` over ``dcn_gbps`` per slice, plus ``dcn_latency_s`` per
    ring hop doubling), of which ``overlap`` is hidden behind compute."""

    compute_s: float = 1.0
    dcn_gb: float = 0.0
    dcn_gbps: float = 100.0
    dcn_latency_s: float = 0.0
    overlap: float = 0.0

    def __post_init__(self) -> None:
        _pos("step.compute_s", self.compute_s, "1.0")
        _nonneg("step.dcn_gb", self.dcn_gb, "1.0")
        _pos("step.dcn_gbps", self.dcn_gbps, "100")
        _nonneg("step.dcn_latency_s", self.dcn_latency_s, "0.0005")
        _need(0 <= self.overlap <= 1, "step.overlap", f"{self.overlap} is not in [0, 1]",
              "set `step.overlap` to the fraction of the all-reduce hidden by compute, e.g. 0.5")


@dataclass(frozen=True, kw_only=True)
class TierModel:
    """One checkpoint tier. Each host writes/reads its share of the state in parallel:
    commit = ``latency_s`` + share·8/``write_gbps``; restore = ``latency_s`` + share·8/
    ``read_gbps``; the step loop is blocked per save (the device → host copy) ``blocking_s`` +
    share·8/``copy_gbps``, or ``blocking_s`` alone when ``copy_gbps`` is null (a fixed cost,
    whatever the state's size). Rates are Gbit/s, as the network's."""

    blocking_s: float = 1.0
    copy_gbps: float | None = None
    write_gbps: float = 4.0
    read_gbps: float = 8.0
    latency_s: float = 2.0

    def check(self, where: str) -> None:
        _nonneg(f"{where}.blocking_s", self.blocking_s, "1.0")
        if self.copy_gbps is not None:
            _need(math.isfinite(self.copy_gbps) and self.copy_gbps > 0, f"{where}.copy_gbps",
                  f"{self.copy_gbps} is not a number > 0",
                  f"set `{where}.copy_gbps` to the device → host copy rate in Gbit/s (e.g. 80 "
                  f"for 10 GB/s), or null to keep `{where}.blocking_s` a fixed cost")
        _pos(f"{where}.write_gbps", self.write_gbps, "4")
        _pos(f"{where}.read_gbps", self.read_gbps, "8")
        _nonneg(f"{where}.latency_s", self.latency_s, "2")


@dataclass(frozen=True, kw_only=True)
class RamTier(TierModel):
    """Host memory (a peer's RAM): fast, but gone with the host."""

    blocking_s: float = 0.3
    write_gbps: float = 100.0
    read_gbps: float = 100.0
    latency_s: float = 0.05


@dataclass(frozen=True, kw_only=True)
class LocalSsdTier(TierModel):
    blocking_s: float = 0.5
    write_gbps: float = 8.0
    read_gbps: float = 16.0
    latency_s: float = 0.2


@dataclass(frozen=True, kw_only=True)
class Tiers:
    """Per-tier cost models; each keeps its own defaults when only some keys are given."""

    ram: RamTier = field(default_factory=RamTier)
    local_ssd: LocalSsdTier = field(default_factory=LocalSsdTier)
    gcs: TierModel = field(default_factory=TierModel)


@dataclass(frozen=True, kw_only=True)
class CheckpointModel:
    """``state_gb``: the whole train state (params + optimizer) across all hosts; ``tier``:
    which tier's cost model the run's checkpoints use."""

    state_gb: float = 16.0
    tier: Literal["ram", "local_ssd", "gcs"] = "gcs"
    tiers: Tiers = field(default_factory=Tiers)

    def __post_init__(self) -> None:
        _nonneg("checkpoint.state_gb", self.state_gb, "16")
        for name in ("ram", "local_ssd", "gcs"):
            getattr(self.tiers, name).check(f"checkpoint.tiers.{name}")

    @property
    def model(self) -> TierModel:
        return getattr(self.tiers, self.tier)


@dataclass(frozen=True, kw_only=True)
class ReformModel:
    """Seconds per re-form phase (defaults: our bench's cold re-forms, see the module doc),
    spread uniformly by ±``jitter``; ``detect_s``: from a host dying to its peers' collective
    failing (Ray reports a killed actor at once, a dead node after the heartbeat);
    ``compile_cached_s``: a mesh size compiled before loads its stored executable (null = no
    cache, every group compiles); ``fresh_start_s``: a group with no checkpoint to restore
    initializes the train state instead (the init program's compile and run, cold; null =
    ``restore_base_s``)."""

    forming_s: float = 4.0
    restore_base_s: float = 1.0
    fresh_start_s: float | None = None
    compiling_s: float = 6.0
    compile_cached_s: float | None = None
    detect_s: float = 1.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("forming_s", "restore_base_s", "compiling_s", "detect_s"):
            _nonneg(f"reform.{name}", getattr(self, name), "4")
        if self.compile_cached_s is not None:
            _nonneg("reform.compile_cached_s", self.compile_cached_s, "0.2")
        if self.fresh_start_s is not None:
            _nonneg("reform.fresh_start_s", self.fresh_start_s, "5")
        _need(0 <= self.jitter < 1, "reform.jitter", f"{self.jitter} is not in [0, 1)",
              "set `reform.jitter` to a fraction, e.g. 0.1 for ±10%")


@dataclass(frozen=True, kw_only=True)
class Delay:
    """A delay distribution: ``fixed`` (mean_s), ``exponential`` (mean mean_s), ``lognormal``
    (mean mean_s, shape sigma), ``uniform`` (mean_s ± spread·mean_s)."""

    kind: Literal["fixed", "exponential", "lognormal", "uniform"] = "exponential"
    mean_s: float = 3600.0
    sigma: float = 0.5
    spread: float = 0.5

    def check(self, where: str) -> None:
        _nonneg(f"{where}.mean_s", self.mean_s, "3600")
        _nonneg(f"{where}.sigma", self.sigma, "0.5")
        _need(0 <= self.spread <= 1, f"{where}.spread", f"{self.spread} is not in [0, 1]",
              f"set `{where}.spread` to a fraction, e.g. 0.5")


@dataclass(frozen=True, kw_only=True)
class FailureModel:
    """Event processes (all Poisson, rates per hour): unannounced host failures per host,
    correlated loss of a whole slice, spot preemptions of a slice with ``preemption_notice_s``
    of notice (a fraction of notices never arrives), maintenance windows announced
    ``maintenance_lead_h`` ahead that take a slice away for ``maintenance_duration_s``, and
    bursts of ``unhealthy_reports`` ``host_unhealthy`` reports 30 s apart about one host (the
    health policy decides whether to cordon it)."""

    host_per_hour: float = 0.0
    slice_loss_per_hour: float = 0.0
    preemption_per_slice_hour: float = 0.0
    preemption_notice_s: float = 30.0
    notice_missed_fraction: float = 0.0
    notices_read: bool = True
    """False: the job reads no notices at all (a plain job that a full restart brings back):
    preemptions and maintenance windows take their slices unannounced."""
    maintenance_per_slice_hour: float = 0.0
    maintenance_lead_h: float = 72.0
    maintenance_duration_s: float = 3600.0
    unhealthy_per_host_hour: float = 0.0
    unhealthy_reports: int = 3

    def __post_init__(self) -> None:
        for name in ("host_per_hour", "slice_loss_per_hour", "preemption_per_slice_hour",
                     "maintenance_per_slice_hour", "maintenance_lead_h",
                     "unhealthy_per_host_hour"):
            _nonneg(f"failures.{name}", getattr(self, name), "0.001")
        _nonneg("failures.preemption_notice_s", self.preemption_notice_s, "30")
        _pos("failures.maintenance_duration_s", self.maintenance_duration_s, "3600")
        _need(self.unhealthy_reports >= 1, "failures.unhealthy_reports",
              f"{self.unhealthy_reports} < 1", "set `failures.unhealthy_reports` to 1 or more")
        _need(0 <= self.notice_missed_fraction <= 1, "failures.notice_missed_fraction",
              f"{self.notice_missed_fraction} is not in [0, 1]",
              "set `failures.notice_missed_fraction` to a fraction, e.g. 0.05")


@dataclass(frozen=True, kw_only=True)
class CapacityModel:
    """How long lost capacity takes to come back (as new hosts with new node ids):
    a failed host is repaired after ``host_repair``; a lost, preempted or maintained slice
    returns after ``slice_return`` (maintenance: after its window)."""

    host_repair: Delay = field(default_factory=lambda: Delay(kind="exponential", mean_s=1800.0))
    slice_return: Delay = field(default_factory=lambda: Delay(kind="exponential", mean_s=3600.0))

    def __post_init__(self) -> None:
        self.host_repair.check("capacity.host_repair")
        self.slice_return.check("capacity.slice_return")


@dataclass(frozen=True, kw_only=True)
class TraceConfig:
    """Replay a JSONL of timestamped events (a run's events.jsonl, or one Event per line),
    shifted so the first event lands ``start_offset_s`` after the simulation starts. With
    ``effects`` a preemption notice also takes its hosts away at its deadline, a maintenance
    notice during its window, host_lost/slice_lost at once."""

    path: str | None = None
    start_offset_s: float = 60.0
    effects: bool = True

    def __post_init__(self) -> None:
        _nonneg("trace.start_offset_s", self.start_offset_s, "60")
        if self.path is not None:
            _need(Path(self.path).is_file(), "trace.path", f"{self.path!r} is not a file",
                  "point `trace.path` at a JSONL file (a run's events.jsonl works), or null")


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    name: str = "sim"
    seed: int = 0
    horizon_h: float = 24.0
    total_steps: int = 0
    """Steps the job needs (it ends SUCCEEDED there); 0 = train until the horizon."""
    out_dir: str = "runs/sim"
    topology: TopologySim = field(default_factory=TopologySim)
    step: StepModel = field(default_factory=StepModel)
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel)
    reform: ReformModel = field(default_factory=ReformModel)
    failures: FailureModel = field(default_factory=FailureModel)
    capacity: CapacityModel = field(default_factory=CapacityModel)
    trace: TraceConfig = field(default_factory=TraceConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)

    def __post_init__(self) -> None:
        _pos("horizon_h", self.horizon_h, "168 (a week)")
        _need(self.total_steps >= 0, "total_steps", f"{self.total_steps} < 0",
              "set `total_steps` to the job's length in steps, or 0 to run to the horizon")
        _need(not self.controller.chaos, "controller.chaos", "chaos faults are not simulated",
              "remove controller.chaos; model faults with failures.* rates or replay them "
              "with trace.path")
        _need(self.seed >= 0, "seed", f"{self.seed} < 0", "set `seed` to a whole number >= 0")
        _need(bool(self.name) and all(c.isalnum() or c in "-_." for c in self.name), "name",
              f"{self.name!r} is empty or has characters other than letters, digits, -_.",
              "pick a name like week-256")


def load_sim_config(path: str | None = None, overrides: list[str] | None = None) -> SimConfig:
    """YAML file (optional) + dotted overrides (``failures.host_per_hour=0.001``) -> SimConfig;
    unknown keys and bad values raise ConfigError naming the setting and the fix."""
    data = configtools.load_yaml(path) if path else {}
    data = configtools.apply_overrides(data, list(overrides or []))
    return configtools.build(SimConfig, data)
