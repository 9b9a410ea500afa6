"""The tiny Llama initialised for real over a (data, fsdp, tensor) mesh of CPU devices.

Run as ``python -m tests.models.sharding_probe --mesh 1,2,2 [--no-scan]`` in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``, so the device count is fixed there and
never in the pytest process. Prints one JSON line: each parameter's mesh PartitionSpec, global
and first-shard shapes, the bytes one device holds of the whole train state (params, AdamW state,
step, rng) and the logits' shape of a forward pass run under that sharding.
"""

from __future__ import annotations

import argparse
import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from workers.models.llama import LLAMA_RULES, LlamaConfig, LlamaLM
from workers.training.memory import abstract_train_state

AXES = ("data", "fsdp", "tensor")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mesh", required=True, help="data,fsdp,tensor sizes")
    p.add_argument("--no-scan", action="store_true")
    args = p.parse_args(argv)
    shape = tuple(int(x) for x in args.mesh.split(","))
    cfg = LlamaConfig.preset("tiny", scan_layers=not args.no_scan)
    model, tx = LlamaLM(cfg), optax.adamw(1e-3)
    mesh = Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), AXES)
    boxed = abstract_train_state(model, tx, seq_len=cfg.seq_len)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, LLAMA_RULES)

    def init(key):
        params = model.init(key, jnp.zeros((1, 8), jnp.int32))["params"]
        return nn.meta.unbox({"params": params, "opt_state": tx.init(params),
                              "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)})

    state = jax.jit(init, out_shardings=shardings)(jax.random.key(0))
    params = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state["params"])[0]:
        spec = list(leaf.sharding.spec) + [None] * (leaf.ndim - len(leaf.sharding.spec))
        params["/".join(k.key for k in path)] = {
            "spec": [list(e) if isinstance(e, tuple) else e for e in spec],
            "shape": list(leaf.shape),
            "shard": list(leaf.addressable_shards[0].data.shape)}
    device0 = jax.devices()[0]
    held = sum(s.data.nbytes for leaf in jax.tree.leaves(state)
               for s in leaf.addressable_shards if s.device == device0)
    tokens = jnp.zeros((2 * shape[0] * shape[1], cfg.seq_len - 1), jnp.int32)
    logits = jax.jit(lambda prm, t: model.apply({"params": prm}, t))(state["params"], tokens)
    print(json.dumps({"params": params, "device0_bytes": held,
                      "logits": list(logits.shape), "devices": len(jax.devices())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
