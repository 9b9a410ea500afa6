"""A Llama-style decoder in Flax Linen: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention.

Every parameter carries logical axis names; ``LLAMA_RULES`` maps them to the mesh axes
(data, fsdp, tensor) with ``workers.training.model.LOGICAL_RULES`` plus this family's own names
(``kv_heads`` on the tensor axis like ``heads``; ``layers``, the scanned layer axis, unsharded),
so the mesh plan shards it as it shards the tiny ``DecoderLM``.

The model: token embedding (no position table), ``num_layers`` pre-norm blocks
``x + attn(rms(x))``, ``x + mlp(rms(x))``, a final RMSNorm, then logits from the embedding
(``tie_embeddings``) or a separate ``lm_head``. Attention is causal; query head ``h`` reads
key/value head ``h // (num_heads / num_kv_heads)`` (the grouping of Llama's ``repeat_kv``),
through the platform's fused kernel or the plain reference (``attention``; ``attention.py``).
RoPE rotates the two halves of each head (the "rotate half" layout), frequencies
``rope_theta ** (-2i / head_dim)``; the Llama 3.1+ long-context frequency scaling is not
applied (it matters past the 8192-token context the presets train at).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from orchestrator.shared.errors import ConfigError
from workers.models.attention import IMPLEMENTATIONS, fused_attention, plain_attention
from workers.training.model import LOGICAL_RULES

LLAMA_RULES: tuple[tuple[str, Any], ...] = (
    *LOGICAL_RULES,
    ("kv_heads", "tensor"),
    ("layers", None),
)
"""``LOGICAL_RULES`` plus ``kv_heads`` (sharded like ``heads``: ``num_kv_heads`` should divide
by the tensor axis) and ``layers`` (the stacked layer axis of ``scan_layers``, never sharded)."""

SETTING = "task.model"
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Published shapes. 1b: Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json: hidden_size 2048,
# intermediate_size 8192, 16 layers, 32 heads, 8 KV heads, vocab 128256, rope_theta 500000,
# rms_norm_eps 1e-5, tie_word_embeddings true; model card: 1.23B parameters). 8b: Llama 3 8B
# (meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, intermediate_size 14336, 32 layers,
# 32 heads, 8 KV heads, vocab 128256, rope_theta 500000, rms_norm_eps 1e-5, untied; the
# Llama 3 paper, arXiv 2407.21783, Table 3; 8.03B parameters). Both trained at 8192 tokens
# before long-context extension, hence seq_len 8192.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 d_ff=128, seq_len=32, rope_theta=10_000.0, tie_embeddings=False,
                 dtype="float32", param_dtype="float32"),
    "1b": dict(vocab_size=128_256, d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8,
               d_ff=8192, seq_len=8192, rope_theta=500_000.0, tie_embeddings=True,
               dtype="bfloat16", param_dtype="float32"),
    "8b": dict(vocab_size=128_256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8,
               d_ff=14_336, seq_len=8192, rope_theta=500_000.0, tie_embeddings=False,
               dtype="bfloat16", param_dtype="float32"),
}


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """The shape and numerics of a Llama-style decoder. Defaults are the ``tiny`` preset."""

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    """Grouped-query attention: key/value heads, 1 (multi-query) to ``num_heads`` (multi-head)."""
    d_ff: int = 128
    """Hidden width of the SwiGLU MLP (gate and up projections)."""
    seq_len: int = 32
    """Tokens per training sequence (the model sees ``seq_len - 1`` and predicts the next)."""
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    """True: logits from the embedding table (no ``lm_head``)."""
    dtype: str = "float32"
    """Compute dtype of activations and matmuls: float32 or bfloat16."""
    param_dtype: str = "float32"
    """Storage dtype of parameters (and so of gradients and Adam moments): float32 or bfloat16."""
    scan_layers: bool = True
    """Layers as one ``nn.scan`` over stacked parameters (compile time independent of depth)."""
    remat: bool = False
    """Recompute each block's activations in the backward pass (less memory, ~1/3 more FLOPs)."""
    attention: str = "fused"
    """``fused``: ``jax.nn.dot_product_attention`` (cuDNN on GPU, splash on one TPU chip, XLA on
    CPU; equal to ``plain`` within tests' tolerances); ``plain``: the full score matrix, the
    reference (``workers/models/attention.py``)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff",
                     "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{SETTING}.{name}", f"{value!r} is not a whole number >= 1",
                                  f"set {SETTING}.{name} to a positive integer")
        if self.seq_len < 2:
            raise ConfigError(f"{SETTING}.seq_len", f"{self.seq_len} leaves no next token to "
                              "predict", f"set {SETTING}.seq_len to 2 or more")
        if self.d_model % self.num_heads:
            raise ConfigError(f"{SETTING}.num_heads", f"d_model={self.d_model} does not divide by "
                              f"num_heads={self.num_heads}",
                              f"pick num_heads that divides {SETTING}.d_model")
        if (self.d_model // self.num_heads) % 2:
            raise ConfigError(f"{SETTING}.num_heads", f"head dim d_model/num_heads = "
                              f"{self.d_model // self.num_heads} is odd: RoPE rotates pairs",
                              "pick num_heads so that d_model / num_heads is even")
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{SETTING}.num_kv_heads",
                              f"num_heads={self.num_heads} is not a multiple of "
                              f"num_kv_heads={self.num_kv_heads}",
                              f"set {SETTING}.num_kv_heads to a divisor of num_heads "
                              "(1 = multi-query, num_heads = multi-head)")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{SETTING}.{name}", f"{value!r} is not a number > 0",
                                  f"set {SETTING}.{name} to a positive number")
        for name in ("tie_embeddings", "scan_layers", "remat"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{SETTING}.{name}", f"{getattr(self, name)!r} is not a boolean",
                                  f"set {SETTING}.{name}=true or false")
        if self.attention not in IMPLEMENTATIONS:
            raise ConfigError(f"{SETTING}.attention", f"{self.attention!r} is not an attention "
                              "implementation", f"set {SETTING}.attention to one of "
                              f"{', '.join(IMPLEMENTATIONS)} (fused: the platform's kernel; "
                              "plain: the reference)")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ConfigError(f"{SETTING}.{name}", f"{getattr(self, name)!r} is not a dtype "
                                  "this model runs in", f"set {SETTING}.{name} to one of "
                                  f"{', '.join(_DTYPES)}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> LlamaConfig:
        """The preset ``name`` (``tiny``, ``1b``, ``8b``) with ``overrides`` applied."""
        if name not in PRESETS:
            raise ConfigError(f"{SETTING}.preset", f"no preset {name!r}",
                              f"use one of {', '.join(PRESETS)}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in overrides:
            if key not in known:
                raise ConfigError(f"{SETTING}.{key}", "no such setting of a llama model",
                                  f"use one of {', '.join(sorted(known))}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self) -> Any:
        return _DTYPES[self.dtype]

    @property
    def weights_dtype(self) -> Any:
        return _DTYPES[self.param_dtype]


def param_count(cfg: LlamaConfig) -> int:
    """Parameters, in closed form (equal to the initialised model's; tests check both)."""
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * cfg.num_heads * hd * 2 + d * cfg.num_kv_heads * hd * 2  # q, o; k, v
    block = attn + 3 * d * cfg.d_ff + 2 * d  # gate, up, down; two RMSNorm scales
    embeddings = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * block + d + embeddings


def flops_per_step(cfg: LlamaConfig, global_batch: int) -> float:
    """Training FLOPs per step, as ``workers.training.model.analytic_flops_per_step`` counts them:
    6·N·T + 6·L·T·2·(seq_len-1)·num_heads·head_dim (PaLM, App. B).

    T = global_batch·(seq_len-1) tokens (next-token training). N counts matmul weights: q, k, v,
    o (k and v at ``num_kv_heads``), gate, up, down per layer, and the unembedding (vocab·d,
    tied or not); the embedding lookup and norms are not matmuls. 6 = forward (2) + backward (4).
    Attention: QKᵀ and AV take 2·seq·heads·head_dim FLOPs each per token and layer forward,
    counted over the full (masked) square as the plain and XLA paths compute it, for every
    ``attention`` (so MFU compares across them; cuDNN and splash skip the masked half, so their
    hardware FLOPs are lower than this); GQA shares K/V, not these.
    ``remat`` recomputes the forward: XLA then counts ~8·N·T, this stays the useful 6·N·T
    (MFU's convention).
    """
    d, hd, s = cfg.d_model, cfg.head_dim, cfg.seq_len - 1
    tokens = global_batch * s
    per_layer = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.d_ff
    n_matmul = cfg.num_layers * per_layer + cfg.vocab_size * d
    attention = 6.0 * cfg.num_layers * tokens * 2 * s * cfg.num_heads * hd
    return 6.0 * n_matmul * tokens + attention


def flops_per_token(cfg: LlamaConfig) -> float:
    """``flops_per_step`` for one sequence, per token trained on."""
    return flops_per_step(cfg, 1) / (cfg.seq_len - 1)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, theta: float) -> jnp.ndarray:
    """Rotate ``x`` (batch, seq, heads, head_dim) by ``positions`` (seq,): pair (i, i + d/2) of
    each head turns by ``position · theta^(-2i/d)``. Computed in float32."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _kernel(names: tuple[str, ...]) -> Any:
    return nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)


def _norm(cfg: LlamaConfig, name: str) -> nn.RMSNorm:
    return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=cfg.compute_dtype,
                      param_dtype=cfg.weights_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))


def _proj(cfg: LlamaConfig, features: Any, names: tuple[str, ...], name: str,
          axis: Any = -1) -> nn.DenseGeneral:
    return nn.DenseGeneral(features, axis=axis, use_bias=False, kernel_init=_kernel(names),
                           dtype=cfg.compute_dtype, param_dtype=cfg.weights_dtype, name=name)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE on queries and keys, ``cfg.attention``'s
    implementation (``workers/models/attention.py``)."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
        c, hd = self.cfg, self.cfg.head_dim
        q = _proj(c, (c.num_heads, hd), ("embed", "heads", "kv"), "q")(x)
        k = _proj(c, (c.num_kv_heads, hd), ("embed", "kv_heads", "kv"), "k")(x)
        v = _proj(c, (c.num_kv_heads, hd), ("embed", "kv_heads", "kv"), "v")(x)
        q, k = apply_rope(q, positions, c.rope_theta), apply_rope(k, positions, c.rope_theta)
        attend = fused_attention if c.attention == "fused" else plain_attention
        out = attend(q, k, v)
        return _proj(c, c.d_model, ("heads", "kv", "embed"), "o", axis=(-2, -1))(out)


class Mlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) · up(x))."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c = self.cfg
        gate = _proj(c, c.d_ff, ("embed", "mlp"), "gate")(x)
        up = _proj(c, c.d_ff, ("embed", "mlp"), "up")(x)
        return _proj(c, c.d_model, ("mlp", "embed"), "down")(nn.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm decoder layer; (carry, positions) -> (carry, None) so ``nn.scan`` can run it."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray) -> tuple[jnp.ndarray, None]:
        x = x + Attention(self.cfg, name="attn")(_norm(self.cfg, "attn_norm")(x), positions)
        x = x + Mlp(self.cfg, name="mlp")(_norm(self.cfg, "mlp_norm")(x))
        return x, None


class LlamaLM(nn.Module):
    """tokens (batch, seq) int -> logits (batch, seq, vocab) float32. ``positions`` (seq,)
    defaults to 0..seq-1; only their differences matter (RoPE)."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, positions: jnp.ndarray | None = None
                 ) -> jnp.ndarray:
        c = self.cfg
        if positions is None:
            positions = jnp.arange(tokens.shape[1])
        embed = nn.Embed(c.vocab_size, c.d_model, dtype=c.compute_dtype,
                         param_dtype=c.weights_dtype, name="embed",
                         embedding_init=nn.with_logical_partitioning(
                             nn.initializers.normal(0.02), ("vocab", "embed")))
        x = embed(tokens)
        block: Any = nn.remat(Block, prevent_cse=not c.scan_layers) if c.remat else Block
        if c.scan_layers:
            layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                             in_axes=(nn.broadcast,), length=c.num_layers,
                             metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = layers(c, name="layers")(x, positions)
        else:
            for i in range(c.num_layers):
                x, _ = block(c, name=f"layer{i}")(x, positions)
        x = _norm(c, "final_norm")(x)
        if c.tie_embeddings:
            return embed.attend(x).astype(jnp.float32)
        return _proj(c, c.vocab_size, ("embed", "vocab"), "lm_head")(x).astype(jnp.float32)


def build_llama(cfg: LlamaConfig) -> LlamaLM:
    return LlamaLM(cfg)
