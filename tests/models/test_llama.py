"""The Llama-style decoder: shapes, causality, GQA, RoPE, learning, sharding, preset sizes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orchestrator.shared.errors import ConfigError
from workers.models.llama import (
    LlamaConfig,
    LlamaLM,
    apply_rope,
    flops_per_step,
    param_count,
)

REPO = Path(__file__).resolve().parents[2]


def _init(cfg: LlamaConfig, seed: int = 0):
    """Jitted: one compile instead of op-by-op dispatch (a third of the time on CPU)."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    return nn.meta.unbox(jax.jit(LlamaLM(cfg).init)(jax.random.key(seed), tokens)["params"])


def _apply(cfg: LlamaConfig, params, tokens) -> jnp.ndarray:
    """The model's logits, jitted (see ``_init``)."""
    return jax.jit(LlamaLM(cfg).apply)({"params": params}, tokens)


def _tokens(cfg: LlamaConfig, batch: int = 2, seed: int = 1) -> jnp.ndarray:
    return jax.random.randint(jax.random.key(seed), (batch, cfg.seq_len - 1), 0, cfg.vocab_size)


def _n(tree) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("scan", [True, False])
def test_forward_shapes_and_param_count(scan):
    """Logits are (batch, seq, vocab) float32 and finite; the parameter count is the closed form."""
    cfg = LlamaConfig.preset("tiny", scan_layers=scan)
    params = _init(cfg)
    logits = _apply(cfg, params, _tokens(cfg))
    assert logits.shape == (2, cfg.seq_len - 1, cfg.vocab_size)
    assert logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    assert _n(params) == param_count(cfg)


def test_tied_embeddings_have_no_lm_head():
    """tie_embeddings drops lm_head (vocab·d fewer parameters) and still gives vocab logits."""
    untied, tied = LlamaConfig.preset("tiny"), LlamaConfig.preset("tiny", tie_embeddings=True)
    p_untied, p_tied = _init(untied), _init(tied)
    assert "lm_head" in p_untied and "lm_head" not in p_tied
    assert _n(p_untied) - _n(p_tied) == untied.vocab_size * untied.d_model
    assert _apply(tied, p_tied, _tokens(tied)).shape[-1] == tied.vocab_size


def test_causal_future_tokens_do_not_change_past_logits():
    """Changing token 10 leaves logits 0..9 as they were and changes logits from 10 on."""
    cfg = LlamaConfig.preset("tiny")
    params, tokens = _init(cfg), _tokens(cfg)
    changed = tokens.at[:, 10].set((tokens[:, 10] + 1) % cfg.vocab_size)
    a = _apply(cfg, params, tokens)
    b = _apply(cfg, params, changed)
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-6, atol=1e-6)
    assert float(jnp.max(jnp.abs(a[:, 10:] - b[:, 10:]))) > 1e-4


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_gqa_equals_multi_head_with_repeated_kv(kv_heads):
    """num_kv_heads = 1 (MQA), 2 and num_heads (MHA) all run, and GQA is MHA whose key/value
    head h is the shared head h // group: query heads read the kv head of their group."""
    gqa = LlamaConfig.preset("tiny", num_kv_heads=kv_heads, scan_layers=False)
    mha = LlamaConfig.preset("tiny", num_kv_heads=gqa.num_heads, scan_layers=False)
    params = _init(gqa)
    assert params["layer0"]["attn"]["k"]["kernel"].shape == (gqa.d_model, kv_heads, gqa.head_dim)
    group = gqa.num_heads // kv_heads
    tiled = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.repeat(x, group, axis=1)
        if any(getattr(k, "key", None) in ("k", "v") for k in path) else x, params)
    tokens = _tokens(gqa)
    np.testing.assert_allclose(_apply(gqa, params, tokens),
                               _apply(mha, tiled, tokens),
                               rtol=2e-5, atol=2e-5)


