"""The config sections a host receives in its ``HostSpec``: plain, validated dataclasses.

``orchestrator.config`` (the driver's config tree) builds its ``RunConfig`` from these; a host
imports them from here, so that a host's process never loads the config tree (the controller's,
events' and metrics' settings and their policies mean nothing to a host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from orchestrator.shared.errors import ConfigError

__all__ = ["CheckpointConfig", "EvalConfig", "MeshShape", "RamTierConfig", "TrainConfig",
           "positive"]


def positive(setting: str, value: float, fix: str = "") -> None:
    if value <= 0:
        raise ConfigError(setting, f"must be > 0, got {value}",
                          fix or f"set `{setting}` to a positive value")


@dataclass(frozen=True, kw_only=True)
class MeshShape:
    """Resolved axis sizes. The mesh is (data, fsdp, tensor); each axis is DCN × ICI."""

    ici_data: int
    ici_fsdp: int
    ici_tensor: int
    dcn_data: int
    dcn_fsdp: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dcn_data * self.ici_data, self.dcn_fsdp * self.ici_fsdp, self.ici_tensor)

    @property
    def batch_parallel(self) -> int:
        """Ways the batch is split (data × fsdp)."""
        return self.shape[0] * self.shape[1]

    def as_dict(self) -> dict[str, int]:
        return {"data": self.shape[0], "fsdp": self.shape[1], "tensor": self.shape[2],
                "dcn_data": self.dcn_data, "dcn_fsdp": self.dcn_fsdp}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimizer and batch. AdamW with linear warmup then cosine decay, global-norm clipping."""

    global_batch: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    decay_steps: int = 0
    """0: decay over run.total_steps."""
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.98

    def __post_init__(self) -> None:
        positive("train.global_batch", self.global_batch)
        positive("train.learning_rate", self.learning_rate)
        positive("train.grad_clip", self.grad_clip)
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ConfigError("train.warmup_steps", "steps must be >= 0", "use 0 or more")
        if not 0 <= self.end_lr_ratio <= 1:
            raise ConfigError("train.end_lr_ratio", "must be within [0, 1]", "e.g. 0.1")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Periodic eval of the task on its held-out split (``Task.eval_data``, docs/tasks.md):
    after every ``every``-th step, at that step boundary on the training mesh, ``batches``
    batches of ``train.global_batch`` held-out rows; loss and perplexity go to the metric sinks
    and ``summary.json``. Off by default: an eval costs its forward passes and a compile per
    group, and a task without a held-out split has nothing to evaluate."""

    every: int = 0
    """Steps between evals (at steps ``every``, ``2·every``, ...); 0: no eval."""
    batches: int = 4
    """Held-out batches per eval, each of ``train.global_batch`` rows (the same rows every
    eval, so evals compare); the held-out split must hold ``batches × global_batch`` rows."""

    def __post_init__(self) -> None:
        for name, low in (("every", 0), ("batches", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"eval.{name}", f"{value!r} is not a whole number >= {low}",
                                  "set eval.every to the steps between evals (0: off) and "
                                  "eval.batches to 1 or more")


@dataclass(frozen=True, kw_only=True)
class RamTierConfig:
    """The host-RAM tier: every ``every`` steps each host's shards are copied to a holder on its
    own node and on a peer host in another slice (policies/ram_tier.py), so a host lost without
    notice costs at most about ``every`` steps instead of up to a checkpoint interval."""

    enabled: Literal["auto"] | bool = "auto"
    """``auto`` (the default): on when the mesh has a peer host to hold a copy and the copies
    fit ``max_host_bytes`` (and the host's RAM), worked out from the state's shapes before the
    start; the driver prints and records the choice and its reason. ``false`` opts out."""
    every: Literal["auto"] | int = "auto"
    """Steps between copies. ``auto``: chosen by ``policies.ram_interval`` from the measured
    copy cost and step time (and the failure rate, configured or observed) so that the copies
    cost at most ``max_overhead`` of step time; revised as the run goes (logged, in
    ``summary.json``). A number fixes it."""
    max_overhead: float = 0.02
    """``every: auto``: the share of step time the copies may cost (0.02 = 2 %)."""
    failures_per_hour: float | None = None
    """``every: auto``: the expected unannounced failures per hour of the whole job (kill,
    crash, host loss), if known; None: only the failures this run observed count."""
    keep: int = 2
    """Copies kept per sending host and holder; 2 keeps a complete set while the next arrives."""
    holders: Literal["auto", "both", "peer"] = "auto"
    """Where each host's copies are kept. ``both``: its own node's holder (a restore after the
    process dies reads its own node) and a peer's (survives the node); ``peer``: the peer's
    only (half the RAM and one stream per copy; every restore reads over the network, and a
    notice that takes the peer's slice too hands over through Orbax). ``auto`` (the default):
    ``both`` where they fit the host's RAM, else ``peer``; the ``protection`` line says which."""
    durable_from_ram: bool = True
    """Periodic durable saves are written from the RAM copy by the holder on each node (Orbax,
    idle scheduling class, ``RUN_DIR/checkpoints-from-ram``), not from the devices by the training
    process; drain and final saves stay Orbax saves of the global arrays."""
    max_host_bytes: Literal["auto"] | int = "auto"
    """The most RAM a node's holder may keep (``keep`` copies of its own host's share and of
    one peer's). ``auto`` (the default): what the host's RAM holds beside the train state, from
    the memory check's bound for a host (this machine's RAM shared by its emulated hosts, or
    ``cluster.host_memory_gib``), else from the host's own RAM when it starts copying; the
    driver prints the figures. A number fixes it. A host whose copies would exceed it stops
    copying (and says so); its restores then come from the durable tier."""

    def __post_init__(self) -> None:
        if self.enabled != "auto" and not isinstance(self.enabled, bool):
            raise ConfigError("checkpoint.ram.enabled",
                              f"{self.enabled!r} is not auto, true or false",
                              "set checkpoint.ram.enabled=auto, true or false")
        if not isinstance(self.durable_from_ram, bool):
            raise ConfigError("checkpoint.ram.durable_from_ram",
                              f"{self.durable_from_ram!r} is not a boolean",
                              "set checkpoint.ram.durable_from_ram=true or false")
        if self.every != "auto":
            if isinstance(self.every, bool) or not isinstance(self.every, int):
                raise ConfigError("checkpoint.ram.every", f"{self.every!r} is not auto or a "
                                  "whole number", "set checkpoint.ram.every=auto or a number "
                                  "of steps, e.g. 1")
            positive("checkpoint.ram.every", self.every,
                     "set checkpoint.ram.every=auto or a number of steps >= 1")
        if not 0 < self.max_overhead < 1:
            raise ConfigError("checkpoint.ram.max_overhead", f"{self.max_overhead} is not "
                              "between 0 and 1", "set a share of step time, e.g. 0.02 (2 %)")
        if self.failures_per_hour is not None and not self.failures_per_hour > 0:
            raise ConfigError("checkpoint.ram.failures_per_hour",
                              f"{self.failures_per_hour} is not > 0",
                              "set the expected failures per hour, e.g. 0.5, or leave it unset "
                              "to use the failures the run observes")
        if self.keep < 2:
            raise ConfigError("checkpoint.ram.keep", f"{self.keep} < 2: a holder would drop its "
                              "only complete copy when the next step's starts arriving",
                              "set checkpoint.ram.keep=2 or more")
        if self.max_host_bytes != "auto":
            if isinstance(self.max_host_bytes, bool) or not isinstance(self.max_host_bytes, int):
                raise ConfigError("checkpoint.ram.max_host_bytes",
                                  f"{self.max_host_bytes!r} is not auto or a number of bytes",
                                  "set checkpoint.ram.max_host_bytes=auto (from the host's RAM) "
                                  "or a number of bytes, e.g. 8589934592")
            positive("checkpoint.ram.max_host_bytes", self.max_host_bytes)

    @property
    def cap_bytes(self) -> int | None:
        """``max_host_bytes`` as a number, None for ``auto`` not yet decided (a host then
        decides from its own RAM: ``workers.ram.budget``)."""
        return None if self.max_host_bytes == "auto" else int(self.max_host_bytes)

    @property
    def holder_sources(self) -> int:
        """Hosts whose copies one node's holder keeps at most: its own and a peer's under
        ``both`` (and ``auto`` not yet decided), a peer's only under ``peer``."""
        return 1 if self.holders == "peer" else 2

    @property
    def first_every(self) -> int:
        """The interval the copies start with: the fixed one, or 1 under ``auto`` until the
        driver has measured a copy and a step."""
        return 1 if self.every == "auto" else int(self.every)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Orbax checkpointing into RUN_DIR/checkpoints. How often: controller.checkpoint_interval."""

    keep: int = 3
    async_save: bool = True
    ram: RamTierConfig = field(default_factory=RamTierConfig)

    def __post_init__(self) -> None:
        positive("checkpoint.keep", self.keep)
