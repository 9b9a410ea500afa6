"""The built-in LM's optimizer and LR schedule from ``train.*``, for any task that wants them."""

from __future__ import annotations

import optax

from orchestrator.shared.sections import TrainConfig


def make_lr_schedule(t: TrainConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup to the peak, cosine decay to end_lr_ratio × peak."""
    decay = t.decay_steps or total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.learning_rate, warmup_steps=t.warmup_steps,
        decay_steps=max(decay, t.warmup_steps + 1), end_value=t.learning_rate * t.end_lr_ratio)


def make_optimizer(train: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on ``make_lr_schedule``."""
    return optax.chain(
        optax.clip_by_global_norm(train.grad_clip),
        optax.adamw(make_lr_schedule(train, total_steps), b1=train.b1, b2=train.b2,
                    weight_decay=train.weight_decay),
    )


def adamw_cosine(ctx) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(optimizer, schedule)`` from a ``TaskContext``'s ``train.*`` and ``total_steps``."""
    return make_optimizer(ctx.train, ctx.total_steps), make_lr_schedule(ctx.train,
                                                                         ctx.total_steps)
