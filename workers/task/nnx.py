"""A Flax NNX model as a task's parameters (NNX is what Flax recommends for new models).

``NnxModel(make)`` with ``make(rngs) -> nnx.Module``, or ``NnxModel.from_seed(make_model)`` with
the factory a model file already has, ``make_model(seed) -> nnx.Module`` (called with the init
key, which it passes to ``nnx.Rngs`` as it would an int): ``init(key)`` builds the module and
returns its ``nnx.Param`` values as a plain nested dict, each boxed with the axis names of its
``nnx.with_partitioning(init, names)`` metadata where it has them (the orchestrator shards the
state from them; a parameter without names is replicated); ``module(params)`` merges the plain
dict back into the module (``nnx.merge`` of ``graphdef``, the module's structure, with the
parameters), inside the task's jitted loss; ``apply(params, *args)`` calls it; and
``module_loss(loss_fn)`` turns a loss written against the module, ``loss_fn(model, x, y)``, into
the contract's ``loss(params, batch)``. Modules are built with eager sharding off: the
orchestrator places the state through the step's shardings, on whatever mesh the run has now.

The init key is ``jax.random.key(run.seed)``, so ``run.seed=S`` gives the parameters
``make_model(S)`` (``nnx.Rngs(S)``) gives.

Only ``nnx.Param`` state is carried (the train state has no slot for batch statistics or RNG
streams kept in modules yet): a module holding other variables is refused at ``NnxModel(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from flax import nnx

from orchestrator.shared.errors import ConfigError


class NnxModel:
    def __init__(self, make: Callable[[nnx.Rngs], nnx.Module]) -> None:
        self.make = make
        self._build: Callable[[Any], nnx.Module] = lambda key: make(nnx.Rngs(params=key))
        self._split()

    @classmethod
    def from_seed(cls, make_model: Callable[[Any], nnx.Module]) -> NnxModel:
        """A module factory as a model file writes it, ``make_model(seed)`` building its module
        with ``nnx.Rngs(seed)``: called with the init key (``jax.random.key(run.seed)``; an
        ``nnx.Rngs`` takes a key as it takes an int, to the same parameters)."""
        self = cls.__new__(cls)
        self.make = make_model
        self._build = make_model
        self._split()
        return self

    def _split(self) -> None:
        """The module's structure (``graphdef``) from an abstract build; other state refused."""
        with nnx.use_eager_sharding(False):
            abstract = nnx.eval_shape(lambda: self._build(jax.random.key(0)))
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
            module = self._build(key)
        out: dict = {}
        for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
            names = var.get_metadata().get("out_sharding")
            value = var.get_value()
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = nn.LogicallyPartitioned(value, tuple(names)) if names else value
        return out

    def module(self, params: dict) -> nnx.Module:
        """The module with ``params`` (the plain dict ``init`` returned, unboxed) merged in."""
        return nnx.merge(self.graphdef, params)

    def apply(self, params: dict, *args: Any, **kwargs: Any) -> Any:
        """Call the module with ``params`` (the plain dict ``init`` returned, unboxed)."""
        return self.module(params)(*args, **kwargs)

    def module_loss(self, loss_fn: Callable[..., Any]) -> Callable[[dict, Any], Any]:
        """The contract's ``loss(params, batch)`` from a loss written against the module: a
        batch that is a tuple is passed as ``loss_fn(model, *batch)``, a dict as
        ``loss_fn(model, **batch)``, anything else as ``loss_fn(model, batch)``. ``loss_fn`` may
        return the loss, or ``(loss, aux)``: a dict ``aux`` of scalars is reported as metrics,
        any other aux (logits, say) is dropped."""
        def loss(params: dict, batch: Any) -> tuple[Any, dict]:
            model = self.module(params)
            if isinstance(batch, tuple | list):
                out = loss_fn(model, *batch)
            elif isinstance(batch, dict):
                out = loss_fn(model, **batch)
            else:
                out = loss_fn(model, batch)
            if isinstance(out, tuple):
                value, aux = out
                return value, dict(aux) if isinstance(aux, dict) else {}
            return out, {}

        return loss
