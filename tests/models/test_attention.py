"""Fused attention (``workers/models/attention.py``) against the plain reference: outputs and
gradients through the model in float32 and bfloat16, causality, GQA and MHA, the platform
fallbacks, the TPU kernel's wiring in Pallas interpret mode, and the setting from a run config.

Tolerances (max |Δ| over logits / parameter gradients, tiny preset, measured on CPU):
float32 ≤ 3.3e-6 / 1.1e-6 (MHA: 0, the same ops) → checked at 2e-5; bfloat16 ≤ 0.055 / 0.024
(logits up to ~4: a bf16 ulp there is 0.031) → checked at 0.125 / 0.05."""

from __future__ import annotations

import json
import logging
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

from orchestrator.config import load_config
from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.task import task_ref
from workers.models import attention
from workers.models.attention import fused_attention, plain_attention
from workers.models.llama import LlamaConfig, LlamaLM
from workers.task.llama import LlamaSettings

REPO = Path(__file__).resolve().parents[2]
TOL = {"float32": (2e-5, 2e-5), "bfloat16": (0.125, 0.05)}
"""dtype → (logits, gradients) max |fused − plain| allowed."""


def _qkv(kv_heads: int, dtype=jnp.float32, seq: int = 19, heads: int = 4, hd: int = 16):
    kq, kk, kv = jax.random.split(jax.random.key(3), 3)
    return (jax.random.normal(kq, (2, seq, heads, hd), dtype),
            jax.random.normal(kk, (2, seq, kv_heads, hd), dtype),
            jax.random.normal(kv, (2, seq, kv_heads, hd), dtype))


def _params(cfg: LlamaConfig):
    """Random parameters of the model's shapes, drawn by numpy (compiling Flax's init takes
    seconds here; the weights' distribution does not matter to the comparison)."""
    abstract = jax.eval_shape(LlamaLM(cfg).init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape), s.dtype),
                        nn.meta.unbox(abstract["params"]))


