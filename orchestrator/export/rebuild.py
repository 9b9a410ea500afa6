"""Build an exported model again from the export alone: ``rebuild(EXPORT_DIR)``.

The export's ``config.yaml`` names the task (``task.kind``) and its settings as the run ran
them, with the ``train`` section and ``run.seed``/``run.total_steps`` its factory was called
with. ``rebuild`` resolves that task as a host does (``workers/task/resolve.py``: the factory's
module must be importable here, and a task that opens its data at build time needs the data),
traces its ``init`` (``jax.eval_shape``: nothing computed) and checks the exported parameters
against it, name by name, shape and dtype, before handing them back: a rebuild that would not
fit the weights is an ``ExportError`` naming the first arrays that differ.

JAX and the task's code are imported inside the function (``orchestrator/`` never imports JAX
at module level).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.export.select import ExportError

CONFIG = "config.yaml"
NPZ = "model.npz"


def rebuild(export_dir: str | Path) -> tuple[Any, dict]:
    """(the ``ResolvedTask`` the export's config builds, its parameters as the nested dict of
    numpy arrays the task's ``init`` returns, unboxed): ``task.task.loss(params, batch)`` or an
    ``NnxModel``'s ``apply(params, ...)`` take them as they are."""
    import jax
    import numpy as np
    from flax import linen as nn

    from orchestrator.config import load_config
    from orchestrator.shared import configtools
    from orchestrator.shared.errors import OrchestratorError
    from orchestrator.shared.task import task_ref
    from workers.ram.replica import leaf_name
    from workers.task.contract import TaskContext
    from workers.task.resolve import resolve

    export_dir = Path(export_dir)
    path = export_dir / CONFIG
    try:
        named = "task" in (configtools.load_yaml(str(path)) or {})
        cfg = load_config(str(path))
    except (OrchestratorError, OSError) as exc:
        raise ExportError(f"{path} does not build a task: {exc}",
                          fix="rebuild from an export made by this version (its config.yaml "
                              "names task.kind and task.settings)") from None
    if not named:
        raise ExportError(f"{path} names no task (the run had no readable config.yaml and the "
                          "step no run metadata)",
                          fix="write the run's task.kind and task.settings into it")
    resolved = resolve(task_ref(cfg), TaskContext(train=cfg.train, total_steps=cfg.run.total_steps,
                                                  seed=cfg.run.seed))
    abstract = nn.meta.unbox(jax.eval_shape(resolved.task.init, jax.random.key(cfg.run.seed)))
    want = {leaf_name(("params", *path)): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)}
    with np.load(export_dir / NPZ) as npz:
        got = {k: npz[k] for k in npz.files if k.startswith("params/")}
    _check_fits(want, got, export_dir)
    leaves = [got[leaf_name(("params", *path))]
              for path, _ in jax.tree_util.tree_leaves_with_path(abstract)]
    return resolved, jax.tree.unflatten(jax.tree.structure(abstract), leaves)


def _check_fits(want: dict[str, Any], got: dict[str, Any], export_dir: Path) -> None:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = [f"{k}: exported {got[k].shape} {got[k].dtype}, built {want[k].shape} "
              f"{want[k].dtype}" for k in sorted(set(want) & set(got))
              if (tuple(got[k].shape), got[k].dtype) != (tuple(want[k].shape), want[k].dtype)]
    if missing or extra or differ:
        parts = ([f"not exported: {', '.join(missing[:3])}"] if missing else []) + \
                ([f"not built: {', '.join(extra[:3])}"] if extra else []) + differ[:3]
        raise ExportError(f"The model {export_dir / CONFIG} builds does not fit the exported "
                          f"weights: {'; '.join(parts)}.",
                          fix="rebuild with the task code the run trained with (the export's "
                              "export.json names its checkpoint_meta), and the settings in "
                              "config.yaml unchanged")
