"""The ``task`` section: which training runs (docs/tasks.md), as plain data (no JAX).

``task.kind`` names a built-in task (``lm``: the decoder LM of ``workers/task/lm.py``) or a
user's factory as ``module:function`` (importable from the job's working directory or
``PYTHONPATH``); the section's other keys (``task.hidden=128``; or under ``task.settings``,
the form the resolved config is written in) are that task's own settings, checked against the
settings dataclass the factory declares where the factory is imported (the driver's task check
in a subprocess, and every host). The built-in ``lm`` task takes its settings from the
``model`` section (``ModelConfig``), as before tasks existed; ``task.*`` may give them instead.

A host gets a ``TaskRef`` (``HostSpec.task``): the factory's import path and the settings as a
plain mapping. A checkpoint fits a run only when their ``task_fingerprint`` agree.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError

METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""An eval split or metric name (a TensorBoard tag part): lower-case letters, digits and _.
The driver's records check what the hosts report; the task check checks a task's eval."""

BUILTIN_TASKS: dict[str, str] = {"lm": "workers.task.lm:make_task",
                                 "llama": "workers.task.llama:make_task"}
"""Built-in task kinds and the factory each names (resolved like a user's)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The built-in ``lm`` task's settings: a decoder-only transformer LM. The default is tiny
    on purpose (CPU tests)."""

    vocab_size: int = 128
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 256
    seq_len: int = 32
    dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}", f"must be > 0, got {getattr(self, name)}",
                                  f"set `model.{name}` to a positive value")
        if self.d_model % self.num_heads:
            raise ConfigError("model.num_heads", f"d_model={self.d_model} does not divide by "
                              f"num_heads={self.num_heads}",
                              "pick num_heads that divides model.d_model")

    def fingerprint(self) -> str:
        """Hash of what decides parameter shapes: a checkpoint fits only the same fingerprint
        (equal to ``task_fingerprint("lm", ...)`` of these settings)."""
        return task_fingerprint("lm", configtools.to_dict(self))


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """What trains: ``kind`` is ``lm`` (built in) or ``package.module:function``, a factory
    ``make_task(settings, ctx) -> workers.task.Task``; ``settings`` its settings."""

    kind: str = "lm"
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Any, *, prefix: str = "task") -> TaskConfig:
        """``{kind, <setting>: value, ...}``; a ``settings`` mapping holds settings too (the
        resolved config's form). A setting given both ways is refused."""
        data = dict(data)
        kind = data.pop("kind", "lm")
        nested = data.pop("settings", {})
        if not isinstance(nested, dict):
            raise ConfigError(f"{prefix}.settings", f"{nested!r} is not a mapping",
                              f"write the task's settings as {prefix}.<name>=value")
        if twice := sorted(set(nested) & set(data)):
            raise ConfigError(f"{prefix}.{twice[0]}", "given both inline and under "
                              f"{prefix}.settings", "give each task setting once")
        if not isinstance(kind, str):  # YAML read `a.b:` or `a: b` as a mapping
            raise ConfigError(f"{prefix}.kind", f"{kind!r} is not a task name",
                              "write the factory as 'package.module:function' (quoted in "
                              "YAML), or a built-in task: " + ", ".join(sorted(BUILTIN_TASKS)))
        return cls(kind=kind, settings={**nested, **data})

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ConfigError("task.kind", f"{self.kind!r} is not a task",
                              f"set task.kind to one of {sorted(BUILTIN_TASKS)} or to "
                              "'package.module:function' (your task factory)")
        if self.kind not in BUILTIN_TASKS:
            check_target(self.kind)
        if not isinstance(self.settings, dict):
            raise ConfigError("task", f"settings {self.settings!r} are not a mapping",
                              "write the task's settings as task.<name>=value (the fields of "
                              "the settings dataclass its factory declares)")

    @property
    def target(self) -> str:
        """The factory's ``module:function``."""
        return BUILTIN_TASKS.get(self.kind, self.kind)


def check_target(kind: str) -> tuple[str, str]:
    """``module:function`` split, or a ConfigError naming what a kind must look like."""
    module, sep, func = kind.partition(":")
    parts = module.split(".")
    ok = (sep and all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)
          and func.isidentifier() and not keyword.iskeyword(func))
    if not ok:
        raise ConfigError("task.kind", f"{kind!r} is neither a built-in task "
                          f"({', '.join(sorted(BUILTIN_TASKS))}) nor 'module:function'",
                          "write the factory as 'package.module:function' (e.g. "
                          "'my_pkg.my_task:make_task'), importable from the job's working "
                          "directory or PYTHONPATH")
    return module, func


@dataclass(frozen=True, kw_only=True)
class TaskRef:
    """What a host is told of the task: the factory's ``module:function``, the kind as
    configured, and the settings as plain data (the host builds the settings dataclass)."""

    kind: str
    target: str
    settings: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "settings": self.settings}


def task_ref(cfg: Any) -> TaskRef:
    """The run's task for the hosts (``cfg`` a ``RunConfig``): the ``lm`` task's settings are
    the ``model`` section."""
    t = cfg.task
    settings = configtools.to_dict(cfg.model) if t.kind == "lm" else dict(t.settings)
    return TaskRef(kind=t.kind, target=t.target, settings=settings)


def task_fingerprint(kind: str, settings: dict[str, Any]) -> str:
    """Which checkpoints fit: the task's kind and its settings (every field, defaults filled
    in). The ``lm`` task's is the hash of its settings alone, as ``model_fingerprint`` was
    before tasks existed, so checkpoints written then still restore."""
    body: Any = settings if kind == "lm" else {"kind": kind, "settings": settings}
    blob = json.dumps(body, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def reconcile(task: TaskConfig, model: ModelConfig) -> ModelConfig:
    """The ``model`` section a run uses (RunConfig calls this): for ``lm``, ``task.settings``
    (when given) build it, and must agree with a ``model`` section also given; for any other
    kind ``model`` must be left at its defaults (it configures ``lm`` only)."""
    if task.kind != "lm":
        if model != ModelConfig():
            raise ConfigError("model", f"model.* configures the built-in lm task, but task.kind "
                              f"is {task.kind!r}",
                              "remove the model.* settings, or give your task's settings as "
                              "task.<name>")
        return model
    if not task.settings:
        return model
    built = configtools.build(ModelConfig, task.settings, prefix="task")
    if model not in (ModelConfig(), built):
        raise ConfigError("task", "the lm task's settings are given twice (task.* and model.*) "
                          "and disagree", "give them in one place: model.* (as before tasks) or "
                          "task.*")
    return built
