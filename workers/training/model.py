"""A decoder-only transformer LM in Flax (linen), with logical axis names on every parameter.

Logical names (``embed``, ``mlp``, ``heads``, ``vocab``) are mapped to mesh axes by
``LOGICAL_RULES``: FSDP shards the embedding dimension, the tensor axis shards heads, MLP and
vocabulary. Changing the mesh never touches the model.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from workers.task.contract import DEFAULT_RULES

LOGICAL_RULES = DEFAULT_RULES  # one table: the built-in LM's rules are the tasks' default


def _dense(features, names, dtype, name):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
    return nn.Dense(features, use_bias=False, kernel_init=init, dtype=dtype, name=name)


class Block(nn.Module):
    d_model: int
    num_heads: int
    d_ff: int
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        head_dim = self.d_model // self.num_heads
        h = nn.RMSNorm(dtype=self.dtype, name="ln1",
                       scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))(x)
        qkv_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                ("embed", "heads", "kv"))
        q = nn.DenseGeneral((self.num_heads, head_dim), use_bias=False, kernel_init=qkv_init,
                            dtype=self.dtype, name="q")(h)
        k = nn.DenseGeneral((self.num_heads, head_dim), use_bias=False, kernel_init=qkv_init,
                            dtype=self.dtype, name="k")(h)
        v = nn.DenseGeneral((self.num_heads, head_dim), use_bias=False, kernel_init=qkv_init,
                            dtype=self.dtype, name="v")(h)
        seq = x.shape[1]
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None, None]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(self.dtype)
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
        attn = nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
        o = jnp.einsum("bhqk,bkhd->bqhd", attn, v)
        out_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                ("heads", "kv", "embed"))
        o = nn.DenseGeneral(self.d_model, axis=(-2, -1), use_bias=False, kernel_init=out_init,
                            dtype=self.dtype, name="o")(o)
        x = x + o
        h = nn.RMSNorm(dtype=self.dtype, name="ln2",
                       scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))(x)
        h = _dense(self.d_ff, ("embed", "mlp"), self.dtype, "up")(h)
        h = nn.gelu(h)
        h = _dense(self.d_model, ("mlp", "embed"), self.dtype, "down")(h)
        return x + h


class DecoderLM(nn.Module):
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    seq_len: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        emb = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype, name="embed",
                       embedding_init=nn.with_logical_partitioning(
                           nn.initializers.normal(0.02), ("vocab", "embed")))
        pos = self.param("pos", nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                             ("seq", "embed")),
                         (self.seq_len, self.d_model))
        x = emb(tokens) + pos[None, : tokens.shape[1]].astype(self.dtype)
        for i in range(self.num_layers):
            x = Block(self.d_model, self.num_heads, self.d_ff, self.dtype, name=f"block{i}")(x)
        x = nn.RMSNorm(dtype=self.dtype, name="ln_f",
                       scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))(x)
        return emb.attend(x).astype(jnp.float32)


def build_model(model_cfg) -> DecoderLM:
    dtype = jnp.bfloat16 if model_cfg.dtype == "bfloat16" else jnp.float32
    return DecoderLM(vocab_size=model_cfg.vocab_size, d_model=model_cfg.d_model,
                     num_layers=model_cfg.num_layers, num_heads=model_cfg.num_heads,
                     d_ff=model_cfg.d_ff, seq_len=model_cfg.seq_len, dtype=dtype)


def analytic_flops_per_step(model_cfg, global_batch: int) -> float:
    """Training FLOPs per step: 6·N·T for matmul parameters plus attention scores (PaLM, App. B).

    N counts matmul weights (attention, MLP, and the tied unembedding); T = tokens per step.
    Attention: 6 · L · T · 2 · seq · d_model (QKᵀ and AV, forward + backward).
    """
    d, f, L, v, s = (model_cfg.d_model, model_cfg.d_ff, model_cfg.num_layers,
                     model_cfg.vocab_size, model_cfg.seq_len)
    tokens = global_batch * (s - 1)
    n_matmul = L * (4 * d * d + 2 * d * f) + v * d
    return 6.0 * n_matmul * tokens + 6.0 * L * tokens * 2 * (s - 1) * d
