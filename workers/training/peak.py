"""The CPU stand-in for a device's peak FLOP/s, measured where the step runs
(``orchestrator/metrics/peak.py`` says why a measured matmul is the fair peak on CPU)."""

from __future__ import annotations

import time


def matmul_flops(size: int = 512, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` ``size``² matmuls on this process's first local
    device."""
    import jax
    import jax.numpy as jnp

    dev = jax.local_devices()[0]
    a = jax.device_put(jnp.ones((size, size), jnp.float32), dev)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best
