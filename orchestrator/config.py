"""The run's configuration: nested keyword-only dataclasses, validated before any actor starts.

The driver's config tree. The sections a host receives (``train``, ``eval``, ``checkpoint``, the
resolved mesh shape) are defined in ``orchestrator.shared.sections`` and the task's in
``orchestrator.shared.task``, so a host never imports this module.

Each section checks what it can alone in ``__post_init__``; ``RunConfig.validate_for`` checks what
needs the cluster (mesh axes against the devices there are). Every error names the setting and
the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.controller.config import ControllerConfig
from orchestrator.events.config import EventsConfig
from orchestrator.metrics.config import MetricsConfig
from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.sections import (
    CheckpointConfig,
    EvalConfig,
    MeshShape,
    TrainConfig,
    positive,
)
from orchestrator.shared.task import ModelConfig, TaskConfig, reconcile
from policies.autoresume import restart_shaped

__all__ = ["CheckpointConfig", "EvalConfig", "MeshShape", "ModelConfig", "RunConfig", "TaskConfig",
           "TrainConfig", "load_config"]


@dataclass(frozen=True, kw_only=True)
class RunSection:
    """Identity and length of the run."""

    name: str = "default"
    run_dir: str = "runs/default"
    total_steps: int = 200
    seed: int = 0
    steps_per_call: int = 0
    """Steps each host runs per driver call; 0 picks from the measured step time (~1 s a call)."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigError("run.name", f"{self.name!r} is empty or has characters other than "
                              "letters, digits, '-', '_' and '.'", "pick a name like my-run-1")
        if restart_shaped(self.name):
            raise ConfigError("run.name", f"{self.name!r} ends in -r<digits>, the shape of the "
                              "restart job ids autoresume gives a run (run 'exp' restarts as "
                              "'exp-r1'), so it would pass for another run's restart",
                              f"pick a name without that ending, e.g. {self.name}-run or "
                              f"{self.name.rsplit('-r', 1)[0]}-retry{self.name.rsplit('-r', 1)[1]}")
        positive("run.total_steps", self.total_steps)
        if self.steps_per_call < 0:
            raise ConfigError("run.steps_per_call", "must be >= 0", "use 0 for automatic")


@dataclass(frozen=True, kw_only=True)
class EmulateConfig:
    """Hosts emulated on this machine when the Ray cluster has no TPU nodes."""

    slices: int = 1
    hosts_per_slice: int = 2
    devices_per_host: int = 2
    spare_slices: int = 0
    """Extra emulated slices started idle: replacement capacity for fault demos."""
    replace_after_s: float | None = None
    """None: a preempted emulated slice stays up, only left out (no cloud emulated). A number:
    the cloud is emulated (orchestrator/cluster/cloud.py): the slice a preemption notice names
    goes away at the notice's deadline and a new slice joins this many seconds later."""

    def __post_init__(self) -> None:
        positive("cluster.emulate.slices", self.slices)
        positive("cluster.emulate.hosts_per_slice", self.hosts_per_slice)
        positive("cluster.emulate.devices_per_host", self.devices_per_host)
        if self.spare_slices < 0:
            raise ConfigError("cluster.emulate.spare_slices", "must be >= 0", "set it to 0 or more")
        r = self.replace_after_s
        if r is not None and not (isinstance(r, int | float) and math.isfinite(r) and r >= 0):
            raise ConfigError("cluster.emulate.replace_after_s", f"{r!r} is not seconds >= 0",
                              "set seconds until a preempted slice comes back (e.g. 60), or "
                              "null to keep preempted slices up")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Where Ray is and what the hosts are."""

    address: str | None = None
    """None: the RAY_ADDRESS cluster if set (ray job submit), else a local emulated cluster."""
    mode: Literal["auto", "tpu", "emulate"] = "auto"
    emulate: EmulateConfig = field(default_factory=EmulateConfig)
    accelerator: str | None = None
    """Chip generation for the MFU peak (v4, v5e, v5p, v6e); None reads the TPU pod type label."""
    slices: int = 0
    """TPU mode: slices to use (0 = every ready slice)."""
    connect_timeout_s: float = 60.0
    device_memory_gib: float | None = None
    """Memory of one device (GiB) the pre-start check fits the train state into. None: the
    chip's HBM for ``accelerator`` on TPU (unknown: not checked), this machine's RAM shared by
    the emulated devices on the CPU emulation (docs/models.md, "Will it fit?")."""
    host_memory_gib: float | None = None
    """RAM of one emulated host (GiB) for its devices' state and the RAM tier's copies. None:
    this machine's RAM over the emulated hosts. On TPU a host's RAM is not checked before the
    cluster is seen (devices per host unknown)."""

    def __post_init__(self) -> None:
        positive("cluster.connect_timeout_s", self.connect_timeout_s)
        for name in ("device_memory_gib", "host_memory_gib"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not math.isfinite(v) or v <= 0):
                raise ConfigError(f"cluster.{name}", f"{v!r} is not a size in GiB > 0",
                                  f"set cluster.{name} to the GiB each "
                                  f"{name.split('_')[0]} has (e.g. 16), or null to detect it")
        if self.slices < 0:
            raise ConfigError("cluster.slices", "must be >= 0", "use 0 for all slices")


@dataclass(frozen=True, kw_only=True)
class IciAxes:
    """Mesh axes inside a slice (ICI). -1 fills with what is left of the slice's devices."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1


