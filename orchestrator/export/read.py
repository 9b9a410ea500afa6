"""One step's arrays as host numpy, on this machine alone: no cluster, no mesh, CPU.

JAX, Orbax and the model code are imported inside the functions (``orchestrator/`` never imports
JAX at module level). Orbax steps are restored leaf by leaf as ``np.ndarray``
(``RestoreArgs(restore_type=np.ndarray)``), so the mesh and devices they were saved from need
not exist; without ``--with-opt-state`` only the ``params`` subtree is read (Orbax's partial
restore). RAM-tier steps are authenticated with the run's secret (``RUN_DIR/ram_secret``, as
the restoring hosts do; read as the driver reads it, only from a private file of this user,
never through a link) before a byte is used, then assembled from every source's pieces
(``workers.ram.replica.assemble``) and named by the copy's own layout (``names``): no model code is
needed to read either tier.

Names: the state's key path joined by ``/`` (``workers.ram.replica.leaf_name``:
``params/block0/q/kernel``, ``opt_state/1/0/mu/embed/embedding``): the same for both tiers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.export.select import ORBAX, ExportError, Source, listing
from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.files import UnsafeFile, read_private

SECRET_FILE = "ram_secret"  # orchestrator.raygroup.ram_holders.SECRET_FILE (it imports Ray)
PARAMS = "params"
OPT_STATE = "opt_state"


def read(source: Source, run_dir: Path, *, with_opt_state: bool
         ) -> tuple[dict[str, Any], dict]:
    """(arrays by name, the step's own run metadata: ``{}`` for a RAM-tier step)."""
    if source.tier == ORBAX:
        return _read_orbax(source, with_opt_state=with_opt_state)
    return _read_copy(source, run_dir, with_opt_state=with_opt_state), {}


def _wanted(name: str, with_opt_state: bool) -> bool:
    top = name.split("/", 1)[0]
    return top == PARAMS or (with_opt_state and top == OPT_STATE)


def _read_orbax(source: Source, *, with_opt_state: bool) -> tuple[dict[str, Any], dict]:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from workers.ram.replica import leaf_name

    try:
        meta = ckpt_layout.read_run_meta(source.path)
    except ValueError as exc:
        raise _unreadable(source, str(exc)) from None
    item = source.path / "state"
    try:
        tree = ocp.PyTreeCheckpointHandler().metadata(item).tree
        keep = [PARAMS, OPT_STATE] if with_opt_state else [PARAMS]
        missing = [k for k in keep if k not in tree]
        if missing:
            raise ValueError(f"the saved state has no {missing} (it has {sorted(tree)})")
        want = {k: tree[k] for k in keep}
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), want)
        out = ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).restore(
            item, args=ocp.args.PyTreeRestore(item=want, restore_args=restore_args,
                                              partial_restore=True))
    except ExportError:
        raise
    except Exception as exc:
        raise _unreadable(source, f"{type(exc).__name__}: {str(exc)[:400]}") from None
    arrays = {leaf_name(p): np.asarray(v)
              for p, v in jax.tree_util.tree_leaves_with_path({k: out[k] for k in keep})}
    return dict(sorted(arrays.items())), meta


def _read_copy(source: Source, run_dir: Path, *, with_opt_state: bool) -> dict[str, Any]:
    token = _run_secret(source, run_dir)
    import numpy as np

    from workers.ram import auth as ram_auth
    from workers.ram import copy_store, replica

    try:
        key = ram_auth.Keys.from_token(token).copy
        root = source.path.parent
        copies = []
        for i in range(copy_store.sources_of(root, source.step)):
            got = copy_store.read(root, step=source.step, source=i)
            ram_auth.verify_copy(key, got, step=source.step, name=f"source {i}")
            copies.append(got)
        if len({c["source"] for c in copies}) != len(copies):
            raise ValueError("the copies repeat a source")
    except ram_auth.CopyRejected as exc:
        raise ExportError(
            f"RAM-tier step {source.step} ({source.path}) is refused: {exc}.",
            fix=f"export another step with --step N (a copy changed on disk is never used), or "
                f"check that {run_dir / SECRET_FILE} is this run's") from None
    except Exception as exc:
        raise _unreadable(source, f"{type(exc).__name__}: {str(exc)[:400]}") from None
    layout = copies[0]["layout"]
    names = layout.get("names")
    if not isinstance(names, list) or len(names) != len(layout["leaves"]):
        raise ExportError(
            f"RAM-tier step {source.step} ({source.path}) was written before copies named "
            "their arrays, so its arrays cannot be named.",
            fix=f"export an Orbax step with --step N (complete steps: {listing(run_dir)})")
    keep = [i for i, name in enumerate(names) if _wanted(name, with_opt_state)]
    leaves = [(tuple(shape), np.dtype(dtype)) for shape, dtype in layout["leaves"]]
    try:
        full = replica.assemble([(c["layout"], c["data"]) for c in copies], leaves, only=keep)
    except replica.ReplicaMismatch as exc:
        raise _unreadable(source, str(exc)) from None
    return dict(sorted((names[i], full[i]) for i in keep))


def _run_secret(source: Source, run_dir: Path) -> str:
    """The run's RAM-tier secret, read as the driver reads it (``read_private``: never through
    a link, only from a private file of this user): a secret others chose or can read would
    pass copies forged with it as the run's (issue 49)."""
    secret = run_dir / SECRET_FILE
    try:
        data = read_private(secret, fix="")
    except UnsafeFile as exc:
        raise ExportError(
            f"RAM-tier step {source.step} ({source.path}) is authenticated with the run's "
            f"secret, but {exc.message}.",
            fix=f"export an Orbax step with --step N (complete steps: {listing(run_dir)}); or, "
                f"if {secret} is the run's own secret, run the export as the run's user with it "
                f"a private file (a regular file with one name, not a link: `chmod 600 "
                f"{secret}`)") from None
    except OSError as exc:
        raise _no_secret(source, secret, type(exc).__name__) from None
    token = (data or b"").decode("utf-8", "replace").strip()
    if not token:
        raise _no_secret(source, secret, "missing" if data is None else "empty")
    return token


def _no_secret(source: Source, secret: Path, why: str) -> ExportError:
    return ExportError(
        f"RAM-tier step {source.step} ({source.path}) is authenticated with the run's secret "
        f"{secret}, which cannot be read ({why}).",
        fix=f"restore {SECRET_FILE} into the run directory (the driver writes it there when "
            "checkpoint.ram is on), or export an Orbax step with --step N")


def _unreadable(source: Source, reason: str) -> ExportError:
    run_dir = source.path.parent.parent  # <run>/checkpoints[-from-ram]/<step>
    return ExportError(
        f"{source.tier} step {source.step} at {source.path} cannot be read: {reason}.",
        fix=f"export another complete step with --step N (complete steps: {listing(run_dir)}), "
            "and check the storage the run directory is on")