def _logits_and_grads(cfg: LlamaConfig):
    """Logits and the parameter gradients of the next-token loss, one jitted call."""
    model = LlamaLM(cfg)
    params = _params(cfg)
    batch = jax.random.randint(jax.random.key(2), (2, cfg.seq_len), 0, cfg.vocab_size)

    def loss(p):
        logits = model.apply({"params": p}, batch[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        return ce, logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, grads


def _max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize(("dtype", "kv_heads"), [("float32", 2), ("float32", 4),
                                                  ("bfloat16", 2)])  # MQA: the kernel's test
def test_fused_model_equals_plain_logits_and_gradients(dtype, kv_heads):
    """The model with attention=fused gives plain's logits and parameter gradients (MQA, GQA,
    MHA in float32; GQA in bfloat16) within TOL."""
    fused = LlamaConfig.preset("tiny", attention="fused", dtype=dtype, num_kv_heads=kv_heads,
                               num_layers=1, scan_layers=False)
    plain = LlamaConfig.preset("tiny", attention="plain", dtype=dtype, num_kv_heads=kv_heads,
                               num_layers=1, scan_layers=False)
    assert LlamaConfig.preset("tiny").attention == "fused"  # the default
    logits_f, grads_f = _logits_and_grads(fused)
    logits_p, grads_p = _logits_and_grads(plain)
    tol_logits, tol_grads = TOL[dtype]
    assert _max_diff(logits_f, logits_p) <= tol_logits
    assert _max_diff(grads_f, grads_p) <= tol_grads
    assert float(jnp.max(jnp.abs(grads_p["layer0"]["attn"]["k"]["kernel"]))) > 1e-3  # not vacuous


def _causal_check(attend, kv_heads: int) -> None:
    """Changing keys/values at positions ≥ 10 leaves outputs 0..9 exactly as they were and
    changes outputs from 10 on."""
    q, k, v = _qkv(kv_heads)
    noise = jax.random.normal(jax.random.key(9), k[:, 10:].shape)
    a = attend(q, k, v)
    b = attend(q, k.at[:, 10:].add(noise), v.at[:, 10:].add(noise))
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=0, atol=1e-6)
    assert float(jnp.max(jnp.abs(a[:, 10:] - b[:, 10:]))) > 1e-2


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_fused_attention_is_causal_and_equals_plain(kv_heads):
    """On this platform's kernel: causal, and plain's output and q/k/v gradients within 2e-5."""
    _causal_check(jax.jit(fused_attention), kv_heads)
    q, k, v = _qkv(kv_heads)

    def grads(attend):
        return jax.jit(jax.grad(lambda *x: jnp.sum(jnp.sin(attend(*x))), argnums=(0, 1, 2)))(
            q, k, v)

    assert _max_diff(jax.jit(fused_attention)(q, k, v), jax.jit(plain_attention)(q, k, v)) <= 2e-5
    assert _max_diff(grads(fused_attention), grads(plain_attention)) <= 2e-5


def test_splash_wiring_in_interpret_mode():
    """The TPU kernel's wrapper (padding 19 → 128 tokens, scaling, heads-first layout, GQA: 4
    query heads on 2 key/value heads) run by Pallas's interpreter on CPU: causal, plain's output
    and q/k/v gradients within 2e-5. Mosaic's TPU compilation and speed are not tested here."""
    splash = jax.jit(lambda q, k, v: attention._splash(q, k, v, interpret=True))
    _causal_check(splash, 2)
    q, k, v = _qkv(2)
    assert _max_diff(splash(q, k, v), jax.jit(plain_attention)(q, k, v)) <= 2e-5

    def grads(attend):
        return jax.jit(jax.grad(lambda *x: jnp.sum(attend(*x) ** 2), argnums=(0, 1, 2)))(
            q, k, v)

    assert _max_diff(grads(splash), grads(plain_attention)) <= 2e-5


def test_cudnn_refusal_falls_back_to_xla_with_one_log_line(caplog, monkeypatch):
    """Where cuDNN refuses the call (here: no cuDNN, float32), the GPU path answers with xla's
    result and says so once, however often it is traced."""
    monkeypatch.setattr(attention, "_logged", set())
    q, k, v = _qkv(2)
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        out = fused_attention(q, k, v, platform="gpu")
        fused_attention(q, k, v, platform="gpu")
    lines = [r.getMessage() for r in caplog.records if "cuDNN refused" in r.getMessage()]
    assert len(lines) == 1 and "using xla" in lines[0]
    assert _max_diff(out, plain_attention(q, k, v)) <= 2e-5


def test_cpu_never_imports_the_tpu_kernel_and_multi_device_tpu_uses_xla():
    """A fresh process: the CPU path never imports splash; the TPU path on 2 devices (XLA
    cannot partition a Mosaic kernel) uses xla, logs why, and imports nothing either."""
    code = (
        "import json, logging, sys, jax\n"
        "from workers.models.attention import fused_attention, plain_attention\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "q = jax.random.normal(jax.random.key(1), (2, 19, 4, 16))\n"
        "k, v = jax.random.normal(jax.random.key(2), (2, 2, 19, 2, 16))\n"
        "cpu = fused_attention(q, k, v)\n"
        "tpu = fused_attention(q, k, v, platform='tpu')\n"
        "ref = plain_attention(q, k, v)\n"
        "print(json.dumps({'devices': jax.device_count(),\n"
        "  'splash': any('splash_attention' in m for m in sys.modules),\n"
        "  'diff': max(float(abs(x - ref).max()) for x in (cpu, tpu))}))\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"devices": 2, "splash": False, "diff": got["diff"]} and got["diff"] <= 2e-5
    assert "splash kernel runs on one chip only" in out.stderr


def test_attention_setting_from_a_run_config():
    """task.model.attention reaches LlamaConfig from a run config as the other task.model
    fields do (default fused); a value that is not an implementation is refused naming the
    setting and the choices."""
    def config_of(*overrides: str) -> LlamaConfig:
        cfg = load_config(None, ["task.kind=llama", "task.preset=tiny", *overrides])
        return configtools.build(LlamaSettings, task_ref(cfg).settings, prefix="task").config()

    assert config_of().attention == "fused"
    assert config_of("task.model.attention=plain").attention == "plain"
    with pytest.raises(ConfigError) as err:
        config_of("task.model.attention=flash")
    assert err.value.setting == "task.model.attention"
    assert "plain" in err.value.fix and "fused" in err.value.fix
