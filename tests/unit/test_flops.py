"""Analytic FLOPs per step vs XLA's cost analysis of the compiled step, for the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_analytic_flops_within_10_percent_of_xla(tmp_path):
    """XLA's global FLOP count of the real train step agrees with 6·N·T + attention within 10%.

    JAX runs in a subprocess with one CPU device so this process never fixes a device count.
    """
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.single_process", "--devices", "1",
         "--steps", "0", "--out", str(tmp_path / "r.npz")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    xla, analytic = info["flops_xla"], info["flops_analytic"]
    assert xla and analytic, info
    assert abs(xla - analytic) / xla <= 0.10, f"xla={xla:.4g} analytic={analytic:.4g}"


def test_analytic_flops_formula_by_hand():
    """The formula counts 6 FLOPs per matmul weight per token plus attention's QKᵀ and AV."""
    from orchestrator.config import ModelConfig
    from workers.training.model import analytic_flops_per_step

    m = ModelConfig(vocab_size=10, d_model=4, num_layers=1, num_heads=2, d_ff=8, seq_len=3)
    tokens = 2 * (3 - 1)  # next-token training on seq_len - 1 positions
    matmul_weights = 1 * (4 * 4 * 4 + 2 * 4 * 8) + 10 * 4
    attention = 6 * 1 * tokens * 2 * (3 - 1) * 4
    assert analytic_flops_per_step(m, 2) == 6 * matmul_weights * tokens + attention
