"""Will a train state fit? Bytes per device and per host, from abstract shapes only.

``estimate`` takes the state as ``jax.eval_shape`` gives it (parameters boxed with logical axis
names, ``abstract_train_state``), maps the names to mesh axes with the model's rules and works
out each array's per-device shard shape arithmetically (``shard_shape``: no devices, no mesh
object, nothing allocated), so a 8B model on 64 hosts is checked on a laptop in a second.

Per device: ``params``, ``opt_state`` (AdamW: two moments), ``grads`` (the step's gradients, as
sharded as the parameters; a second buffer with gradient accumulation) and ``other`` (step
counter, RNG key). Activations are not counted: they depend on batch, sequence and remat; leave
headroom for them. Per host: the devices' sum, and the RAM tier (``policies/ram_tier.py``): each
host's copy of its shards (the state's bytes over the hosts: ``workers/ram/replica.py`` takes every
distinct shard once, spread over hosts) is kept ``keep`` times on its own node's holder and
``keep`` times on a peer's, so a node's holder keeps ``2 × keep`` copies (its host's and the
peer's; ``checkpoint.ram.holders: peer``: only the peer's, ``keep`` copies), plus the copy the
training process is sending. ``workers/ram/replicator.py`` turns the tier off on a host when
``copy × keep × hosts per holder`` exceeds ``checkpoint.ram.max_host_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from orchestrator.shared.errors import (
    DoesNotFit,  # raised here; defined where the driver catches it
)
from workers.training.model import LOGICAL_RULES

DEVICE_PARTS = ("params", "opt_state", "grads", "other")
GIB = 1024**3


def shard_shape(shape: Sequence[int], spec: PartitionSpec | None,
                axis_sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of one device's shard of an array of ``shape`` laid out by ``spec`` over a mesh
    with ``axis_sizes``: each dimension divided (rounded up, as XLA pads) by the product of the
    mesh axes its entry names; dimensions past the spec's length are whole."""
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > len(shape):
        raise ValueError(f"PartitionSpec {spec} has more entries than the array has dimensions "
                         f"{tuple(shape)}: give one entry (or None) per dimension")
    out = []
    for i, dim in enumerate(shape):
        entry = entries[i] if i < len(entries) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        ways = 1
        for name in names:
            if name not in axis_sizes:
                raise ValueError(f"PartitionSpec {spec} names mesh axis {name!r}, not one of "
                                 f"{sorted(axis_sizes)}: pass every mesh axis in axis_sizes")
            ways *= axis_sizes[name]
        out.append(-(-dim // ways))
    return tuple(out)


def abstract_train_state(model: nn.Module, tx: Any, *, seq_len: int) -> Any:
    """The train state ``workers.training.trainer`` keeps (params, opt_state, step, rng), as shapes,
    dtypes and logical names: ``jax.eval_shape`` of the init, nothing computed or allocated."""
    def init(key: jax.Array) -> dict:
        params = model.init(key, jnp.zeros((1, min(seq_len - 1, 8)), jnp.int32))["params"]
        return {"params": params, "opt_state": tx.init(params),
                "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)}
    return jax.eval_shape(init, jax.random.key(0))


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def mesh_specs(boxed_state: Any, rules: Sequence[tuple[str, Any]] = LOGICAL_RULES) -> Any:
    """The mesh PartitionSpec of every array of ``boxed_state`` (logical names through
    ``rules``; an array without names is replicated)."""
    return nn.logical_to_mesh(nn.get_partition_spec(boxed_state), rules)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes a train state needs. ``device``: per device, by part (``DEVICE_PARTS``);
    ``copy_bytes``: one host's RAM-tier copy; ``ram_keep``: copies kept (0: tier off)."""

    mesh_shape: tuple[tuple[str, int], ...]
    devices_per_host: int
    device: Mapping[str, int]
    state_bytes: int
    """The whole state once (every array unsharded), e.g. a checkpoint's size."""
    copy_bytes: int
    ram_keep: int = 0
    ram_max_host_bytes: int | None = None
    ram_holders: str = "both"
    """``checkpoint.ram.holders`` decided: ``both`` (own node and a peer) or ``peer``."""
    load_bytes: int = 0
    """Host RAM a new run's ``Task.init_from`` load holds at its peak (``init_from_bytes``);
    0 without one, or when the run resumes."""

    @property
    def devices(self) -> int:
        return math.prod(size for _, size in self.mesh_shape)

    @property
    def hosts(self) -> int:
        return self.devices // self.devices_per_host

    @property
    def device_total(self) -> int:
        return sum(self.device.values())

    @property
    def holder_factor(self) -> int:
        """Hosts whose copies one node's holder keeps: its own and a peer's (``peer``: a peer's
        only; alone: its own)."""
        return 2 if self.hosts > 1 and self.ram_holders != "peer" else 1

    @property
    def ram_tier(self) -> int:
        """Host RAM for the tier on one node: ``keep`` copies of each host its holder serves,
        plus the copy in flight from the training process."""
        if not self.ram_keep:
            return 0
        return self.copy_bytes * (self.ram_keep * self.holder_factor + 1)

    @property
    def host(self) -> dict[str, int]:
        """Bytes per host, by part: device memory summed over the host's devices, then RAM."""
        out = {part: n * self.devices_per_host for part, n in self.device.items()}
        out["ram_tier"] = self.ram_tier
        return out

    def human(self) -> str:
        """One line: per device, per host, the RAM tier, the mesh."""
        parts = ", ".join(f"{p} {size_text(n)}" for p, n in self.device.items())
        mesh = " ".join(f"{a}={s}" for a, s in self.mesh_shape)
        ram = (f"RAM tier {size_text(self.ram_tier)}/host ({self.ram_keep}×{self.holder_factor}+1 "
               f"copies of {size_text(self.copy_bytes)})" if self.ram_keep else "RAM tier off")
        per_host = size_text(self.device_total * self.devices_per_host)
        load = f"; init_from load {size_text(self.load_bytes)}/host" if self.load_bytes else ""
        return (f"per device {size_text(self.device_total)} ({parts}); per host "
                f"{per_host} on {self.devices_per_host} "
                f"device(s); {ram}{load}; state {size_text(self.state_bytes)} over {self.devices} "
                f"device(s), {self.hosts} host(s), mesh {mesh}; activations not counted")


def size_text(n: int) -> str:
    """Bytes for people: GiB with two decimals from 1 GiB on, else MiB, KiB or B."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit != "KiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def smaller_model_fix(kind: str, settings: Mapping[str, Any]) -> str:
    """How to make the model of task ``kind`` (its settings as resolved) smaller, in its own
    settings: the Llama family's preset and dtype, the ``lm`` task's ``model.*`` sizes."""
    if kind == "llama":
        preset = settings.get("preset")
        down = {"8b": "1b", "1b": "tiny"}.get(str(preset))
        return (f"a smaller preset (task.preset={down or 'tiny'}) or "
                "task.model.param_dtype=bfloat16 (halves parameters, gradients and Adam "
                "moments)")
    if kind == "lm":
        return ("a smaller model (model.d_model, model.num_layers, model.d_ff, "
                "model.vocab_size)")
    return SMALLER_MODEL


def estimate(boxed_state: Any, *, mesh_shape: Mapping[str, int], devices_per_host: int,
             rules: Sequence[tuple[str, Any]] = LOGICAL_RULES, accum_steps: int = 1,
             ram_keep: int = 0, ram_max_host_bytes: int | None = None) -> MemoryEstimate:
    """Bytes per device and per host of ``boxed_state`` (``abstract_train_state``) over a mesh
    of ``mesh_shape`` (every mesh axis: e.g. ``{"data": 1, "fsdp": 64, "tensor": 1}``) with
    ``devices_per_host`` devices on each host. ``accum_steps`` > 1 adds the gradient
    accumulator; ``ram_keep``: ``checkpoint.ram.keep`` when the RAM tier is on, else 0."""
    specs = jax.tree.leaves(mesh_specs(boxed_state, rules), is_leaf=_is_spec)
    leaves = jax.tree.leaves(nn.meta.unbox(boxed_state))
    if len(specs) != len(leaves):
        raise ValueError(f"{len(leaves)} arrays but {len(specs)} partition specs: pass the "
                         "state as jax.eval_shape returns it, boxes and all")
    return estimate_state(nn.meta.unbox(boxed_state), specs, mesh_shape=mesh_shape,
                          devices_per_host=devices_per_host, accum_steps=accum_steps,
                          ram_keep=ram_keep, ram_max_host_bytes=ram_max_host_bytes)


def estimate_state(abstract: Any, specs: Any, *, mesh_shape: Mapping[str, int],
                   devices_per_host: int, accum_steps: int = 1, ram_keep: int = 0,
                   ram_max_host_bytes: int | None = None) -> MemoryEstimate:
    """``estimate`` of an unboxed abstract state ``{"params", "opt_state", ...}`` and its mesh
    ``PartitionSpec``s (a tree of the same structure, or its leaves in order), e.g. what the
    task check has (``workers.task.state.state_specs``)."""
    devices = math.prod(mesh_shape.values())
    if devices_per_host < 1 or devices % devices_per_host:
        raise ValueError(f"{devices} devices in mesh {dict(mesh_shape)} do not split into hosts "
                         f"of {devices_per_host}: pass the devices each host really has")
    specs = jax.tree.leaves(specs, is_leaf=_is_spec)
    leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
    if len(specs) != len(leaves):
        raise ValueError(f"{len(leaves)} arrays but {len(specs)} partition specs: give one "
                         "spec (or None) per array")
    device = dict.fromkeys(DEVICE_PARTS, 0)
    total = 0
    for (path, leaf), spec in zip(leaves, specs, strict=True):
        itemsize = jnp.dtype(leaf.dtype).itemsize
        per_device = math.prod(shard_shape(leaf.shape, spec, mesh_shape)) * itemsize
        top = getattr(path[0], "key", None) if path else None
        part = top if top in ("params", "opt_state") else "other"
        device[part] += per_device
        total += math.prod(leaf.shape) * itemsize
    device["grads"] = device["params"] * (2 if accum_steps > 1 else 1)
    hosts = devices // devices_per_host
    return MemoryEstimate(mesh_shape=tuple(mesh_shape.items()), devices_per_host=devices_per_host,
                          device=device, state_bytes=total, copy_bytes=-(-total // hosts),
                          ram_keep=ram_keep, ram_max_host_bytes=ram_max_host_bytes)


def init_from_bytes(params: Any, specs: Any, *, mesh_shape: Mapping[str, int],
                    devices_per_host: int, file_itemsize: int = 4) -> int:
    """Host RAM ``workers.training.init_from`` holds at its peak: for the parameter whose
    shards are largest, each of the host's devices' slice in the parameter's dtype plus one
    slice in the file's (``file_itemsize``: float32 or narrower, 4) while it is cast. The
    memory-mapped files are page cache, not counted; on the devices the load stays within the
    gradients' share, not allocated before the first step."""
    specs = jax.tree.leaves(specs, is_leaf=_is_spec)
    peak = 0
    for leaf, spec in zip(jax.tree.leaves(params), specs, strict=True):
        elems = math.prod(shard_shape(leaf.shape, spec, mesh_shape))
        itemsize = jnp.dtype(leaf.dtype).itemsize
        peak = max(peak, elems * (devices_per_host * itemsize + file_itemsize))
    return peak


SMALLER_MODEL = ("a smaller model (the task's size settings), or parameters in bfloat16 "
                 "(halves parameters, gradients and Adam moments)")
"""``check_fits``' default advice on the model's side; the task check passes the task's own
settings (``task.preset``, ``model.*``)."""


def check_fits(est: MemoryEstimate, *, device_bytes: int | None, host_bytes: int | None,
               shared: bool = False, smaller: str = SMALLER_MODEL) -> None:
    """Raise ``DoesNotFit`` naming the part that does not fit, the numbers and the fix: the
    state on a device (``device_bytes`` of accelerator memory), the RAM tier on a host
    (``host_bytes`` of RAM, and ``checkpoint.ram.max_host_bytes``). A bound of None is not
    checked. ``shared``: the devices live in the host's RAM (the CPU emulation), so a host's
    RAM holds its devices' state and the RAM tier together. ``smaller``: how to make the
    model itself smaller (the settings of the task at hand)."""
    need = est.device_total
    if device_bytes is not None and need > device_bytes:
        sizes = dict(est.mesh_shape)
        now = sizes.get("fsdp", 1) * sizes.get("tensor", 1)
        ways = now * math.ceil(need / device_bytes)
        raise DoesNotFit(
            component="device", need=need, have=device_bytes,
            message=f"The train state needs {size_text(need)} per device but a device has "
                    f"{size_text(device_bytes)} ({est.human()}).",
            fix=f"shard it over more devices: fsdp × tensor = {now} now, about {ways} needed "
                "(more hosts or slices, with mesh.ici.fsdp / mesh.dcn.fsdp over them; "
                f"mesh.ici.tensor for wide layers), or {smaller}; and leave headroom for "
                "activations")
    devices_need = need * est.devices_per_host if shared else 0
    host_need = devices_need + est.ram_tier + est.load_bytes
    if host_bytes is not None and host_need > host_bytes:
        what = ("the train state of its devices and the RAM tier need" if shared and est.ram_keep
                else "the train state of its devices needs" if shared
                else "the RAM tier needs" if est.ram_keep
                else "loading task.init_from needs")
        if est.load_bytes and (shared or est.ram_keep):
            what += f" (with {size_text(est.load_bytes)} to load task.init_from)"
        raise DoesNotFit(
            component="host", need=host_need, have=host_bytes,
            message=f"On each host {what} {size_text(host_need)} of host memory but a host has "
                    f"{size_text(host_bytes)} ({est.human()}).",
            fix="spread the state over more hosts (mesh.ici.fsdp / mesh.dcn.fsdp over more "
                "hosts or slices), keep fewer RAM copies (checkpoint.ram.keep=2 is the least, "
                "checkpoint.ram.holders=peer halves them) "
                f"or turn the tier off (checkpoint.ram.enabled=false), or {smaller}")
    cap = est.ram_max_host_bytes
    if (est.ram_keep and cap is not None
            and est.copy_bytes * est.ram_keep * est.holder_factor > cap):
        wanted = est.copy_bytes * est.ram_keep * est.holder_factor
        have = f" (the host has {size_text(host_bytes)})" if host_bytes is not None else ""
        raise DoesNotFit(
            component="ram_tier", need=wanted, have=cap,
            message=f"Each host's RAM copy is {size_text(est.copy_bytes)}: {est.ram_keep} kept × "
                    f"{est.holder_factor} host(s) = {size_text(wanted)} exceeds "
                    "checkpoint.ram.max_host_bytes="
                    f"{cap} ({size_text(cap)}), so every host would turn its RAM tier off.",
            fix=f"set checkpoint.ram.max_host_bytes={wanted} or more{have}, spread the state "
                "over more hosts, or turn the tier off (checkpoint.ram.enabled=false)")
