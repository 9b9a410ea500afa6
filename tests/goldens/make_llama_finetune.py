"""Write ``examples/llama_finetune/``'s starting point: a tiny Hugging Face Llama whose vocabulary
is the shipped tokenizer's, so the ``llama`` task fine-tunes it on the shipped corpus.

The tokenizer came first, from the project's own environment (a byte-level BPE of 512 tokens
trained on ``examples/data``; its first 256 tokens are the bytes, so the goldens' vocabulary of
128 cannot take it)::

    python -m orchestrator.data prepare --input examples/data --out /tmp/bpe --vocab-size 512
    cp /tmp/bpe/tokenizer.json examples/llama_finetune/tokenizer.json

Then, in the goldens' scratch environment with ``transformers`` and torch (never the suite's;
``make_llama_goldens.py`` says how to make it)::

    /tmp/hfvenv/bin/python tests/goldens/make_llama_finetune.py

It writes ``config.json`` and ``model.safetensors`` exactly as
``LlamaForCausalLM.save_pretrained`` writes them (grouped-query, tied embeddings, the goldens'
tiny shape and weight draw, ``vocab_size`` the tokenizer's), and ``versions.json`` (the
transformers and torch versions, the tokenizer's SHA-256 and size).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_llama_goldens import weights  # the goldens' draw (a sibling script)

OUT = Path(__file__).resolve().parents[2] / "examples" / "llama_finetune"
TOKENIZER = OUT / "tokenizer.json"
SEED = 50
SHAPE = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
             rope_theta=500_000.0, rms_norm_eps=1e-5)


def tokenizer_size(path: Path) -> int:
    """Token ids the tokenizer can emit: its model's vocabulary and the added tokens."""
    tok = json.loads(path.read_text())
    ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok.get("added_tokens", [])}
    return max(ids) + 1


def main() -> int:
    vocab = tokenizer_size(TOKENIZER)
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=vocab, **SHAPE, hidden_act="silu", attention_bias=False,
                      mlp_bias=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(weights(model, SEED), strict=False)  # tied: lm_head is embed_tokens
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(Path(tmp) / name, OUT / name)
    again = LlamaForCausalLM.from_pretrained(OUT, torch_dtype=torch.float32).eval()
    assert again.config.vocab_size == vocab
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "numpy": np.__version__, "python": sys.version.split()[0], "seed": SEED,
                "tokenizer_sha256": hashlib.sha256(TOKENIZER.read_bytes()).hexdigest(),
                "vocab_size": vocab,
                "model_safetensors_bytes": (OUT / "model.safetensors").stat().st_size}
    (OUT / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(json.dumps(versions, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
