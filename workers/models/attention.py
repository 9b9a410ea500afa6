"""Causal grouped-query attention for the ``llama`` family, two ways (``LlamaConfig.attention``).

``plain``: the reference: the full (batch, kv_heads, group, seq, seq) score tensor, a float32
softmax, then the weighted values. ``fused``: ``jax.nn.dot_product_attention(is_causal=True)``
with the implementation chosen per platform (``implementation_for``):

- CPU (and ROCm): ``xla``, the same math, scores in float32 (no speedup; the numerics reference
  the tests compare against ``plain``);
- CUDA GPU: ``cudnn`` (flash attention: no score matrix in memory, masked blocks skipped); a
  shape or dtype cuDNN refuses (float32, a head dim above 256 or not a multiple of 8, no cuDNN)
  falls back to ``xla`` with one log line;
- TPU: the Pallas splash-attention kernel (``_splash``), on a single-chip program only: a Mosaic
  kernel cannot be partitioned by XLA, and the trainer jits with shardings, not a mesh context a
  ``shard_map`` could take, so a multi-device TPU program uses ``xla`` (one log line). **The
  kernel has never run on a TPU here**: only its wiring (padding, scaling, layout, GQA) is tested,
  on CPU in Pallas interpret mode. Its module is imported only on TPU.

All take q (batch, seq, heads, head_dim) and k, v (batch, seq, kv_heads, head_dim): query head
``h`` reads key/value head ``h // (heads / kv_heads)``, without repeating K/V in memory.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("plain", "fused")
SPLASH_BLOCK = 128
"""Splash's block along the sequence (its default): the sequence is padded up to a multiple."""

_logged: set[str] = set()


def _log_once(message: str) -> None:
    """A fallback is said once per process, not once per trace."""
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def plain_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """The reference: scores in the compute dtype, masked, softmax in float32."""
    batch, seq, heads, hd = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, hd)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q, k) * jnp.asarray(hd ** -0.5, q.dtype)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    logits = jnp.where(causal, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    weights = nn.softmax(logits, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(batch, seq, heads, hd)


def implementation_for(platform: str) -> str:
    """The fused kernel a platform gets: ``cudnn`` on CUDA, ``splash`` on TPU, else ``xla``."""
    return {"gpu": "cudnn", "cuda": "cudnn", "tpu": "splash"}.get(platform, "xla")


def fused_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                    platform: str | None = None) -> jnp.ndarray:
    """Causal attention through the platform's fused kernel (``jax.default_backend()`` when
    ``platform`` is None), falling back to ``xla`` where that kernel cannot take the call."""
    impl = implementation_for(platform or jax.default_backend())
    if impl == "cudnn":
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        except (NotImplementedError, ValueError, RuntimeError) as err:
            _log_once(f"attention: cuDNN refused q {q.shape} {q.dtype} ({err}); using xla "
                      "(bfloat16 compute, task.model.dtype=bfloat16, is what cuDNN takes)")
    elif impl == "splash":
        if jax.device_count() == 1:
            return _splash(q, k, v)
        _log_once(f"attention: the TPU splash kernel runs on one chip only here "
                  f"({jax.device_count()} devices: XLA cannot partition a Mosaic kernel); "
                  "using xla")
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def _splash(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *,
            interpret: bool = False) -> jnp.ndarray:
    """UNTESTED ON TPU. Splash attention (Pallas): heads-first (batch mapped), q pre-scaled,
    the sequence padded at the end to a block multiple (padding is in every real query's future,
    so the causal mask hides it; padded rows are dropped). ``interpret`` runs it on CPU."""
    _, seq, heads, hd = q.shape
    padded = -(-seq // SPLASH_BLOCK) * SPLASH_BLOCK
    kernel = _splash_kernel(padded, heads, interpret)

    def heads_first(x: jnp.ndarray) -> jnp.ndarray:
        return jnp.swapaxes(jnp.pad(x, ((0, 0), (0, padded - seq), (0, 0), (0, 0))), 1, 2)

    scaled = q * jnp.asarray(hd ** -0.5, q.dtype)
    out = jax.vmap(kernel)(heads_first(scaled), heads_first(k), heads_first(v))
    return jnp.swapaxes(out, 1, 2)[:, :seq]


@functools.lru_cache(maxsize=16)
def _splash_kernel(seq: int, heads: int, interpret: bool) -> Any:
    """The kernel for one padded length and head count. Its mask info is built once, as
    constants (``ensure_compile_time_eval``): built under one trace and cached, its arrays would
    be that trace's tracers, leaked into the next (init, step and eval each trace the model)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa  # TPU (or interpret) only

    mask = sa.MultiHeadMask([sa.CausalMask((seq, seq))] * heads)
    with jax.ensure_compile_time_eval():
        return sa.make_splash_mha(mask=mask, head_shards=1, q_seq_shards=1, interpret=interpret)
