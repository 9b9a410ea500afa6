"""Model FLOPs utilisation: the definition, the per-chip peak table and the analytic FLOP count.

MFU = model FLOPs per step / (step time x devices x peak FLOP/s per device). "Model" FLOPs are
the FLOPs the model needs (forward + backward), not what the hardware ran (no rematerialisation),
so MFU compares runs fairly. Pure functions: no JAX, no clock, no I/O. ``mfu`` itself is
defined with the step record that carries it (``orchestrator.controller.records``).
"""

from __future__ import annotations

from orchestrator.controller.records import mfu as mfu  # defined with the record that carries it
from orchestrator.shared.errors import ConfigError

PEAK_BF16_FLOPS_PER_CHIP: dict[str, float] = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
}
"""Dense bf16 peak per chip from Cloud TPU's published system specs."""

_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "v5": "v5p"}


def analytic_train_flops(*, n_params_non_embedding: int, vocab_size: int, d_model: int,
                         num_layers: int, seq_len: int, tokens: int) -> float:
    """Training FLOPs of a decoder-only transformer for ``tokens`` tokens (PaLM, appendix B).

    ``6 * (N + V * D) * T + 12 * L * D * S * T`` where N = non-embedding parameters,
    V * D = the output (logits) projection, a matmul even when tied to the input embedding whose
    lookup is free, L = layers, D = d_model (= heads x head_dim), S = sequence length,
    T = tokens. 6 = 2 FLOPs per multiply-add x 3 (forward + two backward matmuls); the
    12 * L * D * S term is attention's QK^T and AV matmuls, which have no parameters.
    """
    for name, value in (("n_params_non_embedding", n_params_non_embedding),
                        ("vocab_size", vocab_size), ("d_model", d_model),
                        ("num_layers", num_layers), ("seq_len", seq_len), ("tokens", tokens)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    dense = 6.0 * (n_params_non_embedding + vocab_size * d_model) * tokens
    attention = 12.0 * num_layers * d_model * seq_len * tokens
    return dense + attention


def normalize_accelerator(accelerator: str) -> str | None:
    """'v5litepod-16', 'TPU-V5E', 'v6e-8' -> table key, or None when unknown."""
    key = accelerator.strip().lower().removeprefix("tpu-").removeprefix("tpu_")
    key = key.split("-", 1)[0]
    key = _ALIASES.get(key, key)
    return key if key in PEAK_BF16_FLOPS_PER_CHIP else None


def resolve_peak(accelerator: str | None, configured: float | None,
                 measured: float | None) -> tuple[float, str]:
    """The peak FLOP/s per device to divide by, and where it came from.

    Order: an explicit configured value (the user knows best), then the chip table for a known
    TPU generation, then a measured value (CPU runs: a timed matmul), so the source is always
    visible next to the MFU. Raises ConfigError when nothing is usable.
    """
    if configured is not None:
        if configured <= 0:
            raise ConfigError("metrics.cpu_peak_flops_per_device", f"must be > 0, got {configured}",
                              "set a positive FLOP/s value or leave it unset")
        return float(configured), "configured"
    if accelerator:
        key = normalize_accelerator(accelerator)
        if key is not None:
            return PEAK_BF16_FLOPS_PER_CHIP[key], f"table:{key}"
    if measured is not None and measured > 0:
        return float(measured), "measured:cpu-matmul"
    raise ConfigError(
        "cluster.accelerator",
        f"no peak FLOP/s known for accelerator {accelerator!r} and no measurement",
        f"set cluster.accelerator to one of {sorted(PEAK_BF16_FLOPS_PER_CHIP)} or "
        "metrics.cpu_peak_flops_per_device to the device's peak FLOP/s",
    )


def flops_agree(xla_flops: float, analytic_flops: float, *, tolerance: float = 0.25) -> bool:
    """True when XLA's cost analysis and the analytic count agree within ``tolerance`` (relative).

    XLA counts what it compiled (fusions, softmax, norms) and the formula counts matmuls only;
    they differ by a few percent on real models, so a big gap means a wrong config or a wrong
    (per-device instead of global) cost analysis.
    """
    if xla_flops <= 0 or analytic_flops <= 0:
        return False
    return abs(xla_flops - analytic_flops) / analytic_flops <= tolerance
