"""A user's task: a small Flax NNX MLP regression on stateless (seed, step) data."""
