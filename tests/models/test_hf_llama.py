"""Parity with transformers' LlamaForCausalLM on the committed goldens (no torch here), and the
Hugging Face config/tensor mapping (``workers/models/hf_llama.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from workers.models import hf_llama
from workers.models.hf_llama import HfCheckpointError
from workers.models.llama import LlamaConfig, LlamaLM
from workers.task.lm import _loss

GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "llama"
CASES = ("gqa_untied", "mha_tied", "mqa_tied")
TOLERANCE = 1e-4
"""max |Δ logits|, float32. Measured (transformers 5.24.0, CPU): docs/hf.md."""


def golden(case: str) -> tuple[Path, dict, dict[str, np.ndarray]]:
    d = GOLDENS / case
    with np.load(d / "reference.npz") as ref:
        return d, json.loads((d / "config.json").read_text()), {k: ref[k] for k in ref.files}


def config(hf: dict, **overrides) -> LlamaConfig:
    """The golden's model in float32 compute and storage."""
    return LlamaConfig(**{**hf_llama.config_from_hf(hf), "seq_len": 16, "dtype": "float32",
                          "param_dtype": "float32", **overrides})


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case, scan):
    """Same weights, same tokens: the family's float32 logits are transformers' within 1e-4."""
    d, hf, ref = golden(case)
    cfg = config(hf, scan_layers=scan)
    params = hf_llama.load_tree(d, cfg)
    logits = jax.jit(LlamaLM(cfg).apply)({"params": params}, jnp.asarray(ref["input_ids"]))
    delta = float(np.max(np.abs(np.asarray(logits) - ref["logits"])))
    print(f"{case} scan={scan}: max |Δ logits| = {delta:.3g}")
    assert delta <= TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_the_tasks_loss_is_the_reference_loss(case):
    """The llama task's next-token loss on the goldens' inputs is transformers' (labels=ids)."""
    d, hf, ref = golden(case)
    cfg = config(hf)
    params = hf_llama.load_tree(d, cfg)
    loss, _ = jax.jit(lambda p, t: _loss(LlamaLM(cfg), p, t))(params, ref["input_ids"])
    assert abs(float(loss) - float(ref["loss"])) <= 1e-5


def test_a_wrong_rope_layout_would_be_caught():
    """The goldens see the q/k layout: rows permuted to interleaved pairs (Meta's original
    layout, which HF's conversion script undoes) move the logits far past the tolerance."""
    d, hf, ref = golden("gqa_untied")
    cfg = config(hf)
    params = hf_llama.load_tree(d, cfg)
    hd = cfg.head_dim
    interleave = np.stack([np.arange(hd // 2), np.arange(hd // 2, hd)], axis=1).reshape(-1)
    for name in ("q", "k"):
        params["layers"]["attn"][name]["kernel"] = params["layers"]["attn"][name]["kernel"][
            ..., interleave]
    logits = jax.jit(LlamaLM(cfg).apply)({"params": params}, jnp.asarray(ref["input_ids"]))
    assert float(np.max(np.abs(np.asarray(logits) - ref["logits"]))) > 100 * TOLERANCE


def test_tree_is_the_models_own_and_in_its_dtype():
    """The loaded tree has exactly the initialised model's structure and shapes; bfloat16
    storage is honoured."""
    d, hf, _ = golden("gqa_untied")
    for scan in (True, False):
        cfg = config(hf, scan_layers=scan, param_dtype="bfloat16")
        init = jax.eval_shape(LlamaLM(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
        want = jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(init["params"]))
        got = jax.tree.map(lambda x: (x.shape, x.dtype), hf_llama.load_tree(d, cfg))
        assert got == want


@pytest.mark.parametrize("field,value,says", [
    ("hidden_act", "gelu", "hidden_act"),
    ("attention_bias", True, "attention_bias"),
    ("mlp_bias", True, "mlp_bias"),
    ("attention_dropout", 0.1, "attention_dropout"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 32.0}, "rope_scaling"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5}, "rope_parameters"),
    ("head_dim", 16, "head_dim"),
    ("model_type", "mistral", "model_type"),
    ("num_hidden_layers", None, "num_hidden_layers"),
    ("num_key_value_heads", 0, "num_key_value_heads"),
    ("rms_norm_eps", "tiny", "rms_norm_eps"),
    ("rope_theta", -1.0, "rope_theta"),
])
def test_what_the_family_does_not_compute_is_refused_naming_the_field(field, value, says):
    _, hf, _ = golden("gqa_untied")
    with pytest.raises(HfCheckpointError, match=f"`{says}`") as info:
        hf_llama.config_from_hf({**hf, field: value})
    assert info.value.fix


def test_both_rope_spellings_are_read():
    """transformers 4.x writes rope_theta, 5.x rope_parameters; both give the same model."""
    _, hf, _ = golden("gqa_untied")
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"} | {
        "rope_theta": 500000.0, "rope_scaling": None}
    assert hf_llama.config_from_hf(legacy) == hf_llama.config_from_hf(hf)
    assert hf_llama.config_from_hf(hf)["rope_theta"] == 500000.0


def test_a_task_that_differs_from_the_checkpoint_is_refused_naming_the_setting():
    d, hf, _ = golden("gqa_untied")
    cfg = config(hf, num_kv_heads=4)
    with pytest.raises(HfCheckpointError, match=r"task.model.num_kv_heads = 4") as info:
        hf_llama.load_tree(d, cfg)
    assert "set task.model.num_kv_heads=2" in info.value.fix


def test_the_reader_reads_what_safetensors_reads_and_slices_by_offset():
    d, _, _ = golden("gqa_untied")
    want = load_file(str(d / "model.safetensors"))
    ckpt = hf_llama.Checkpoint(d)
    assert sorted(ckpt.where) == sorted(want)
    for name, arr in want.items():
        assert ckpt.read(name).tobytes() == arr.tobytes()
    name = "model.layers.1.mlp.up_proj.weight"
    assert np.array_equal(ckpt.read(name, np.s_[8:24, 4:]), want[name][8:24, 4:])


def test_written_files_are_read_by_safetensors_itself_bfloat16_included(tmp_path):
    """The writer's files (header, alignment, bfloat16 code) are the format safetensors reads."""
    from safetensors import safe_open

    from workers.models.safetensors_io import write

    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
              "b": rng.standard_normal((7,)).astype(np.float32),
              "c": np.arange(3, dtype=np.int32)}  # jax: no int64 without x64
    write(tmp_path / "x.safetensors", {k: (v.shape, v.dtype) for k, v in arrays.items()},
          lambda k: arrays[k], metadata={"format": "pt"})
    with safe_open(str(tmp_path / "x.safetensors"), framework="flax") as f:
        assert f.metadata() == {"format": "pt"}
        for name, arr in arrays.items():
            got = np.asarray(f.get_tensor(name))
            assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes(), name