@dataclass(frozen=True, kw_only=True)
class DcnAxes:
    """Mesh axes across slices (DCN). data=-1 spans every slice in the current plan."""

    data: int = -1
    fsdp: int = 1


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    ici: IciAxes = field(default_factory=IciAxes)
    dcn: DcnAxes = field(default_factory=DcnAxes)

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor"):
            v = getattr(self.ici, name)
            if v == 0 or v < -1:
                raise ConfigError(f"mesh.ici.{name}", f"must be a positive size or -1, got {v}",
                                  f"set mesh.ici.{name} to a divisor of the slice's devices, or -1")
        if [self.ici.data, self.ici.fsdp, self.ici.tensor].count(-1) > 1:
            raise ConfigError("mesh.ici", "more than one axis is -1",
                              "leave at most one ICI axis at -1 (fill)")
        for name in ("data", "fsdp"):
            v = getattr(self.dcn, name)
            if v == 0 or v < -1:
                raise ConfigError(f"mesh.dcn.{name}", f"must be a positive size or -1, got {v}",
                                  f"set mesh.dcn.{name} to a divisor of the slice count, or -1")
        if [self.dcn.data, self.dcn.fsdp].count(-1) > 1:
            raise ConfigError("mesh.dcn", "more than one axis is -1",
                              "leave at most one DCN axis at -1 (fill)")

    def resolve(self, *, slices: int, devices_per_slice: int) -> MeshShape:
        """Concrete axis sizes for a topology; raises ConfigError naming the axis to change."""
        ici = _fill("mesh.ici", {"data": self.ici.data, "fsdp": self.ici.fsdp,
                                 "tensor": self.ici.tensor}, devices_per_slice, "devices per slice")
        dcn = _fill("mesh.dcn", {"data": self.dcn.data, "fsdp": self.dcn.fsdp}, slices, "slices")
        return MeshShape(ici_data=ici["data"], ici_fsdp=ici["fsdp"], ici_tensor=ici["tensor"],
                         dcn_data=dcn["data"], dcn_fsdp=dcn["fsdp"])


