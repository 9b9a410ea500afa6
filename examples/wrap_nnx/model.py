"""A classifier written for Flax NNX with no thought of the orchestrator: plain layers without
sharding annotations, a factory from a seed, and a loss written against the module, as a
training loop with ``nnx.value_and_grad(loss_fn, has_aux=True)`` would use them.
``examples/wrap_nnx/task.py`` wraps this file unmodified."""

from __future__ import annotations

import optax
from flax import nnx


class Classifier(nnx.Module):
    def __init__(self, features: int, hidden: int, classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(features, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def make_model(seed: int, features: int = 16, hidden: int = 64, classes: int = 4) -> Classifier:
    return Classifier(features, hidden, classes, rngs=nnx.Rngs(seed))


def loss_fn(model: Classifier, x, y):
    logits = model(x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, logits
