"""From a ``TaskRef`` (plain data: ``module:function`` and settings) to a ``Task``: import the
factory's module, build its settings dataclass from the settings (unknown keys and bad values
refused, naming the setting), call the factory, check what it returned. The driver's task check
and every host resolve through here, so both refuse the same input with the same message.

Also the task's code digest for the executable key: the source of the factory's package (the
directory holding its module, or the module alone when it is top level) and of the modules the
task lists in ``Task.code``, read when the task is first resolved in this process.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.task import TaskRef, check_target, task_fingerprint
from workers.task.contract import Task, TaskContext

MAX_CODE_FILES = 2000
"""A task package bigger than this is digested up to here (sorted paths): a bound, not a rule."""
IMPORT_FIX = ("make the module importable where the run starts: submit with `ray job submit "
              "--working-dir DIR` (DIR holding the package), or put its directory on PYTHONPATH "
              "for the driver and every host")


@dataclass(frozen=True)
class ResolvedTask:
    task: Task
    settings: Any
    """The factory's settings dataclass, built from the config."""
    ref: TaskRef
    settings_dict: dict
    """``settings`` as plain data, defaults filled in (fingerprint, executable key, meta)."""
    fingerprint: str
    code_digest: str

    def describe(self) -> dict:
        return {"kind": self.ref.kind, "settings": self.settings_dict}

    @functools.cached_property
    def abstract_boxed(self) -> Any:
        """The train state's shapes, dtypes and axis metadata, uncomputed (tracing the init
        once per process: a process joining several groups, or a standby told the task,
        ``HostActor.warm``, does it once). Needs no mesh or backend."""
        import jax

        from workers.task.state import init_boxed

        return jax.eval_shape(lambda: init_boxed(self.task, jax.random.key(0)))


def resolve(ref: TaskRef, ctx: TaskContext) -> ResolvedTask:
    """The task ``ref`` names, built for ``ctx`` (cached per process: a task is resolved once
    per settings, train config and length, however many groups the process joins)."""
    return _resolve(ref.kind, ref.target, json.dumps(ref.settings, sort_keys=True), ctx)


@functools.lru_cache(maxsize=16)
def _resolve(kind: str, target: str, settings_json: str, ctx: TaskContext) -> ResolvedTask:
    module, factory = load_factory(target)
    settings_cls = settings_class(target, factory)
    settings = configtools.build(settings_cls, json.loads(settings_json), prefix="task")
    try:
        task = factory(settings, ctx)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError("task.kind", f"the task factory {target} raised "
                          f"{type(exc).__name__}: {exc}",
                          f"fix {target} (call it with your settings to reproduce)") from exc
    if not isinstance(task, Task):
        raise ConfigError("task.kind", f"the task factory {target} returned "
                          f"{type(task).__name__}, not a workers.task.Task",
                          "return Task(init=..., loss=..., optimizer=..., data=...) "
                          "(docs/tasks.md)")
    plain = configtools.to_dict(settings)
    ref = TaskRef(kind=kind, target=target, settings=plain)
    return ResolvedTask(task=task, settings=settings, ref=ref, settings_dict=plain,
                        fingerprint=task_fingerprint(kind, fingerprinted(settings, plain)),
                        code_digest=code_digest(module, task.code))


def fingerprinted(settings: Any, plain: dict) -> dict:
    """The settings that say which checkpoints fit: all but the fields declared with
    ``metadata={"fingerprint": False}`` (where a new run starts, e.g. the ``llama`` task's
    ``init_from``: changing it neither refuses nor changes a run's checkpoints)."""
    skip = {f.name for f in dataclasses.fields(settings) if not f.metadata.get("fingerprint", True)}
    return {k: v for k, v in plain.items() if k not in skip}


def load_factory(target: str) -> tuple[ModuleType, Any]:
    """Import ``module:function``; a failure names the module, the error and the fix."""
    module_name, func = check_target(target)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError("task.kind", f"the task module {module_name!r} was not found "
                              f"(searched: the working directory {os.getcwd()} and PYTHONPATH="
                              f"{os.environ.get('PYTHONPATH', '')!r})", IMPORT_FIX) from exc
        raise ConfigError("task.kind", f"importing the task module {module_name!r} failed: "
                          f"it imports {missing!r}, which is not installed ({exc})",
                          f"install {missing!r} where the run starts and on every host (the "
                          "job's runtime_env pip/uv packages, or the image)") from exc
    except Exception as exc:
        raise ConfigError("task.kind", f"importing the task module {module_name!r} failed: "
                          f"{type(exc).__name__}: {exc}",
                          f"fix the module (`python -c 'import {module_name}'` shows the "
                          "error)") from exc
    factory = getattr(module, func, None)
    if not callable(factory):
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and
                       getattr(v, "__module__", None) == module_name)
        raise ConfigError("task.kind", f"{module_name} has no function {func!r}",
                          f"name one of its functions: {', '.join(found) or '(none defined)'}")
    return module, factory


def settings_class(target: str, factory: Any) -> type:
    """The dataclass the factory's first parameter is annotated with."""
    fix = ("declare it as `def make_task(settings: MySettings, ctx: TaskContext) -> Task` "
           "with MySettings a @dataclass(frozen=True, kw_only=True)")
    try:
        params = list(inspect.signature(factory).parameters.values())
        hints = typing.get_type_hints(factory)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigError("task.kind", f"the task factory {target}'s signature cannot be read "
                          f"({exc})", fix) from exc
    if len(params) != 2:
        raise ConfigError("task.kind", f"the task factory {target} takes {len(params)} "
                          "parameter(s), not (settings, ctx)", fix)
    cls = hints.get(params[0].name)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError("task.kind", f"the task factory {target}'s first parameter is not "
                          f"annotated with a dataclass (got {cls!r})", fix)
    return cls


# ---- the task's code, for the executable key ------------------------------------------------

def code_digest(module: ModuleType, extra: tuple[str, ...] = ()) -> str:
    """Digest of the source that defines the task (see the module docstring). Paths enter it
    relative to their module, so hosts holding the job's files in different places agree."""
    files: dict[str, Path] = {}
    for m in (module, *(_import_listed(name) for name in extra)):
        files.update(_source_files(m))
    h = hashlib.sha256()
    for name in sorted(files)[:MAX_CODE_FILES]:
        h.update(name.encode())
        h.update(files[name].read_bytes())
    return h.hexdigest()[:16]


def _import_listed(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise ConfigError("task.kind", f"the task lists {name!r} in Task.code, which does not "
                          f"import ({type(exc).__name__}: {exc})",
                          "list importable module names in Task.code") from exc


def _source_files(module: ModuleType) -> dict[str, Path]:
    """``{module-relative name: path}``: a top-level module itself, else every ``.py`` file
    under the directory holding it (its package)."""
    origin = getattr(module, "__file__", None)
    if not origin:
        return {}
    path = Path(origin).resolve()
    if not module.__package__:
        return {f"{module.__name__}:": path}
    root = path.parent
    return {f"{module.__package__}:{p.relative_to(root)}": p for p in root.rglob("*.py")
            if not any(part.startswith(".") or part == "__pycache__"
                       for part in p.relative_to(root).parts)}
