"""What one host needs to train its share of the run: a small, picklable spec.

The driver builds one ``HostSpec`` per host and ships it to that host's actor, instead of the
whole ``RunConfig`` (events, metrics, controller and cluster settings mean nothing to a host).
Pure data: no Ray, no JAX, so the driver and tests build it freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.shared.errors import ConfigError
from orchestrator.shared.host_env import key_path
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import MeshPlan
from orchestrator.shared.sections import CheckpointConfig, EvalConfig, TrainConfig
from orchestrator.shared.task import TaskRef, task_ref


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """What one host needs to train its share, instead of the whole RunConfig."""

    host: HostRef
    plan: MeshPlan
    task: TaskRef
    """The task (``module:function`` and its settings as plain data); the host resolves it
    (``workers.task.resolve``)."""
    train: TrainConfig
    checkpoint: CheckpointConfig
    checkpoint_dir: str
    seed: int
    total_steps: int
    accum_steps: int = 1
    init_timeout_s: float
    heartbeat_s: float
    config_digest: str
    """Digest of the driver's RunConfig, written into every checkpoint's run metadata."""
    executables_dir: str | None = None
    """RUN_DIR/executables: compiled steps stored and loaded there; None compiles every time."""
    executables_key: str | None = None
    """Path of the key that signs the store's files (``orchestrator.shared.host_env.key_path``;
    never the key itself). None: the host's ``$TPU_ORCH_EXECUTABLES_KEY`` or per-user default."""
    share_compile: bool = True
    """One process of the group compiles, the others load its executable (``compile.share``;
    the CPU emulation only, ``workers.training.compile_share``)."""
    share_wait_s: float = 90.0
    """How long a process waits for the owner of a shared compile before compiling itself: half
    the smaller of the restore and compile bounds (the init is compiled inside RESTORING), so
    its own compile still fits in the phase."""
    survive_peers: bool = False
    """Start the JAX runtime with ``jax_enable_recoverability``: a peer's death fails this
    process's collectives instead of aborting it, so it can be re-initialised in process
    (``controller.warm.reuse_processes``)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """``eval.*``: evaluate after every ``every``-th step (0: never) on ``batches`` held-out
    batches (``Task.eval_data``); every host evaluates at the same steps (a collective)."""

    def __post_init__(self) -> None:
        if self.accum_steps < 1:
            raise ConfigError("train.global_batch", f"accum_steps must be >= 1, got "
                              f"{self.accum_steps}", "pass accum_steps=1 or more")
        if self.train.global_batch % self.accum_steps:
            raise ConfigError("train.global_batch", f"{self.train.global_batch} does not divide "
                              f"by accum_steps={self.accum_steps}",
                              f"use a global batch that is a multiple of {self.accum_steps}")
        if self.host not in self.plan.hosts:
            raise ValueError(f"host {self.host.index} ({self.host.instance}) is not in the mesh "
                             "plan; build the spec from one of plan.hosts")
        if not self.checkpoint_dir:
            raise ValueError("checkpoint_dir is empty; pass RUN_DIR/checkpoints")

    @property
    def process_id(self) -> int:
        """This host's JAX process id (its position in the plan)."""
        return self.host.index

    @classmethod
    def for_host(cls, cfg: Any, plan: MeshPlan, host: HostRef, *, checkpoint_dir: str,
                 accum_steps: int = 1, executables_dir: str | None = None,
                 executables_key: str | None = None, survive_peers: bool = False) -> HostSpec:
        """The spec for ``host`` (one of ``plan.hosts``) from the driver's config (``cfg``, a
        ``RunConfig``; duck-typed so that this module never imports the config tree).

        ``executables_dir`` is dropped when ``compile.cache`` is off; with it goes the path of
        the key that signs it (``executables_key``, default the driver's
        ``$TPU_ORCH_EXECUTABLES_KEY`` or per-user key, so hosts verify with the driver's key
        where they share its filesystem or Secret mount). ``survive_peers``: only
        for groups whose processes are released in order or killed (the driver's, with
        ``controller.warm`` reuse on): processes that exit on their own with it on can abort
        at exit when process 0's service went first."""
        use_store = executables_dir and cfg.compile.cache == "on"
        return cls(host=host, plan=plan, task=task_ref(cfg), train=cfg.train,
                   checkpoint=cfg.checkpoint, checkpoint_dir=str(checkpoint_dir),
                   seed=cfg.run.seed, total_steps=cfg.run.total_steps, accum_steps=accum_steps,
                   init_timeout_s=cfg.timeouts.init_s, heartbeat_s=cfg.timeouts.heartbeat_s,
                   config_digest=cfg.digest(),
                   executables_dir=str(executables_dir) if use_store else None,
                   executables_key=(executables_key or key_path()) if use_store else None,
                   share_compile=cfg.compile.share,
                   share_wait_s=0.5 * min(cfg.timeouts.compile_s, cfg.timeouts.restore_s),
                   survive_peers=survive_peers, eval=cfg.eval)
