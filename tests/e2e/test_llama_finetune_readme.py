"""README "Fine-tune a Llama": the block, run as written (issue 50 item 4).

In a fresh export of the committed tree (what a clone gets; only the project's virtualenv is
shared, linked in), the block tokenizes the shipped corpus with the shipped checkpoint's own
tokenizer (with a held-out split), fine-tunes the shipped tiny Hugging Face Llama on it with
``orchestrator.main`` on the default emulated cluster (a local Ray cluster it starts and stops),
prints what ``summary.json`` says and exports the result for ``transformers``. HOME is a
temporary directory, so nothing of the machine's own is touched. Heavy (one local cluster, a
short run): marked ``cluster``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_train_your_own_model import user_env
from tests.production.test_try_locally import fresh_clone

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- llama-finetune:start -->", "<!-- llama-finetune:end -->"


def readme_block(root: Path = REPO) -> str:
    text = (root / "README.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    body = text[text.index(START) + len(START):text.index(END)].strip()
    assert body.startswith("```bash") and body.endswith("```")
    return body.removeprefix("```bash").removesuffix("```").strip() + "\n"


def test_readme_llama_finetune_block_runs_as_written(tmp_path):
    """prepare --tokenizer -> fine-tune from task.init_from -> summary -> export --format hf."""
    clone = fresh_clone(tmp_path / "clone")
    block = readme_block(clone)
    res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=clone,
                         env=user_env(tmp_path / "home"), capture_output=True, text=True,
                         timeout=550)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "prepared " in out

    data = json.loads((clone / "runs/data/llama-finetune/manifest.json").read_text())
    shipped = clone / "examples/llama_finetune/tokenizer.json"
    assert data["tokenizer"]["sha256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()
    assert data["eval_records"] == 64

    run = clone / "runs/llama-finetune"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "SUCCEEDED" and summary["step"] == 20
    assert summary["last_loss"] < summary["first_loss"]
    printed = ast.literal_eval(next(line for line in res.stdout.splitlines()
                                    if line.startswith("{'state'")))
    assert printed == {k: summary[k] for k in ("state", "step", "first_loss", "last_loss")}
    # one incarnation, started from task.init_from (no checkpoint of its own restored)
    assert [r["restored_step"] for r in summary["restores"]] == [None]
    assert summary["last_eval"], "eval.every=10 on the held-out split: no eval"

    hf = clone / "runs/llama-finetune-hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["vocab_size"] == 512 and config["tie_word_embeddings"] is True
    assert (hf / "model.safetensors").is_file()
    assert (hf / "tokenizer.json").read_bytes() == shipped.read_bytes()