def test_rope_scores_depend_only_on_relative_position():
    """<rope(q, m), rope(k, n)> is the same for (m, n) and (m + 13, n + 13), differs for another
    distance, and rotation keeps each vector's norm."""
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16))
    def score(m, n):
        return float(jnp.sum(apply_rope(q, jnp.array([m]), 10_000.0)
                             * apply_rope(k, jnp.array([n]), 10_000.0)))
    assert score(5, 2) == pytest.approx(score(18, 15), rel=1e-5, abs=1e-5)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3
    rotated = apply_rope(q, jnp.array([7]), 10_000.0)
    assert float(jnp.linalg.norm(rotated)) == pytest.approx(float(jnp.linalg.norm(q)), rel=1e-5)


def test_model_sees_only_relative_positions():
    """Positions shifted by a constant give the same logits (no absolute position anywhere);
    positions in another order do not."""
    cfg = LlamaConfig.preset("tiny")
    params, tokens = _init(cfg), _tokens(cfg)
    seq = tokens.shape[1]
    apply = jax.jit(LlamaLM(cfg).apply)
    base = apply({"params": params}, tokens)
    shifted = apply({"params": params}, tokens, jnp.arange(seq) + 100)
    np.testing.assert_allclose(base, shifted, rtol=1e-4, atol=1e-4)
    spread = apply({"params": params}, tokens, jnp.arange(seq) * 2)
    assert float(jnp.max(jnp.abs(base - spread))) > 1e-3


