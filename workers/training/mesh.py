"""The JAX mesh of a mesh plan: axes (data, fsdp, tensor), each DCN × ICI.

Part of the step's definition (``executables.CODE_MODULES``): how devices are laid out decides
what a compiled step lowers to.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from orchestrator.shared.plan import MeshPlan

AXES = ("data", "fsdp", "tensor")


def build_mesh(plan: MeshPlan, devices: list | None = None) -> Mesh:
    """Mesh (data, fsdp, tensor) over ``devices`` (default all): axes are DCN × ICI."""
    s = plan.shape
    ici = (s.ici_data, s.ici_fsdp, s.ici_tensor)
    devices = jax.devices() if devices is None else devices
    if plan.platform == "tpu":
        from jax.experimental import mesh_utils

        if plan.num_slices > 1:
            arr = mesh_utils.create_hybrid_device_mesh(ici, (s.dcn_data, s.dcn_fsdp, 1), devices)
        else:
            arr = mesh_utils.create_device_mesh(ici, devices)
        return Mesh(arr, AXES)
    # CPU emulation: a process's devices belong to its host's slice; processes are ordered by
    # slice, so slice k owns processes [k·hosts_per_slice, (k+1)·hosts_per_slice).
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    arr = np.array(ordered, dtype=object).reshape(s.dcn_data, s.dcn_fsdp, *ici)
    arr = arr.transpose(0, 2, 1, 3, 4).reshape(s.shape)
    return Mesh(arr, AXES)
