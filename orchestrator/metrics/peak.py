"""Measure a CPU's matmul FLOP/s, the honest MFU denominator when there is no TPU.

A CPU has no published bf16 peak for our purposes; the best dense matmul rate this process
reaches is a fair, reproducible stand-in, labelled "measured:cpu-matmul" wherever MFU is shown.
numpy only (the orchestrator never imports JAX); the host actor may measure with JAX instead.
"""

from __future__ import annotations

import time

import numpy as np


def measure_cpu_matmul_flops(*, n: int = 512, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n float32 matmul over ``repeats`` runs (2 n^3 FLOPs each)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: threads, caches
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best if best > 0 else 0.0
