"""A Flax NNX model as a task's parameters (NNX is what Flax recommends for new models).

``NnxModel(make)`` with ``make(rngs) -> nnx.Module``: ``init(key)`` builds the module and returns
its ``nnx.Param`` values as a plain nested dict, each boxed with the axis names of its
``nnx.with_partitioning(init, names)`` metadata (the orchestrator shards the state from them);
``apply(params, *args)`` merges the plain dict back into the module (``nnx.merge``) and calls it,
inside the task's jitted loss. Modules are built with eager sharding off: the orchestrator
places the state through the step's shardings, on whatever mesh the run has now.

Only ``nnx.Param`` state is carried (the train state has no slot for batch statistics or RNG
streams kept in modules yet): a module holding other variables is refused at ``NnxModel(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
from flax import nnx

from orchestrator.shared.errors import ConfigError


class NnxModel:
    def __init__(self, make: Callable[[nnx.Rngs], nnx.Module]) -> None:
        self.make = make
        with nnx.use_eager_sharding(False):
            abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        self.graphdef, _, rest = nnx.split(abstract, nnx.Param, ...)
        others = sorted({type(v).__name__ for _, v in nnx.to_flat_state(rest)})
        if others:
            raise ConfigError("task.kind", f"the NNX model holds state other than nnx.Param "
                              f"({', '.join(others)}), which the train state does not carry",
                              "keep only nnx.Param variables in the module (pass RNG keys and "
                              "statistics as arguments), or write Task.step yourself")

    def init(self, key: Any) -> dict:
        """The module's parameters from ``key``: a nested dict, leaves boxed with axis names
        (``nn.LogicallyPartitioned``) where the parameter declares them."""
        with nnx.use_eager_sharding(False):
            module = self.make(nnx.Rngs(params=key))
        out: dict = {}
        for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            value = var.get_value()
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = nn.LogicallyPartitioned(value, tuple(names)) if names else value
        return out

    def apply(self, params: dict, *args: Any, **kwargs: Any) -> Any:
        """Call the module with ``params`` (the plain dict ``init`` returned, unboxed)."""
        return nnx.merge(self.graphdef, params)(*args, **kwargs)
