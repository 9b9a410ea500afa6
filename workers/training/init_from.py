"""A new run's parameters from existing weights (``Task.init_from``), placed straight into the
sharded state.

Each parameter is built with ``jax.make_array_from_callback`` over its sharding: the callback is
asked only for the slices this process's devices hold, and reads each one from the source (the
``llama`` task's: by offset from memory-mapped safetensors), so a host reads its own shards,
never the whole model. A slice several local devices share (a replicated axis) is read once.

Memory (what ``workers/training/memory.py: init_from_bytes`` counts): the mapped files cost page
cache only; per parameter, the host holds its devices' slices in the parameter's dtype until they
are placed, plus one slice in the file's dtype while it is cast. On the devices the seeded leaf is
deleted as soon as its replacement is placed: one parameter's shard more at most, at a time
when the step's gradients (as large as all parameters) are not allocated.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from workers.task.contract import ParamSource


def load_params(source: ParamSource, params: Any) -> Any:
    """``params`` (the seeded init's sharded arrays) with every leaf replaced by ``source``'s,
    in the leaf's dtype and sharding; the seeded leaves are deleted."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for path, seeded in flat:
        out.append(_leaf(source, tuple(str(getattr(k, "key", k)) for k in path), seeded))
        seeded.delete()
    return jax.tree_util.tree_unflatten(treedef, out)


def _leaf(source: ParamSource, path: tuple[str, ...], like: jax.Array) -> jax.Array:
    dtype = np.dtype(like.dtype)
    want = like.sharding.shard_shape(like.shape)
    read: dict[tuple, np.ndarray] = {}

    def slice_of(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in read:
            part = np.asarray(source.read(path, index)).astype(dtype, copy=False)
            if part.shape != want:
                raise ValueError(f"init_from gave {'/'.join(path)}{list(index)} of shape "
                                 f"{part.shape}, not the shard's {want}")
            read[key] = part
        return read[key]

    return jax.make_array_from_callback(like.shape, like.sharding, slice_of)
