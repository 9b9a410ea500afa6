"""Write the Llama goldens: tiny Hugging Face checkpoints and transformers' own logits for them.

Run once, in a scratch environment that has ``transformers`` and torch (never the suite's)::

    python3.11 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers torch \
        safetensors numpy
    /tmp/hfvenv/bin/python tests/goldens/make_llama_goldens.py

For each case of ``CASES`` it writes ``tests/goldens/llama/<case>/``: ``config.json`` and
``model.safetensors`` exactly as ``LlamaForCausalLM.save_pretrained`` writes them, and
``reference.npz`` (``input_ids`` int32 (batch, seq), ``logits`` float32 (batch, seq, vocab) and
``loss``, transformers' next-token loss with ``labels=input_ids``), computed in float32 by the
eager attention of the model reloaded from those files (so the files are what gave the logits).
``versions.json`` names the transformers and torch versions. The suite reads these with numpy
and safetensors only (``tests/models/test_hf_llama.py``).

Weights are drawn with numpy from a fixed seed, at a scale that keeps activations of order one
(fan-in scaled projections, embeddings of std 0.3, norm scales around 1; not transformers' 0.02
init, whose near-zero logits would hide a wrong transpose), so a rerun with other versions
rewrites the same weights.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).resolve().parent / "llama"
BATCH, SEQ = 2, 16
SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)
CASES = {
    # grouped-query, untied, the 1b/8b presets' rope_theta
    "gqa_untied": dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500_000.0,
                       rms_norm_eps=1e-5),
    # multi-head, tied, the tiny preset's rope_theta, another eps
    "mha_tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=10_000.0,
                     rms_norm_eps=1e-6),
    # multi-query, tied, the presets' rope_theta
    "mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500_000.0,
                     rms_norm_eps=1e-5),
}


def weights(model: LlamaForCausalLM, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter drawn from ``seed`` (numpy), in name order (tied: no ``lm_head``)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in sorted(model.state_dict().items()):
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        shape = tuple(p.shape)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            a = 0.3 * rng.standard_normal(shape)
        else:  # (out, in) projections, lm_head included
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = torch.from_numpy(a.astype(np.float32))
    return out


def make_case(name: str, extra: dict, seed: int) -> dict:
    torch.manual_seed(seed)
    cfg = LlamaConfig(**SHAPE, **extra, hidden_act="silu", attention_bias=False, mlp_bias=False,
                      torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(weights(model, seed), strict=False)  # tied: lm_head is embed_tokens
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)

    again = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    ids = np.random.default_rng(seed + 100).integers(0, SHAPE["vocab_size"], (BATCH, SEQ))
    with torch.no_grad():
        res = again(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids))
    logits = res.logits.float().numpy()
    np.savez(out / "reference.npz", input_ids=ids.astype(np.int32), logits=logits,
             loss=np.float32(res.loss.item()))
    return {"logits_abs_max": float(np.abs(logits).max()), "loss": float(res.loss.item())}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    summary = {name: make_case(name, extra, seed) for seed, (name, extra) in
               enumerate(CASES.items())}
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "numpy": np.__version__, "python": sys.version.split()[0],
                "attn_implementation": "eager", "dtype": "float32",
                "batch": BATCH, "seq": SEQ, "cases": summary}
    (OUT / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(json.dumps(versions, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
