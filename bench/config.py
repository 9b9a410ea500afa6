"""Benchmark settings: one frozen section, three presets (smoke, quick, full), dotted overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from orchestrator.shared.errors import ConfigError

Mode = Literal["smoke", "quick", "full"]


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """How much to run. Topology: one emulated slice of ``hosts`` hosts × ``devices`` devices."""

    mode: Mode = "quick"
    hosts: int = 2
    devices: int = 2
    repeats: int = 5
    """Repeats of every side-by-side measurement (figures 1, 2, 3, 5); medians over them."""
    skip_steps: int = 5
    """Warm-up steps left out of steady-state medians."""
    overhead_steps: int = 60
    checkpoint_every: int = 10
    preempt_at_step: int = 35
    """Not a multiple of checkpoint_every: the drain must save, the baseline loses steps."""
    steps_after_preempt: int = 10
    notice_deadline_s: float = 30.0
    goodput_minutes: float = 0.0
    """Figure 4 scheduled mode length per system; 0 derives figure 4 from figure 3's runs."""
    preempt_every_s: float = 90.0
    raytrain: bool = True
    """Include Ray Train's JaxTrainer in figure 4's scheduled mode."""
    run_timeout_s: float = 900.0
    goodput_systems: str = "orchestrator,full_restart,ray_train_jaxtrainer"
    """Comma-separated systems figure 4's scheduled mode runs."""
    only_goodput: bool = False
    """Run figure 4's scheduled mode alone (needs goodput_minutes > 0); other figures empty."""
    standby_slices: int = 1
    """Figures 2-4's orchestrator keeps a warm standby on this many spare slices
    (``controller.warm.standby_slices``); 0 measures cold re-forms."""
    spare_slices: int = 1
    """Figure 4's capacity, the same for every system: this many spare slices beyond the mesh."""
    replace_after_s: float = 60.0
    """Figure 4: a preempted slice goes at its notice's deadline and a new one comes this many
    seconds later (``cluster.emulate.replace_after_s``; the restart baselines wait as long)."""
    orchestrator_settings: str = ""
    """Figure 4: extra orchestrator settings, space-separated (e.g. ``checkpoint.ram.enabled=true
    checkpoint.ram.every=10``), to measure a configuration against the same baselines."""
    goodput_checkpoint_every: int = 50
    """Figure 4's periodic checkpoint interval for every system: the orchestrator's default
    (``controller.checkpoint_interval.every_steps``), not figure 2/3's short interval."""

    def __post_init__(self) -> None:
        for name in ("hosts", "devices", "repeats", "overhead_steps", "checkpoint_every",
                     "preempt_at_step", "steps_after_preempt", "goodput_checkpoint_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"bench.{name}", f"must be > 0, got {getattr(self, name)}",
                                  f"set bench.{name} to a positive value")
        if self.skip_steps < 0 or self.skip_steps >= self.overhead_steps:
            raise ConfigError("bench.skip_steps", "must be in [0, overhead_steps)",
                              "leave steady-state steps after the warm-up")
        if self.preempt_at_step < self.checkpoint_every:
            raise ConfigError("bench.preempt_at_step",
                              f"{self.preempt_at_step} is before the first periodic checkpoint "
                              f"(every {self.checkpoint_every})",
                              "preempt after at least one checkpoint so the baseline can restore")
        if self.only_goodput and not self.goodput_minutes:
            raise ConfigError("bench.only_goodput", "needs the scheduled mode",
                              "also set goodput_minutes (e.g. 10)")
        if self.spare_slices < 0 or self.replace_after_s < 0:
            raise ConfigError("bench.spare_slices", "spare_slices and replace_after_s must be "
                              ">= 0", "e.g. spare_slices=1 replace_after_s=60")
        if self.goodput_minutes < 0:
            raise ConfigError("bench.goodput_minutes", "must be >= 0", "use 0 to derive it")
        if self.goodput_minutes and self.preempt_every_s < 20:
            raise ConfigError("bench.preempt_every_s", "below 20 s nothing can recover",
                              "use 60-120 s")


PRESETS: dict[str, dict] = {
    "smoke": {"repeats": 1, "skip_steps": 2, "overhead_steps": 12, "checkpoint_every": 4,
              "preempt_at_step": 10, "steps_after_preempt": 20, "goodput_minutes": 0.0,
              "run_timeout_s": 420.0},
    "quick": {},
    "full": {"repeats": 5, "overhead_steps": 150, "preempt_at_step": 45,
             "steps_after_preempt": 20, "goodput_minutes": 10.0, "preempt_every_s": 120.0},
}


def preset(mode: Mode, **overrides: object) -> BenchConfig:
    """The preset for ``mode`` with ``overrides`` (field names) on top; unknown names rejected."""
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    for k in overrides:
        if k not in known:
            raise ConfigError(f"bench.{k}", "unknown setting", f"use one of {sorted(known)}")
    return BenchConfig(mode=mode, **{**PRESETS[mode], **overrides})