def _fill(prefix: str, axes: dict[str, int], total: int, what: str) -> dict[str, int]:
    known = math.prod(v for v in axes.values() if v != -1)
    out = dict(axes)
    for name, v in axes.items():
        if v == -1:
            if total % known:
                raise ConfigError(f"{prefix}.{name}", f"{total} {what} do not divide by the other "
                                  f"axes' product {known}",
                                  f"make the other {prefix} axes multiply to a divisor of {total}")
            out[name] = total // known
    if math.prod(out.values()) != total:
        raise ConfigError(prefix, f"axes {out} multiply to {math.prod(out.values())}, but there "
                          f"are {total} {what}",
                          f"make {prefix}.* multiply to {total} (or set one axis to -1)")
    return out


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """Compiled steps kept in RUN_DIR/executables (workers/training/executables.py), so a re-formed
    or resumed group of a mesh seen before loads its step instead of compiling it (measured in
    bench/RESULTS.md)."""

    cache: Literal["on", "off"] = "on"
    """off: every group compiles, nothing is read or written."""
    dir: str = ""
    """Where the store lives. Empty: $TPU_ORCH_EXECUTABLES_DIR when set, else RUN_DIR/executables.
    A directory shared by several runs (like JAX's compilation cache dir) lets a fresh run of a
    model and mesh seen before load too; the key keeps different models and meshes apart."""
    ahead: bool = True
    """While a group of several slices trains with no spare slice, its first processes compile
    the step of the mesh an elastic shrink forms (one slice fewer) at the lowest CPU priority,
    so a shrink loads it.
    Only where it applies: ``controller.elastic.enabled``, the cache on, the CPU emulation
    (a TPU runtime numbers its chips its own way: the key would not match)."""
    share: bool = True
    """One process of a group compiles each function and stores it; the others load its file
    (on the CPU emulation every process shares one machine's cores: N compiles at once take N
    times the CPU of one). A process that hears nothing from the owner within half the smaller
    of ``timeouts.compile_s`` and ``timeouts.restore_s`` compiles itself. Only with the cache
    on, the CPU emulation, and groups of two or more processes
    (``workers/training/compile_share.py``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.share, bool):
            raise ConfigError("compile.share", f"{self.share!r} is not true or false",
                              "set compile.share=true (one process compiles for the group) or "
                              "false (every process compiles its own)")
        if not isinstance(self.ahead, bool):
            raise ConfigError("compile.ahead", f"{self.ahead!r} is not true or false",
                              "set compile.ahead=true (compile a shrink's step ahead) or false")
        if self.cache not in ("on", "off"):
            raise ConfigError("compile.cache", f"{self.cache!r} is not 'on' or 'off'",
                              "set compile.cache=on (load stored executables) or off")
        if self.dir and not self.dir.startswith("/"):
            raise ConfigError("compile.dir", f"{self.dir!r} is not an absolute path",
                              "give an absolute directory every host can write (or leave it "
                              "empty for RUN_DIR/executables)")


@dataclass(frozen=True, kw_only=True)
class TimeoutsConfig:
    """Bounds on every barrier; passing one is a group failure."""

    init_s: float = 90.0
    compile_s: float = 300.0
    restore_s: float = 180.0
    step_s: float = 60.0
    save_s: float = 120.0
    heartbeat_s: float = 20.0
    """JAX coordination heartbeat: how fast survivors notice a dead peer."""

    def __post_init__(self) -> None:
        for name in ("init_s", "compile_s", "restore_s", "step_s", "save_s", "heartbeat_s"):
            positive(f"timeouts.{name}", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class LogsConfig:
    """What the driver's terminal shows (issue 32 item 7); changes nothing about the run itself,
    so it is left out of ``RunConfig.digest``."""

    format: Literal["auto", "json", "console"] = "auto"
    """auto: a TTY on stdout gets state lines and a live progress bar, anything else (``ray job
    logs``, Cloud Logging) JSON records and progress lines; ``--log-format`` overrides it."""
    verbose: bool | None = None
    """Print the Ray workers' own lines (Gloo, XLA, JAX, prints) on the driver's terminal too.
    Unset or false: they are kept in RUN_DIR/workers.log only (a host's warnings reach the
    terminal and driver.log.jsonl either way)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    """The built-in ``lm`` task's settings (``orchestrator/shared/task.py: reconcile``)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", reconcile(self.task, self.model))  # lm: one place
        if self.eval.every > self.run.total_steps:
            raise ConfigError("eval.every", f"{self.eval.every} is more than run.total_steps="
                              f"{self.run.total_steps}: no eval would run",
                              f"set eval.every to at most {self.run.total_steps} (a divisor of "
                              "it evaluates the final model), or 0 for no eval")

    def validate_for(self, *, slices: int, hosts_per_slice: int,
                     devices_per_host: int) -> MeshShape:
        """Check the mesh and batch against a topology; return the resolved mesh shape."""
        shape = self.mesh.resolve(slices=slices,
                                  devices_per_slice=hosts_per_slice * devices_per_host)
        processes = slices * hosts_per_slice
        if self.train.global_batch % shape.batch_parallel:
            raise ConfigError("train.global_batch", f"{self.train.global_batch} does not divide by "
                              f"the data-parallel size {shape.batch_parallel} (mesh data×fsdp = "
                              f"{shape.shape[0]}×{shape.shape[1]})",
                              f"use a multiple of {shape.batch_parallel}")
        if self.train.global_batch % processes:
            raise ConfigError("train.global_batch", f"{self.train.global_batch} does not divide by "
                              f"the host count {processes}", f"use a multiple of {processes}")
        if self.task.kind == "lm" and self.model.num_heads % shape.ici_tensor:
            raise ConfigError("mesh.ici.tensor", f"model.num_heads={self.model.num_heads} does not "
                              f"divide by the tensor axis {shape.ici_tensor}",
                              "pick a tensor axis that divides num_heads")
        return shape

    def as_dict(self) -> dict:
        return configtools.to_dict(self)

    def digest(self) -> str:
        """Identifies the run's settings; the terminal's (``logs``) are not the run's."""
        data = {k: v for k, v in self.as_dict().items() if k != "logs"}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_config(path: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """YAML file (optional) + dotted overrides -> validated RunConfig."""
    data = configtools.load_yaml(path) if path else {}
    data = configtools.apply_overrides(data, list(overrides or []))
    cfg = configtools.build(RunConfig, data)
    if cfg.cluster.mode != "tpu":
        em = cfg.cluster.emulate
        cfg.validate_for(slices=em.slices, hosts_per_slice=em.hosts_per_slice,
                         devices_per_host=em.devices_per_host)
    return cfg