@pytest.mark.parametrize("overrides", [{}, {"remat": True, "tie_embeddings": True}])
def test_optimizer_steps_reduce_loss(overrides):
    """15 AdamW steps on one fixed batch drive the next-token loss well below its start."""
    cfg = LlamaConfig.preset("tiny", **overrides)
    model, tx = LlamaLM(cfg), optax.adamw(3e-3)
    params = _init(cfg)
    batch = jax.random.randint(jax.random.key(2), (4, cfg.seq_len), 0, cfg.vocab_size)

    def loss_fn(p):
        logits = model.apply({"params": p}, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    @jax.jit
    def step(p, opt):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, loss

    opt = tx.init(params)
    losses = []
    for _ in range(15):
        params, opt, loss = step(params, opt)
        losses.append(float(loss))
    assert losses[0] == pytest.approx(math.log(cfg.vocab_size), rel=0.1)
    assert losses[-1] < 0.6 * losses[0], losses


def _probe(*args: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "tests.models.sharding_probe", *args],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


EXPECTED_SCANNED = {  # (1, 2, 2) mesh of (data, fsdp, tensor); leading None: the layer axis
    "embed/embedding": ["tensor", "fsdp"],
    "layers/attn/q/kernel": [None, "fsdp", "tensor", None],
    "layers/attn/k/kernel": [None, "fsdp", "tensor", None],
    "layers/attn/v/kernel": [None, "fsdp", "tensor", None],
    "layers/attn/o/kernel": [None, "tensor", None, "fsdp"],
    "layers/mlp/gate/kernel": [None, "fsdp", "tensor"],
    "layers/mlp/up/kernel": [None, "fsdp", "tensor"],
    "layers/mlp/down/kernel": [None, "tensor", "fsdp"],
    "layers/attn_norm/scale": [None, "fsdp"],
    "layers/mlp_norm/scale": [None, "fsdp"],
    "final_norm/scale": ["fsdp"],
    "lm_head/kernel": ["fsdp", "tensor"],
}


def test_sharding_over_data_fsdp_tensor_mesh():
    """A jitted init over a (1, 2, 2) mesh of 4 CPU devices lays out every parameter by
    LLAMA_RULES (embed over fsdp, heads/kv_heads/mlp/vocab over tensor, layers unsharded),
    each device holds the shard shape workers.training.memory.shard_shape predicts, and the sharded
    model runs."""
    from workers.training.memory import shard_shape

    got = _probe("--mesh", "1,2,2")
    assert got["devices"] == 4
    assert {k: v["spec"] for k, v in got["params"].items()} == EXPECTED_SCANNED
    sizes = {"data": 1, "fsdp": 2, "tensor": 2}
    for name, p in got["params"].items():
        spec = jax.sharding.PartitionSpec(*p["spec"])
        assert list(shard_shape(p["shape"], spec, sizes)) == p["shard"], name
    cfg = LlamaConfig.preset("tiny")
    assert got["logits"] == [4, cfg.seq_len - 1, cfg.vocab_size]


def test_sharding_unscanned_layers_use_the_same_names():
    """Without scan, layer i's parameters carry the same specs minus the layer axis."""
    got = _probe("--mesh", "1,2,2", "--no-scan")
    specs = {k: v["spec"] for k, v in got["params"].items()}
    assert specs["layer1/attn/k/kernel"] == ["fsdp", "tensor", None]
    assert specs["layer0/mlp/down/kernel"] == ["tensor", "fsdp"]
    assert specs["embed/embedding"] == ["tensor", "fsdp"]


@pytest.mark.parametrize(("preset", "published"), [("1b", 1.24e9), ("8b", 8.03e9)])
def test_preset_parameter_counts_match_published(preset, published):
    """jax.eval_shape of the 1b / 8b presets counts ~1.24B / ~8.03B parameters (within 2 %),
    and exactly the closed form (1b: 1,235,814,400; 8b: 8,030,261,248, as published)."""
    cfg = LlamaConfig.preset(preset)
    abstract = jax.eval_shape(LlamaLM(cfg).init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    n = _n(nn.meta.unbox(abstract["params"]))
    assert abs(n - published) / published < 0.02, n
    assert n == param_count(cfg)
    assert n == {"1b": 1_235_814_400, "8b": 8_030_261_248}[preset]


def test_flops_formula_within_10_percent_of_xla():
    """XLA's FLOP count of a jitted train step (forward, backward, AdamW) of the unscanned tiny
    model agrees with flops_per_step within 10 % (XLA does not count a scan's trip count)."""
    cfg = LlamaConfig.preset("tiny", scan_layers=False, d_model=128, d_ff=256, seq_len=65)
    model, tx = LlamaLM(cfg), optax.adamw(1e-3)
    params = _init(cfg)
    batch = jnp.zeros((4, cfg.seq_len), jnp.int32)

    def step(p, opt):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        grads = jax.grad(loss_fn)(p)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt

    cost = jax.jit(step).lower(params, tx.init(params)).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla, analytic = float(cost["flops"]), flops_per_step(cfg, 4)
    assert abs(xla - analytic) / xla <= 0.10, f"xla={xla:.4g} analytic={analytic:.4g}"


def test_flops_formula_by_hand():
    """6 FLOPs per matmul weight per token (k, v at num_kv_heads) plus attention's QKᵀ and AV."""
    cfg = LlamaConfig(vocab_size=10, d_model=4, num_layers=1, num_heads=2, num_kv_heads=1,
                      d_ff=8, seq_len=3)
    tokens = 2 * (3 - 1)
    weights = (4 * 2 * 2 * 2 + 4 * 1 * 2 * 2) + 3 * 4 * 8 + 10 * 4  # q, o; k, v; mlp; unembed
    attention = 6 * 1 * tokens * 2 * (3 - 1) * 4
    assert flops_per_step(cfg, 2) == 6 * weights * tokens + attention


@pytest.mark.parametrize(("overrides", "setting"), [
    ({"num_kv_heads": 3}, "task.model.num_kv_heads"),
    ({"num_kv_heads": 8}, "task.model.num_kv_heads"),
    ({"num_heads": 3}, "task.model.num_heads"),
    ({"d_model": 68, "num_heads": 4, "num_kv_heads": 4}, "task.model.num_heads"),
    ({"seq_len": 1}, "task.model.seq_len"),
    ({"rope_theta": 0.0}, "task.model.rope_theta"),
    ({"dtype": "float16"}, "task.model.dtype"),
    ({"tie_embeddings": "yes"}, "task.model.tie_embeddings"),
    ({"head_count": 2}, "task.model.head_count"),
])
def test_invalid_config_names_the_setting(overrides, setting):
    """Each invalid value raises ConfigError naming its task.model setting and a fix."""
    with pytest.raises(ConfigError) as err:
        LlamaConfig.preset("tiny", **overrides)
    assert err.value.setting == setting
    assert err.value.fix


def test_unknown_preset_lists_the_presets():
    """An unknown preset name is refused with the names there are."""
    with pytest.raises(ConfigError, match=r"task\.model\.preset") as err:
        LlamaConfig.preset("70b")
    assert "tiny, 1b, 8b" in err.value.fix
